//! The suite's ready-made fault store for a networked server, `NetworkedStore`, driving a
//! real redis-server: a third-party driver's harness gets every fault hook from it without
//! writing any process or proxy code. Runs the fault scenarios that use each hook.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::{scenarios, FaultStore, Harness, NetworkedStore};
use distlock_redis::RedisBackend;
use lockcore::driver::OwnerToken;
use lockcore::{LockBackend, LockClient, LockError};

const TIMEOUT: Duration = Duration::from_millis(500);

struct Plain {
    url: String,
    prefix: String,
}

#[async_trait::async_trait]
impl Harness for Plain {
    async fn client(&self) -> Result<LockClient, LockError> {
        let backend = RedisBackend::builder(&self.url)
            .prefix(&self.prefix)
            .build()
            .await?;
        Ok(LockClient::new(backend))
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(400)
    }

    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        let prefix = self.prefix.clone();
        let tamper_prefix = self.prefix.clone();
        let bin =
            std::env::var("DISTLOCK_REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        let store = NetworkedStore::start(
            move |port| {
                let mut c = Command::new(&bin);
                c.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no"]);
                c
            },
            move |addr| {
                let prefix = prefix.clone();
                async move {
                    let backend = RedisBackend::builder(format!("redis://{addr}/"))
                        .prefix(&prefix)
                        .connect_timeout(TIMEOUT)
                        .response_timeout(TIMEOUT)
                        .build()
                        .await?;
                    Ok(backend as Arc<dyn LockBackend>)
                }
            },
        )
        .await?
        .with_tamper(move |addr, key, how| {
            let prefix = tamper_prefix.clone();
            async move { common::tamper(&format!("redis://{addr}/"), &prefix, &key, how).await }
        });
        Ok(Some(Box::new(store)))
    }
}

async fn harness() -> Plain {
    Plain {
        url: std::env::var("DISTLOCK_TEST_REDIS_URL")
            .expect("DISTLOCK_TEST_REDIS_URL is not set: run the tests through scripts/test.sh"),
        prefix: format!("distlock-test:{}:", &OwnerToken::generate().to_hex()[..16]),
    }
}

#[test]
fn store_unavailable() {
    conformance_tests::run(
        "store_unavailable",
        harness,
        scenarios::store_unavailable,
        true,
        true,
    );
}

#[test]
fn tokens_increase_across_restart_same_key() {
    conformance_tests::run(
        "tokens_increase_across_restart_same_key",
        harness,
        scenarios::tokens_increase_across_restart_same_key,
        true,
        true,
    );
}

#[test]
fn deleted_record_seen_as_lost() {
    conformance_tests::run(
        "deleted_record_seen_as_lost",
        harness,
        scenarios::deleted_record_seen_as_lost,
        true,
        true,
    );
}

#[test]
fn paused_holder_write_rejected() {
    conformance_tests::run(
        "paused_holder_write_rejected",
        harness,
        scenarios::paused_holder_write_rejected,
        true,
        true,
    );
}
