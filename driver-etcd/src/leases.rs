//! Leases: granting (with IDs of our own, alongside the transaction that uses them),
//! keep-alives, time-to-live reads, revocation, the pool of spare leases, and the shared
//! leases renewals move holds onto.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{LeaseGrantOptions, LeaseTimeToLiveOptions, Txn, TxnResponse};
use futures_util::future::join_all;
use lockcore::driver::{Grant, OwnerToken};
use lockcore::{FencingToken, LockError};

use crate::endpoints::Endpoints;
use crate::error::is_lease_not_found;
use crate::lock;

mod shared;

pub(crate) use shared::{MAX_NESTED_TXNS, MAX_TXN_OPS};

/// How long a lease grant may go unanswered before the transaction using the lease is
/// sent anyway (the grant is then all but certainly applied first; if not, the
/// transaction is sent again).
const GRANT_HEAD_START: Duration = Duration::from_millis(3);

/// A kept lease refreshed less than `ttl / FRESH_FRACTION` ago is reused without a
/// keep-alive; the hold's validity is then counted from that refresh.
const FRESH_FRACTION: u32 = 10;

/// How many unused leases a backend keeps for later acquisitions. Reusing one spares an
/// acquisition its lease grant and a release its revoke, each a raft write: a lock costs
/// two round trips instead of three (lockbench `etcd`, `uncontended` and `concurrent64`;
/// docs/performance.md has the figures with and without spares).
const MAX_SPARES: usize = 64;

/// A lease this backend granted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseState {
    pub(crate) id: i64,
    /// The TTL the server applied, in seconds (at most `i32::MAX`: 68 years).
    pub(crate) ttl: i32,
    /// The TTL that was asked for (a server with a longer minimum applies more): kept
    /// leases are matched to requests by it.
    pub(crate) asked: i32,
    /// When the request that last granted or refreshed it started.
    pub(crate) refreshed: Instant,
}

impl LeaseState {
    /// A lease granted `ttl` seconds where `asked` were asked for, at `refreshed`. The
    /// seconds are kept in 32 bits (one record per hold): a longer TTL counts as 68 years.
    pub(crate) fn new(id: i64, ttl: i64, asked: i64, refreshed: Instant) -> Self {
        let secs = |s: i64| i32::try_from(s.max(0)).unwrap_or(i32::MAX);
        LeaseState {
            id,
            ttl: secs(ttl),
            asked: secs(asked),
            refreshed,
        }
    }

    /// Whether it was granted for a request of `secs` seconds.
    pub(crate) fn asked_for(&self, secs: i64) -> bool {
        i64::from(self.asked) == secs
    }

    pub(crate) fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl.max(0) as u64)
    }

    /// Until when the lease lives at least, on our clock.
    pub(crate) fn alive_until(&self) -> Instant {
        self.refreshed + self.ttl()
    }

    /// The grant of a hold on this lease for a request that started at `started`: a lease
    /// last refreshed before that caps the hold's validity.
    pub(crate) fn grant(&self, token: FencingToken, started: Instant) -> Grant {
        let grant = Grant::new(token, self.ttl());
        if self.refreshed < started {
            grant.with_valid_until(self.alive_until() - lockcore::driver::clock_drift(self.ttl()))
        } else {
            grant
        }
    }
}

/// A lease's remaining TTL as etcd reports it (whole seconds, truncated): the upper end,
/// capped at the granted TTL, so a waiter never wakes before the lease can have expired.
fn remaining_ttl(left: i64, granted: i64) -> Duration {
    Duration::from_secs((left + 1).min(granted.max(left)).max(0) as u64)
}

/// The TTL to ask etcd for: whole seconds, rounded up.
pub(crate) fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// A lease ID of our own choosing, so the grant and the transaction that uses the lease
/// can be sent together (one round trip instead of two).
pub(crate) fn random_lease_id() -> i64 {
    let bytes = OwnerToken::generate();
    let mut id = [0u8; 8];
    id.copy_from_slice(&bytes.as_bytes()[..8]);
    // Positive and non-zero (zero asks the server to choose).
    (i64::from_le_bytes(id) & i64::MAX).max(1)
}

/// The leases of one backend: the spare leases it keeps for later acquisitions, its
/// shared leases, and the requests on leases.
pub(crate) struct Leases {
    endpoints: Arc<Endpoints>,
    spares: Mutex<Vec<LeaseState>>,
    /// The shared leases renewals move holds onto (see [`shared`]).
    shared: shared::SharedLeases,
}

impl Leases {
    pub(crate) fn new(endpoints: Arc<Endpoints>) -> Self {
        Leases {
            endpoints,
            spares: Mutex::new(Vec::new()),
            shared: shared::SharedLeases::default(),
        }
    }

    /// A kept lease of the same TTL that lives long enough to be worth refreshing.
    fn take_spare(&self, ttl: i64) -> Option<LeaseState> {
        let now = Instant::now();
        let mut spares = lock(&self.spares);
        // Leases that may already have expired are dropped (the server frees them).
        spares.retain(|s| s.refreshed + s.ttl() / 2 > now);
        let i = spares.iter().rposition(|s| s.asked_for(ttl))?;
        Some(spares.swap_remove(i))
    }

    /// Keeps `lease` (left without keys) for a later acquisition if there is room, else
    /// leaves it to expire: revoking it would cost a request per lease for nothing the
    /// server does not do by itself within the lease's TTL. A shared lease carries other
    /// holds: it is never a spare.
    pub(crate) fn put_spare(&self, lease: LeaseState) {
        if self.is_shared(lease.id) {
            return;
        }
        let mut spares = lock(&self.spares);
        if spares.len() < MAX_SPARES {
            spares.push(lease);
        }
    }

    /// Revokes every spare lease (each given 500 ms), at shutdown.
    pub(crate) async fn revoke_spares(&self) {
        let spares: Vec<LeaseState> = std::mem::take(&mut *lock(&self.spares));
        for s in spares {
            let _ = tokio::time::timeout(Duration::from_millis(500), self.revoke(s.id)).await;
        }
    }

    /// Revokes `lease`; `false` if it no longer existed.
    pub(crate) async fn revoke(&self, lease: i64) -> Result<bool, LockError> {
        self.endpoints
            .call("lease revoke", |mut c| async move {
                match c.lease_revoke(lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if is_lease_not_found(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            })
            .await
    }

    /// Revokes `lease` if no key is bound to it; `false` if it was left alone or gone.
    pub(crate) async fn revoke_if_unused(&self, lease: i64) -> Result<bool, LockError> {
        let unused = self
            .endpoints
            .call("lease time-to-live", |mut c| async move {
                let keys = LeaseTimeToLiveOptions::new().with_keys();
                match c.lease_time_to_live(lease, Some(keys)).await {
                    Ok(r) => Ok(r.ttl() >= 0 && r.keys().is_empty()),
                    Err(e) if is_lease_not_found(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            })
            .await?;
        if !unused {
            return Ok(false);
        }
        self.revoke(lease).await
    }

    pub(crate) async fn grant(&self, id: i64, ttl: i64) -> Result<i64, LockError> {
        self.endpoints
            .call("lease grant", |mut c| async move {
                match c
                    .lease_grant(ttl, Some(LeaseGrantOptions::new().with_id(id)))
                    .await
                {
                    Ok(r) => Ok(r.ttl()),
                    // Our own earlier attempt, whose answer was lost, already created it.
                    Err(e) if e.to_string().contains("lease already exists") => Ok(0),
                    Err(e) => Err(e),
                }
            })
            .await
            .map(|applied| if applied > 0 { applied } else { ttl })
    }

    /// Refreshes `lease`; `false` if it no longer exists. A shared lease's orphans are
    /// deleted first (and it is not refreshed while they cannot be).
    pub(crate) async fn keep_alive(&self, lease: i64) -> Result<bool, LockError> {
        if self.is_shared(lease) {
            self.delete_orphans(lease).await?;
        }
        self.endpoints
            .call("lease keep-alive", |mut c| async move {
                match c.lease_keep_alive(lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if is_lease_not_found(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            })
            .await
    }

    /// How long the holder whose key is bound to `lease` has left (for `holders`, and a
    /// waiter's blind timeout): `None` for a key without a lease (not written by this
    /// driver: nothing to count down), zero for a lease that expired since the key was read
    /// (the key went with it).
    pub(crate) async fn holder_remaining(&self, lease: i64) -> Result<Option<Duration>, LockError> {
        if lease == 0 {
            return Ok(None);
        }
        Ok(Some(match self.time_to_live(lease).await? {
            Some((left, granted)) => remaining_ttl(left, granted),
            None => Duration::ZERO,
        }))
    }

    /// `(remaining, granted)` TTL of `lease` in seconds; `None` if it is gone.
    pub(crate) async fn time_to_live(&self, lease: i64) -> Result<Option<(i64, i64)>, LockError> {
        self.endpoints
            .call("lease time-to-live", |mut c| async move {
                match c.lease_time_to_live(lease, None).await {
                    Ok(r) if r.ttl() >= 0 => Ok(Some((r.ttl(), r.granted_ttl()))),
                    Ok(_) => Ok(None),
                    Err(e) if is_lease_not_found(&e) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await
    }

    /// Sends the transaction `txn(lease_id)` with a lease for a hold of `secs` seconds:
    /// `known` if given (the lease of this owner's queue place), else a kept one, else a new
    /// one. A kept lease not refreshed lately is refreshed alongside the transaction; a new
    /// one is granted with an ID of our own, so the transaction need not wait for the
    /// grant's answer. `None`: the lease turned out to be gone (and a key the transaction
    /// bound to it with it): try again with another.
    pub(crate) async fn with_lease(
        &self,
        secs: i64,
        known: Option<LeaseState>,
        txn: impl Fn(i64) -> Txn,
    ) -> Result<Option<(LeaseState, TxnResponse)>, LockError> {
        let started = Instant::now();
        let (lease, result) = match known.or_else(|| self.take_spare(secs)) {
            // Refreshed moments ago: the lease's end is known well enough (the grant
            // carries it), and the watchdog refreshes it soon.
            Some(spare) if started < spare.refreshed + spare.ttl() / FRESH_FRACTION => {
                (spare, self.lease_txn(txn(spare.id)).await)
            }
            Some(spare) => {
                // Refreshed alongside the transaction: one round trip.
                let (result, alive) =
                    tokio::join!(self.lease_txn(txn(spare.id)), self.keep_alive(spare.id));
                match alive {
                    Ok(true) => (
                        LeaseState {
                            refreshed: started,
                            ..spare
                        },
                        result,
                    ),
                    // Unknown: the lease lives at least until its last known refresh.
                    Err(_) => (spare, result),
                    Ok(false) => return Ok(None),
                }
            }
            None => {
                let id = random_lease_id();
                // The transaction follows the grant without waiting for its answer (our own
                // lease ID makes that possible) once the grant has had a head start: one
                // round trip, and a slow answer delays the caller, not the store.
                let grant = self.grant(id, secs);
                tokio::pin!(grant);
                let head_start = tokio::select! {
                    g = &mut grant => Some(g),
                    _ = tokio::time::sleep(GRANT_HEAD_START) => None,
                };
                let (ttl, result) = match head_start {
                    Some(g) => (g?, self.lease_txn(txn(id)).await),
                    None => {
                        let (g, result) = tokio::join!(grant, self.lease_txn(txn(id)));
                        (g?, result)
                    }
                };
                let result = match result {
                    // The transaction overtook the grant: send it again.
                    Ok(None) => self.lease_txn(txn(id)).await,
                    other => other,
                };
                (LeaseState::new(id, ttl, secs, started), result)
            }
        };
        // An error may hide a transaction that was applied (answer lost): lockcore
        // releases by owner; the lease itself expires.
        Ok(result?.map(|resp| (lease, resp)))
    }

    /// Sends the transaction `txn(ids)` with `n` leases for holds of `secs` seconds, one per
    /// place a set puts (see `sets`): kept ones first, then new ones granted with IDs of our
    /// own alongside the transaction, as [`with_lease`](Self::with_lease) does for one;
    /// a kept lease not refreshed lately is refreshed alongside it. The leases come back in
    /// the order of `ids`. `None`: a lease turned out to be gone (and a key the transaction
    /// bound to it with it): try again with others.
    pub(crate) async fn with_leases(
        &self,
        secs: i64,
        n: usize,
        txn: impl Fn(&[i64]) -> Txn,
    ) -> Result<Option<(Vec<LeaseState>, TxnResponse)>, LockError> {
        let started = Instant::now();
        let mut leases: Vec<LeaseState> = (0..n).map_while(|_| self.take_spare(secs)).collect();
        let new: Vec<i64> = (leases.len()..n).map(|_| random_lease_id()).collect();
        let stale: Vec<usize> = (0..leases.len())
            .filter(|&i| started >= leases[i].refreshed + leases[i].ttl() / FRESH_FRACTION)
            .collect();
        let ids: Vec<i64> = leases
            .iter()
            .map(|l| l.id)
            .chain(new.iter().copied())
            .collect();
        let grants = join_all(new.iter().map(|&id| self.grant(id, secs)));
        tokio::pin!(grants);
        // As for one lease: the transaction follows the grants once they had a head start.
        let head_start = if new.is_empty() {
            Some(Vec::new())
        } else {
            tokio::select! {
                g = &mut grants => Some(g),
                _ = tokio::time::sleep(GRANT_HEAD_START) => None,
            }
        };
        let refresh = join_all(stale.iter().map(|&i| self.keep_alive(leases[i].id)));
        let (ttls, result, alive) = match head_start {
            Some(g) => {
                let ttls = g.into_iter().collect::<Result<Vec<i64>, _>>()?;
                let (result, alive) = tokio::join!(self.lease_txn(txn(&ids)), refresh);
                (ttls, result, alive)
            }
            None => {
                let (g, result, alive) =
                    tokio::join!(&mut grants, self.lease_txn(txn(&ids)), refresh);
                let ttls = g.into_iter().collect::<Result<Vec<i64>, _>>()?;
                // The transaction overtook a grant: send it again.
                let result = match result {
                    Ok(None) => self.lease_txn(txn(&ids)).await,
                    other => other,
                };
                (ttls, result, alive)
            }
        };
        for (&i, alive) in stale.iter().zip(alive) {
            match alive {
                Ok(true) => leases[i].refreshed = started,
                // Unknown: the lease lives at least until its last known refresh.
                Err(_) => {}
                Ok(false) => return Ok(None),
            }
        }
        for (&id, ttl) in new.iter().zip(ttls) {
            leases.push(LeaseState::new(id, ttl, secs, started));
        }
        // An error may hide a transaction that was applied (answer lost): lockcore
        // releases every key of the set by owner; the leases themselves expire.
        Ok(result?.map(|resp| (leases, resp)))
    }

    /// Sends the acquiring transaction `txn`; `None` if its lease is missing.
    async fn lease_txn(&self, txn: Txn) -> Result<Option<TxnResponse>, LockError> {
        self.endpoints
            .call("acquire", |mut c| {
                let txn = txn.clone();
                async move {
                    match c.txn(txn).await {
                        Ok(r) => Ok(Some(r)),
                        Err(e) if is_lease_not_found(&e) => Ok(None),
                        Err(e) => Err(e),
                    }
                }
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spare lease reused without a keep-alive lives until its last refresh plus its TTL:
    /// a grant on it must not count its validity from the later request.
    #[test]
    fn a_reused_lease_caps_valid_until_at_its_last_refresh() {
        let refreshed = Instant::now();
        let lease = LeaseState::new(1, 2, 2, refreshed);
        let ttl = Duration::from_secs(2);
        let started = refreshed + Duration::from_millis(150);
        let reused = lease.grant(FencingToken(7), started);
        assert_eq!(reused.token, FencingToken(7));
        assert_eq!(reused.ttl, ttl);
        assert_eq!(
            reused.valid_until,
            Some(refreshed + ttl - lockcore::driver::clock_drift(ttl)),
            "the grant on a lease refreshed 150 ms before the request is not capped by it"
        );
        // Granted or refreshed by this very request: lockcore counts from its start.
        assert_eq!(lease.grant(FencingToken(7), refreshed).valid_until, None);
    }
}
