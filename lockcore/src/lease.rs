//! Leases: what a holder knows about its hold, measured on its own monotonic clock.

use std::time::{Duration, Instant};

use crate::{FencingToken, LockKey};

/// The drift allowance subtracted from every lease: 1% of the TTL plus 2 ms, for the rate
/// difference between the store's clock and ours (the Redlock paper's figure).
pub fn clock_drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How long before `valid_until` the holder is told it has lost the lock when renewals keep
/// failing: 5% of the TTL.
pub fn lost_margin(ttl: Duration) -> Duration {
    ttl / 20
}

/// The end of a lease whose request started at `started` and to which the store applied
/// `ttl`, minus the drift allowance, capped by a validity the backend computed itself.
pub fn valid_until(started: Instant, ttl: Duration, cap: Option<Instant>) -> Instant {
    let end = started + ttl.saturating_sub(clock_drift(ttl));
    match cap {
        Some(cap) if cap < end => cap,
        _ => end,
    }
}

/// A snapshot of a hold: the key, its fencing token, the TTL the store applied and until
/// when the hold is valid on this process's monotonic clock.
///
/// `valid_until` is computed from the *start* of the request that last set the store's
/// deadline, minus a drift allowance; wall clocks are never compared across machines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub(crate) key: LockKey,
    pub(crate) token: FencingToken,
    pub(crate) ttl: Duration,
    pub(crate) valid_until: Instant,
}

impl Lease {
    /// The locked key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The fencing token to send with every write the lock protects.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The TTL the store applied (the requested TTL rounded up to the backend's minimum).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Until when the hold was valid when this snapshot was taken.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }
}
