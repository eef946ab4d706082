//! Shared renewal leases: the watchdog's batches of renewals move each hold onto its
//! backend's shared lease for the hold's TTL, so that one keep-alive renews every hold of
//! that TTL (see `renew.rs`).
//!
//! Only holds that are renewed are moved: a hold nobody renews stays on its own lease
//! and expires after its TTL, as the contract says, instead of living on while other holds
//! keep a shared lease alive. A key on a shared lease outlives its hold only if its release
//! failed; such keys are remembered as *orphans* and deleted before the lease is kept alive
//! again, and the keep-alive is not sent while one cannot be deleted.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use lockcore::LockError;

use super::{random_lease_id, LeaseState, Leases};
use crate::lock;

/// etcd's default limit of operations in one transaction (`--max-txn-ops`).
pub(crate) const MAX_TXN_OPS: usize = 128;

/// Guarded single-key transactions nested in one transaction: etcd gives a nested
/// transaction what its parent leaves of the limit (the parent's largest branch counted),
/// and each of ours has two compares.
pub(crate) const MAX_NESTED_TXNS: usize = MAX_TXN_OPS - 2;

/// A key whose release failed, and the value it was held with.
type Orphan = (Vec<u8>, Vec<u8>);

/// The shared leases of one backend.
#[derive(Default)]
pub(crate) struct SharedLeases {
    /// Per asked TTL (whole seconds): the current shared lease.
    current: Mutex<HashMap<i64, LeaseState>>,
    /// Per shared lease: keys whose release failed, as (key, value) they were held with.
    orphans: Mutex<HashMap<i64, Vec<Orphan>>>,
    /// Serialises granting and refreshing shared leases.
    renewing: tokio::sync::Mutex<()>,
}

impl Leases {
    /// Whether `lease` is one of this backend's shared leases.
    pub(crate) fn is_shared(&self, lease: i64) -> bool {
        let current = lock(&self.shared.current);
        current.values().any(|l| l.id == lease)
    }

    /// Remembers that the key `key`, held with `value` on the shared lease `lease`, could
    /// not be released: it is deleted before `lease` is kept alive again.
    pub(crate) fn orphan(&self, lease: i64, key: Vec<u8>, value: Vec<u8>) {
        let mut orphans = lock(&self.shared.orphans);
        let keys = orphans.entry(lease).or_default();
        if !keys.iter().any(|(k, _)| *k == key) {
            keys.push((key, value));
        }
    }

    /// Deletes the orphans of `lease` (each only while it still carries the value and the
    /// lease it was held with).
    ///
    /// # Errors
    ///
    /// The store's error if a delete could not be sent; the orphans are then kept.
    pub(crate) async fn delete_orphans(&self, lease: i64) -> Result<(), LockError> {
        let keys = {
            let orphans = lock(&self.shared.orphans);
            match orphans.get(&lease) {
                Some(keys) if !keys.is_empty() => keys.clone(),
                _ => return Ok(()),
            }
        };
        for chunk in keys.chunks(MAX_NESTED_TXNS) {
            let deletes = chunk.iter().map(|(k, v)| {
                TxnOp::txn(
                    Txn::new()
                        .when([
                            Compare::value(k.clone(), CompareOp::Equal, v.clone()),
                            Compare::lease(k.clone(), CompareOp::Equal, lease),
                        ])
                        .and_then([TxnOp::delete(k.clone(), None)]),
                )
            });
            let txn = Txn::new().and_then(deletes.collect::<Vec<_>>());
            self.endpoints
                .call("delete orphans", |mut c| {
                    let txn = txn.clone();
                    async move { c.txn(txn).await }
                })
                .await?;
        }
        let mut orphans = lock(&self.shared.orphans);
        if let Some(now) = orphans.get_mut(&lease) {
            now.retain(|(k, _)| !keys.iter().any(|(done, _)| done == k));
            if now.is_empty() {
                orphans.remove(&lease);
            }
        }
        Ok(())
    }

    /// The shared lease for holds of `secs` seconds, kept alive by this call (or granted
    /// now if there is none or it expired): its orphans deleted first.
    ///
    /// # Errors
    ///
    /// The store's error if the orphans, the keep-alive or the grant could not be sent.
    pub(crate) async fn shared_lease(&self, secs: i64) -> Result<LeaseState, LockError> {
        let _turn = self.shared.renewing.lock().await;
        let started = Instant::now();
        let known = {
            let current = lock(&self.shared.current);
            current.get(&secs).copied()
        };
        if let Some(lease) = known {
            // `keep_alive` deletes the lease's orphans first.
            if self.keep_alive(lease.id).await? {
                let lease = LeaseState {
                    refreshed: started,
                    ..lease
                };
                self.set_shared(secs, lease);
                return Ok(lease);
            }
            // Expired (every key on it went with it): its orphans went too.
            lock(&self.shared.orphans).remove(&lease.id);
        }
        let id = random_lease_id();
        let ttl = self.grant(id, secs).await?;
        let lease = LeaseState::new(id, ttl, secs, started);
        self.set_shared(secs, lease);
        Ok(lease)
    }

    fn set_shared(&self, secs: i64, lease: LeaseState) {
        let mut current = lock(&self.shared.current);
        current.insert(secs, lease);
    }
}
