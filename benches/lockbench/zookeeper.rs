//! ZooKeeper (`DISTLOCK_TEST_ZK_URL`). Ours: `LockClient` over
//! `driver_zookeeper::ZkBackend`.
//!
//! Baselines, each on a `zookeeper_client::Client` (one session) of its own with the
//! driver's session timeout:
//! * `raw` — the lock recipe by hand, the same ZooKeeper calls the driver makes: `create`
//!   of an ephemeral sequential node under the key's node (the key's node created once,
//!   when missing), `getChildren` (held when ours is the lowest; otherwise `delete` it),
//!   then `delete` to release (3 round trips per cycle).
//! * `raw_watch` — `raw` plus a hand-written wait: an `exists` watch on the lowest node,
//!   per waiter. Runs the hand-off case (`handoff_raw_watch`).
//! * `raw_driver` — the driver's own operations (`ZkBackend::try_acquire` / `release`)
//!   called by hand, without lockcore: separates the driver's cost from lockcore's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use driver_zookeeper::zookeeper_client::{Acls, Client, CreateMode, Error as ZkError};
use lockcore::driver::{AcquireOutcome, BoxError, LockBackendExt, OwnerToken};
use lockcore::{LockBackend, LockKey, Owner};

use crate::target::{RawLock, Target};

const RAW_ROOT: &str = "/lockbench-raw";

/// The shared single ZooKeeper server.
pub struct Zookeeper {
    url: String,
}

impl Target for Zookeeper {
    const NAME: &'static str = "zookeeper";
    type Raw = ZkRaw;

    async fn setup() -> Result<Self, BoxError> {
        let url = std::env::var("DISTLOCK_TEST_ZK_URL")
            .ok()
            .filter(|u| !u.trim().is_empty())
            .ok_or(
                "DISTLOCK_TEST_ZK_URL is not set: run `scripts/servers.sh start` and export \
                 the variables from target/test-servers.env",
            )?;
        // Fail here, clearly, if the server is not there.
        let backend = driver_zookeeper::connect(&url).await?;
        backend.inspect(&LockKey::new("lockbench-probe")?).await?;
        Ok(Zookeeper { url })
    }

    async fn backend(&self) -> Result<Arc<dyn LockBackend>, BoxError> {
        Ok(driver_zookeeper::connect(&self.url).await?)
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    async fn raw(&self) -> Result<Vec<(&'static str, ZkRaw)>, BoxError> {
        let cfg = driver_zookeeper::ZkConfig::parse(&self.url)?;
        Ok(vec![
            ("raw", ZkRaw::ByHand(ByHand::connect(&cfg).await?)),
            ("raw_watch", ZkRaw::Watch(ByHand::connect(&cfg).await?)),
            (
                "raw_driver",
                ZkRaw::Driver(driver_zookeeper::connect(&self.url).await?),
            ),
        ])
    }
}

/// The ZooKeeper baselines.
pub enum ZkRaw {
    /// The recipe by hand: create, list, delete.
    ByHand(ByHand),
    /// `ByHand` plus a watch per waiter.
    Watch(ByHand),
    /// The driver's operations without lockcore.
    Driver(Arc<driver_zookeeper::ZkBackend>),
}

impl RawLock for ZkRaw {
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, BoxError> {
        match self {
            ZkRaw::ByHand(h) | ZkRaw::Watch(h) => h.try_acquire(key, owner).await,
            ZkRaw::Driver(b) => Ok(matches!(
                LockBackendExt::try_acquire(&**b, key, owner, ttl).await?,
                AcquireOutcome::Acquired(_)
            )),
        }
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
        match self {
            ZkRaw::ByHand(h) | ZkRaw::Watch(h) => h.release(key, owner).await,
            ZkRaw::Driver(b) => {
                Ok(LockBackend::release(&**b, key, owner).await?
                    == lockcore::ReleaseOutcome::Released)
            }
        }
    }

    fn handoff(&self) -> bool {
        matches!(self, ZkRaw::Watch(_))
    }

    async fn wait_released(&self, key: &LockKey, max_wait: Duration) -> Result<(), BoxError> {
        match self {
            ZkRaw::Watch(h) => h.wait_released(key, max_wait).await,
            _ => Err("this baseline does not wait".into()),
        }
    }
}

/// The recipe by hand on one session.
pub struct ByHand {
    client: Client,
    /// Each holder's node.
    holds: Mutex<HashMap<(String, OwnerToken), String>>,
}

/// The key's node under the baselines' root (keys of the bench are plain names).
fn raw_path(key: &LockKey) -> String {
    format!("{RAW_ROOT}/{}", key.as_str().replace('/', "%2F"))
}

impl ByHand {
    async fn connect(cfg: &driver_zookeeper::ZkConfig) -> Result<Self, BoxError> {
        let client = Client::connector()
            .with_session_timeout(cfg.session_timeout)
            .connect(&cfg.place())
            .await?;
        client
            .mkdir(
                RAW_ROOT,
                &CreateMode::Persistent.with_acls(Acls::anyone_all()),
            )
            .await?;
        Ok(ByHand {
            client,
            holds: Mutex::new(HashMap::new()),
        })
    }

    async fn try_acquire(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
        let dir = raw_path(key);
        let prefix = format!("{dir}/lock-");
        let mode = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let seq = match self.client.create(&prefix, &[], &mode).await {
            Ok((_, seq)) => seq,
            Err(ZkError::NoNode) => {
                let container = CreateMode::Container.with_acls(Acls::anyone_all());
                match self.client.create(&dir, &[], &container).await {
                    Ok(_) | Err(ZkError::NodeExists) => {}
                    Err(e) => return Err(e.into()),
                }
                self.client.create(&prefix, &[], &mode).await?.1
            }
            Err(e) => return Err(e.into()),
        };
        let name = format!("lock-{seq}");
        let children = self.client.list_children(&dir).await?;
        if children.iter().min() != Some(&name) {
            self.client.delete(&format!("{dir}/{name}"), None).await?;
            return Ok(false);
        }
        self.holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((dir.clone(), *owner.token()), format!("{dir}/{name}"));
        Ok(true)
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
        let dir = raw_path(key);
        let Some(path) = self
            .holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(dir, *owner.token()))
        else {
            return Ok(false);
        };
        match self.client.delete(&path, None).await {
            Ok(()) => Ok(true),
            Err(ZkError::NoNode) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// List, then an `exists` watch on the lowest node until it goes or `max_wait`.
    async fn wait_released(&self, key: &LockKey, max_wait: Duration) -> Result<(), BoxError> {
        let dir = raw_path(key);
        let children = match self.client.list_children(&dir).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let Some(lowest) = children.iter().min() else {
            return Ok(());
        };
        let (stat, watcher) = self
            .client
            .check_and_watch_stat(&format!("{dir}/{lowest}"))
            .await?;
        if stat.is_some() {
            let _ = tokio::time::timeout(max_wait, watcher.changed()).await;
        }
        Ok(())
    }
}
