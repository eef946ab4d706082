//! A backend on an `etcd_client::Client` the application already has
//! (`DISTLOCK_TEST_ETCD_URL`).

mod common;

use std::time::Duration;

use common::{random_namespace, url_from_env, TTL};
use conformance_tests::process::free_port;
use distlock_etcd::etcd_client::{Client, GetOptions};
use distlock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{LockClient, LockError};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Locks taken through the application's client exclude those of a backend built from the
/// URL on the same namespace, carry the key's create revision as token (as the
/// application's client sees it), and are released for the next holder.
#[test]
fn an_existing_client_takes_part_in_the_same_locks() {
    runtime().block_on(async {
        let cfg = EtcdConfig::parse(&url_from_env("DISTLOCK_TEST_ETCD_URL"))
            .unwrap()
            .with_namespace(&random_namespace())
            .unwrap();
        let mut client = Client::connect(cfg.endpoints.clone(), None).await.unwrap();
        let mine = LockClient::new(
            EtcdBackend::from_client(client.clone(), cfg.clone())
                .await
                .unwrap(),
        );
        let theirs = LockClient::new(EtcdBackend::new(cfg.clone()).unwrap());

        let g = mine
            .lock("k")
            .ttl(TTL)
            .try_acquire()
            .await
            .unwrap()
            .unwrap();
        assert!(theirs
            .lock("k")
            .ttl(TTL)
            .try_acquire()
            .await
            .unwrap()
            .is_none());
        let seen = client
            .get(cfg.namespace.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        assert!(
            seen.kvs()
                .iter()
                .any(|kv| u64::try_from(kv.create_revision()).unwrap() == g.token().get()),
            "no key in {} with create revision {}",
            cfg.namespace,
            g.token()
        );
        let first = g.token();
        g.release().await.unwrap();
        let g = theirs
            .lock("k")
            .ttl(TTL)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        assert!(g.token() > first);
        // And the other way round: the URL backend's hold keeps the client's out.
        assert!(mine
            .lock("k")
            .ttl(TTL)
            .try_acquire()
            .await
            .unwrap()
            .is_none());
        g.release().await.unwrap();
        mine.shutdown().await;
        theirs.shutdown().await;
    });
}

/// Errors through the application's client name the endpoints the configuration lists.
#[test]
fn errors_name_the_configured_endpoints() {
    runtime().block_on(async {
        let endpoint = format!("127.0.0.1:{}", free_port().unwrap());
        let Ok(client) = Client::connect([endpoint.clone()], None).await else {
            panic!("etcd-client connects lazily; an unreachable endpoint fails at first use");
        };
        let mut cfg = EtcdConfig::new([endpoint.clone()]);
        cfg.timeout = Duration::from_millis(500);
        let locks = LockClient::new(EtcdBackend::from_client(client, cfg).await.unwrap());
        let err = locks.lock("k").ttl(TTL).try_acquire().await.unwrap_err();
        // The error names the endpoint; its source, what the endpoint said.
        let line = lockcore::ErrorChain(&err).to_string();
        println!("{line}");
        assert!(matches!(err, LockError::Unavailable { .. }), "{line}");
        assert!(
            line.contains(&format!("etcd at {endpoint} is unavailable")),
            "the endpoint is not named: {line}"
        );
    });
}
