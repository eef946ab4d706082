//! The plain layout: one key per lock, created by the holder's transaction if absent and
//! bound to its lease; the key's create revision is the fencing token.

use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, DeleteOptions, PutOptions, Txn, TxnOp};
use lockcore::driver::{AcquireOutcome, Contention, ExtendOutcome, Grant, WaitHint};
use lockcore::{FencingToken, LockError, LockInfo, LockKey, Owner, ReleaseOutcome};

use super::leases::{remaining_ttl, LeaseState, Leased, TxnResult};
use super::marks::{self, MarkRule};
use super::requests::{deleted_lease, failed_get, header_revision, nth_first, token_of};
use super::EtcdBackend;
use crate::capabilities::NAME;
use crate::encoding::{held_by, holder_value, label_of, mark_key};
use crate::watch::Coverage;

/// How many times one attempt tries again past a mark it may pass (the mark changed under
/// it each time) before it waits like any refused request.
const MAX_MARK_PASSES: u32 = 2;

impl EtcdBackend {
    /// The acquiring transaction: create the key bound to `lease` if it does not exist
    /// and the lock's mark allows it (`rule`), otherwise read the key and the mark.
    async fn create_txn(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
        mark: &[u8],
        rule: MarkRule,
    ) -> Result<TxnResult, LockError> {
        let put = TxnOp::put(
            key.to_vec(),
            value.to_vec(),
            Some(PutOptions::new().with_lease(lease)),
        );
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.to_vec(), CompareOp::Equal, 0),
                rule.compare(mark),
            ])
            .and_then(
                std::iter::once(put)
                    .chain(rule.on_grant(mark))
                    .collect::<Vec<_>>(),
            )
            .or_else([
                TxnOp::get(key.to_vec(), None),
                TxnOp::get(mark.to_vec(), None),
            ]);
        self.leases.lease_txn("acquire", txn).await
    }

    /// One exclusive claim of `key` for `secs`; `waited`: how long the request has waited,
    /// when lockcore tells it ([`ClaimRequest::waited`]).
    ///
    /// [`ClaimRequest::waited`]: lockcore::driver::ClaimRequest::waited
    pub(super) async fn plain_try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        secs: i64,
        waited: Option<Duration>,
    ) -> Result<AcquireOutcome, LockError> {
        let k = self.etcd_key(key);
        let mark = mark_key(&k);
        let v = holder_value(owner);
        // A request that has waited long says so: it may pass a later arrival's mark, and
        // marks the lock when refused.
        let arrival = waited.map(marks::arrival);
        let mut rule = MarkRule::Unmarked;
        let mut passes = 0;
        // A spare lease may expire between our check and the transaction, and a fresh one
        // may be applied after the transaction that uses it: both are retried.
        let mut lease_tries = 0;
        while lease_tries < 4 {
            let started = Instant::now();
            let (lease, created) = match self
                .leases
                .with_lease(secs, None, |id| self.create_txn(&k, &v, id, &mark, rule))
                .await?
            {
                Leased::Done(lease, t) => (lease, t),
                Leased::Retry => {
                    lease_tries += 1;
                    continue;
                }
            };
            match created {
                TxnResult::LeaseMissing => lease_tries += 1,
                TxnResult::Created(resp) => {
                    let token = FencingToken(u64::try_from(header_revision(&resp)).unwrap_or(0));
                    self.leases.set_hold(key, owner, lease);
                    return Ok(AcquireOutcome::Acquired(lease.grant(token, started)));
                }
                TxnResult::Exists(resp) => {
                    let revision = header_revision(&resp);
                    let Some(kv) = nth_first(&resp, 0) else {
                        // Free, so the mark refused it: pass it if this request may (once
                        // more, against the mark just read), else wait behind it.
                        self.leases.put_spare(lease);
                        let seen = nth_first(&resp, 1);
                        match seen
                            .as_ref()
                            .and_then(|m| marks::past_mark(m, owner, arrival))
                        {
                            Some(past) if passes < MAX_MARK_PASSES => {
                                passes += 1;
                                rule = past;
                                continue;
                            }
                            // The mark vanished meanwhile: try as at first.
                            None if seen.is_none() && passes < MAX_MARK_PASSES => {
                                passes += 1;
                                rule = MarkRule::Unmarked;
                                continue;
                            }
                            _ => return Ok(AcquireOutcome::Held(marks::behind_mark(revision))),
                        }
                    };
                    if held_by(kv.value(), owner.token()) && kv.lease() != lease.id {
                        self.leases.put_spare(lease);
                        // Already ours: the same hold again, its lease refreshed (never
                        // shortened).
                        let started = Instant::now();
                        if !self.leases.keep_alive(kv.lease()).await? {
                            lease_tries += 1;
                            continue; // expired just now: the key is gone with it
                        }
                        let known = self.leases.hold(key, owner).filter(|h| h.id == kv.lease());
                        let state = match known {
                            Some(h) => LeaseState {
                                refreshed: started,
                                ..h
                            },
                            None => match self.leases.lease_state(kv.lease(), started).await? {
                                Some(s) => s,
                                None => {
                                    lease_tries += 1;
                                    continue;
                                }
                            },
                        };
                        self.leases.set_hold(key, owner, state);
                        return Ok(AcquireOutcome::Acquired(Grant::new(
                            token_of(&kv),
                            state.ttl(),
                        )));
                    }
                    if held_by(kv.value(), owner.token()) {
                        // Our own transaction applied by an earlier try whose answer was lost.
                        self.leases.set_hold(key, owner, lease);
                        return Ok(AcquireOutcome::Acquired(
                            lease.grant(token_of(&kv), started),
                        ));
                    }
                    self.leases.put_spare(lease);
                    if let Some(arrival) = arrival {
                        let ttl = Duration::from_secs(u64::try_from(secs).unwrap_or(1));
                        let seen = nth_first(&resp, 1);
                        self.mark_turn(&k, seen.as_ref(), owner, arrival, ttl).await;
                    }
                    let remaining = self.leases.holder_remaining(kv.lease()).await?;
                    return Ok(AcquireOutcome::Held(
                        Contention::new(remaining).with_hint(WaitHint::at_revision(revision)),
                    ));
                }
            }
        }
        Err(LockError::unavailable(
            NAME,
            "leases kept expiring before the lock could be bound to one",
        ))
    }

    pub(super) async fn plain_release(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<ReleaseOutcome, LockError> {
        let k = self.etcd_key(key);
        let txn = Txn::new()
            .when([Compare::value(
                k.clone(),
                CompareOp::Equal,
                holder_value(owner),
            )])
            .and_then([TxnOp::delete(
                k.clone(),
                Some(DeleteOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(k.clone(), None)]);
        let resp = match self.txn("release", txn).await {
            Ok(resp) => resp,
            Err(e) => {
                // A key on a shared lease would live on with the other holds' renewals:
                // remember to delete it before that lease is kept alive again.
                if let Some(h) = self.leases.hold(key, owner) {
                    if self.leases.is_shared(h.id) {
                        self.leases.orphan(h.id, k.clone(), holder_value(owner));
                    }
                }
                return Err(e);
            }
        };
        let hold = self.leases.take_hold(key, owner);
        let released_lease = if resp.succeeded() {
            deleted_lease(&resp)
        } else {
            match failed_get(&resp) {
                // Same owner token under another label: still this owner's hold.
                Some(kv) if held_by(kv.value(), owner.token()) => {
                    let txn = Txn::new()
                        .when([Compare::mod_revision(
                            k.clone(),
                            CompareOp::Equal,
                            kv.mod_revision(),
                        )])
                        .and_then([TxnOp::delete(k.clone(), None)]);
                    if self.txn("release", txn).await?.succeeded() {
                        Some(kv.lease())
                    } else {
                        None
                    }
                }
                _ => None,
            }
        };
        match released_lease {
            Some(lease) => {
                self.watches.released(key, &k, header_revision(&resp));
                // The lease has no key left: keep it for the next acquisition. A shared
                // lease carries other holds.
                if !self.leases.is_shared(lease) {
                    match hold.filter(|h| h.id == lease) {
                        Some(h) => self.leases.put_spare(h),
                        None => self.leases.revoke_later(lease),
                    }
                }
                Ok(ReleaseOutcome::Released)
            }
            None => Ok(ReleaseOutcome::NotHeld),
        }
    }

    pub(super) async fn plain_extend(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<ExtendOutcome, LockError> {
        let k = self.etcd_key(key);
        let started = Instant::now();
        let known = self.leases.hold(key, owner);
        let (kv, lease) = match known {
            Some(h) => {
                // Both at once: the read proves the key is still ours and bound to this
                // lease; the keep-alive moves the lease's end.
                let (read, alive) = tokio::join!(self.get(&k), self.leases.keep_alive(h.id));
                let (kv, _) = read?;
                let Some(kv) =
                    kv.filter(|kv| held_by(kv.value(), owner.token()) && kv.lease() == h.id)
                else {
                    self.leases.take_hold(key, owner);
                    return Ok(ExtendOutcome::NotHeld);
                };
                if !alive? {
                    self.leases.take_hold(key, owner);
                    return Ok(ExtendOutcome::NotHeld);
                }
                (
                    kv,
                    LeaseState {
                        refreshed: started,
                        ..h
                    },
                )
            }
            None => {
                let (kv, _) = self.get(&k).await?;
                let Some(kv) = kv.filter(|kv| held_by(kv.value(), owner.token())) else {
                    return Ok(ExtendOutcome::NotHeld);
                };
                if !self.leases.keep_alive(kv.lease()).await? {
                    return Ok(ExtendOutcome::NotHeld);
                }
                match self.leases.lease_state(kv.lease(), started).await? {
                    Some(s) => (kv, s),
                    None => return Ok(ExtendOutcome::NotHeld),
                }
            }
        };
        self.leases.set_hold(key, owner, lease);
        Ok(ExtendOutcome::Extended(Grant::new(
            token_of(&kv),
            lease.ttl(),
        )))
    }

    /// The holder of `key`, if any: the plain layout's only lease on it.
    pub(super) async fn plain_holder(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let (kv, _) = self.get(&self.etcd_key(key)).await?;
        let Some(kv) = kv else { return Ok(None) };
        let remaining = if kv.lease() == 0 {
            None
        } else {
            match self.leases.time_to_live(kv.lease()).await? {
                Some((left, granted)) => Some(remaining_ttl(left, granted)),
                // Expired since the read: the key went with the lease.
                None => return Ok(None),
            }
        };
        Ok(Some(LockInfo::new(
            label_of(kv.value()),
            token_of(&kv),
            remaining,
        )))
    }

    pub(super) async fn plain_wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let k = self.etcd_key(key);
        // Subscribed before anything is looked at, so no release from here on is missed.
        let mut waiting = self.watches.subscribe(key, &k, place);
        let seen = match hint.revision() {
            Some(rev) => rev,
            None => {
                let (kv, rev) = self.get(&k).await?;
                if kv.is_none() {
                    return Ok(());
                }
                rev
            }
        };
        match waiting.watch_from(seen) {
            Coverage::Released => return Ok(()),
            Coverage::Covered => {}
            Coverage::Recheck => {
                // The watch began after `seen`: a release in between shows as a missing key
                // or a newer incarnation of it.
                let (kv, _) = self.get(&k).await?;
                match kv {
                    Some(kv) if kv.create_revision() <= seen => {}
                    _ => return Ok(()),
                }
            }
        }
        let _ = tokio::time::timeout(max_wait, waiting.released()).await;
        Ok(())
    }

    pub(super) async fn plain_force_release(
        &self,
        key: &LockKey,
    ) -> Result<ReleaseOutcome, LockError> {
        let k = &self.etcd_key(key);
        self.force_release_holder(|| async move { Ok(self.get(k).await?.0) })
            .await
    }
}
