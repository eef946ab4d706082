//! etcd (`DISTLOCK_TEST_ETCD_URL`). Ours: `LockClient` over `driver_etcd::EtcdBackend`.
//!
//! Baselines, each on an `etcd_client::Client` of its own with the driver's connection
//! settings (require-leader, HTTP/2 keep-alive, 1 s connect timeout):
//! * `raw` — a lease per holder, by hand: `LeaseGrant`, `Txn(create_revision == 0 → put
//!   with lease)`, then `Txn(create_revision == token → delete)` and `LeaseRevoke`
//!   (4 round trips per cycle; a failed try revokes its lease).
//! * `raw_reused` — one lease per client, granted at setup and kept alive in the
//!   background: `Txn(create_revision == 0 → put with lease)`, then
//!   `Txn(create_revision == token → delete)` (2 round trips per cycle).
//! * `raw_watch` — `raw` plus a hand-written wait: a `Get`, then a watch from the revision
//!   it saw, per waiter, so every release wakes every waiter of the client. Runs the
//!   hand-off case (`handoff_raw_watch`).
//! * `raw_driver` — the driver's own operations (`EtcdBackend::try_acquire` / `release`)
//!   called by hand, without lockcore: separates the driver's cost from lockcore's.
//!
//! The raw locks are one key per lock (no queue): the ratio to `raw_reused` includes the
//! price of the queue ours keeps (arrival order, shared claims).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use driver_etcd::etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, PutOptions, Txn, TxnOp, WatchOptions,
};
use lockcore::driver::BoxError;
use lockcore::driver::{AcquireOutcome, LockBackendExt, OwnerToken};
use lockcore::{LockBackend, LockKey, Owner};

use crate::target::{RawLock, Target};

const RAW_PREFIX: &str = "lockbench-raw/";

/// The shared single etcd member.
pub struct Etcd {
    url: String,
}

impl Target for Etcd {
    const NAME: &'static str = "etcd";
    type Raw = EtcdRaw;

    async fn setup() -> Result<Self, BoxError> {
        let url = std::env::var("DISTLOCK_TEST_ETCD_URL")
            .ok()
            .filter(|u| !u.trim().is_empty())
            .ok_or(
                "DISTLOCK_TEST_ETCD_URL is not set: run `scripts/servers.sh start` and export \
                 the variables from target/test-servers.env",
            )?;
        // Fail here, clearly, if the server is not there.
        let backend = driver_etcd::connect(&url).await?;
        backend.inspect(&LockKey::new("lockbench-probe")?).await?;
        Ok(Etcd { url })
    }

    async fn backend(&self) -> Result<Arc<dyn LockBackend>, BoxError> {
        Ok(driver_etcd::connect(&self.url).await?)
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    async fn raw(&self) -> Result<Vec<(&'static str, EtcdRaw)>, BoxError> {
        let endpoint = driver_etcd::EtcdConfig::parse(&self.url)?
            .endpoints
            .first()
            .cloned()
            .ok_or("no endpoint")?;
        Ok(vec![
            (
                "raw",
                EtcdRaw::PerHolder(PerHolder::connect(&endpoint).await?),
            ),
            (
                "raw_reused",
                EtcdRaw::Reused(Reused::connect(&endpoint).await?),
            ),
            (
                "raw_watch",
                EtcdRaw::Watch(PerHolder::connect(&endpoint).await?),
            ),
            (
                "raw_driver",
                EtcdRaw::Driver(driver_etcd::connect(&self.url).await?),
            ),
        ])
    }
}

async fn connect(endpoint: &str) -> Result<Client, BoxError> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_require_leader(true)
        .with_keep_alive(Duration::from_secs(5), Duration::from_secs(2));
    Ok(Client::connect([endpoint], Some(opts)).await?)
}

fn raw_key(key: &LockKey) -> Vec<u8> {
    format!("{RAW_PREFIX}{}/", key.as_str()).into_bytes()
}

fn ttl_secs(ttl: Duration) -> i64 {
    ttl.as_secs().max(2) as i64
}

/// The etcd baselines.
pub enum EtcdRaw {
    /// A lease per holder: grant, txn, txn, revoke.
    PerHolder(PerHolder),
    /// One lease for every hold of the client: txn, txn.
    Reused(Reused),
    /// `PerHolder` plus a watch per waiter.
    Watch(PerHolder),
    /// The driver's operations without lockcore.
    Driver(Arc<driver_etcd::EtcdBackend>),
}

impl RawLock for EtcdRaw {
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, BoxError> {
        match self {
            EtcdRaw::PerHolder(p) | EtcdRaw::Watch(p) => p.try_acquire(key, owner, ttl).await,
            EtcdRaw::Reused(r) => r.try_acquire(key, owner).await,
            EtcdRaw::Driver(b) => Ok(matches!(
                LockBackendExt::try_acquire(&**b, key, owner, ttl).await?,
                AcquireOutcome::Acquired(_)
            )),
        }
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
        match self {
            EtcdRaw::PerHolder(p) | EtcdRaw::Watch(p) => p.release(key, owner).await,
            EtcdRaw::Reused(r) => r.release(key, owner).await,
            EtcdRaw::Driver(b) => {
                Ok(LockBackend::release(&**b, key, owner).await?
                    == lockcore::ReleaseOutcome::Released)
            }
        }
    }

    fn handoff(&self) -> bool {
        matches!(self, EtcdRaw::Watch(_))
    }

    async fn wait_released(&self, key: &LockKey, max_wait: Duration) -> Result<(), BoxError> {
        match self {
            EtcdRaw::Watch(p) => p.wait_released(key, max_wait).await,
            _ => Err("this baseline does not wait".into()),
        }
    }
}

/// What a holder must remember to release: its key's create revision and its lease.
type Holds = Mutex<HashMap<(Vec<u8>, OwnerToken), (i64, i64)>>;

/// A lease per holder.
pub struct PerHolder {
    client: Client,
    holds: Holds,
}

impl PerHolder {
    async fn connect(endpoint: &str) -> Result<Self, BoxError> {
        Ok(PerHolder {
            client: connect(endpoint).await?,
            holds: Mutex::new(HashMap::new()),
        })
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, BoxError> {
        let mut c = self.client.clone();
        let k = raw_key(key);
        let lease = c.lease_grant(ttl_secs(ttl), None).await?.id();
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                k.clone(),
                owner.token().to_hex(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let resp = c.txn(txn).await?;
        if !resp.succeeded() {
            c.lease_revoke(lease).await?;
            return Ok(false);
        }
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        self.holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((k, *owner.token()), (rev, lease));
        Ok(true)
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
        let k = raw_key(key);
        let Some((rev, lease)) = self
            .holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(k.clone(), *owner.token()))
        else {
            return Ok(false);
        };
        let mut c = self.client.clone();
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(k, None)]);
        let deleted = c.txn(txn).await?.succeeded();
        c.lease_revoke(lease).await?;
        Ok(deleted)
    }

    /// Get, then watch from the revision seen until a delete or `max_wait`.
    async fn wait_released(&self, key: &LockKey, max_wait: Duration) -> Result<(), BoxError> {
        let mut c = self.client.clone();
        let k = raw_key(key);
        let got = c.get(k.clone(), None).await?;
        if got.kvs().is_empty() {
            return Ok(());
        }
        let rev = got.header().map(|h| h.revision()).unwrap_or(0);
        let mut stream = c
            .watch(k, Some(WatchOptions::new().with_start_revision(rev + 1)))
            .await?;
        let wait = async {
            while let Some(resp) = stream.message().await? {
                if resp.canceled()
                    || resp
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                {
                    return Ok::<(), BoxError>(());
                }
            }
            Ok(())
        };
        let _ = tokio::time::timeout(max_wait, wait).await;
        Ok(())
    }
}

/// One lease for the client, kept alive in the background.
pub struct Reused {
    client: Client,
    lease: i64,
    holds: Mutex<HashMap<(Vec<u8>, OwnerToken), i64>>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for Reused {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

impl Reused {
    async fn connect(endpoint: &str) -> Result<Self, BoxError> {
        let mut client = connect(endpoint).await?;
        let lease = client.lease_grant(30, None).await?.id();
        let (mut keeper, mut stream) = client.lease_keep_alive(lease).await?;
        let keeper = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                if keeper.keep_alive().await.is_err() || stream.message().await.is_err() {
                    return;
                }
            }
        });
        Ok(Reused {
            client,
            lease,
            holds: Mutex::new(HashMap::new()),
            keeper,
        })
    }

    async fn try_acquire(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
        let mut c = self.client.clone();
        let k = raw_key(key);
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                k.clone(),
                owner.token().to_hex(),
                Some(PutOptions::new().with_lease(self.lease)),
            )]);
        let resp = c.txn(txn).await?;
        if !resp.succeeded() {
            return Ok(false);
        }
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        self.holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((k, *owner.token()), rev);
        Ok(true)
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
        let k = raw_key(key);
        let Some(rev) = self
            .holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(k.clone(), *owner.token()))
        else {
            return Ok(false);
        };
        let mut c = self.client.clone();
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(k, None)]);
        Ok(c.txn(txn).await?.succeeded())
    }
}
