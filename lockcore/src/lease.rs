//! Leases: what a holder knows about its hold, measured on its own monotonic clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{ClockSource, FencingToken, LockKey};

/// Now, on the clock a store's leases are measured on, which lockcore measures its leases,
/// deadlines and renewals of that store with: tokio's clock for a store that keeps its
/// leases on it ([`ClockSource::Tokio`]), which moves only as a test advances it when the
/// test paused it (`#[tokio::test(start_paused = true)]`); the process's monotonic clock
/// for every other store, whatever tokio's clock does.
pub(crate) fn now_on(clock: ClockSource) -> Instant {
    match clock {
        ClockSource::Tokio => tokio::time::Instant::now().into_std(),
        _ => Instant::now(),
    }
}

/// How long ago `since` was, on `clock` ([`now_on`]).
pub(crate) fn elapsed_on(clock: ClockSource, since: Instant) -> Duration {
    now_on(clock).saturating_duration_since(since)
}

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

/// How long the watchdog waits for the answer to a renewal of holds whose shortest TTL is
/// `ttl` before it gives up on the request and tries again soon: a quarter of the TTL (at
/// least 1 ms). A store that can end a request itself (a server-side statement timeout)
/// should end it within this, or the abandoned request keeps running there.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// assert_eq!(distlock_core::driver::renewal_allowance(Duration::from_secs(30)), Duration::from_millis(7500));
/// ```
pub fn renewal_allowance(ttl: Duration) -> Duration {
    (ttl / 4).max(Duration::from_millis(1))
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

/// An instant read and raised without a lock: signed nanoseconds from a fixed instant of
/// the process (8 bytes where a `Mutex<Instant>` takes 24, in every hold).
pub(crate) struct AtomicInstant(AtomicI64);

impl AtomicInstant {
    pub(crate) fn new(at: Instant) -> Self {
        AtomicInstant(AtomicI64::new(to_nanos(at)))
    }

    pub(crate) fn load(&self) -> Instant {
        from_nanos(self.0.load(Ordering::Acquire))
    }

    /// Moves it to `at` if that is later; never earlier.
    pub(crate) fn raise(&self, at: Instant) {
        self.0.fetch_max(to_nanos(at), Ordering::AcqRel);
    }
}

/// The instant [`AtomicInstant`]s count from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn to_nanos(at: Instant) -> i64 {
    let epoch = epoch();
    match at.checked_duration_since(epoch) {
        Some(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
        None => i64::try_from(epoch.duration_since(at).as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

fn from_nanos(nanos: i64) -> Instant {
    let epoch = epoch();
    let offset = Duration::from_nanos(nanos.unsigned_abs());
    if nanos >= 0 {
        epoch.checked_add(offset).unwrap_or(epoch)
    } else {
        // An instant before the epoch was one once, so it can be again.
        epoch.checked_sub(offset).unwrap_or(epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Instants before and after the epoch come back exactly, and a raise never lowers.
    #[test]
    fn an_atomic_instant_keeps_the_instant_and_only_rises() {
        let now = Instant::now();
        let _ = epoch();
        let before = now.checked_sub(Duration::from_millis(1500)).unwrap_or(now);
        let at = AtomicInstant::new(before);
        assert_eq!(at.load(), before);
        let later = Instant::now() + Duration::from_secs(30);
        at.raise(later);
        assert_eq!(at.load(), later);
        at.raise(later - Duration::from_nanos(1));
        assert_eq!(at.load(), later, "a raise to an earlier instant lowered it");
        at.raise(later + Duration::from_nanos(1));
        assert_eq!(at.load(), later + Duration::from_nanos(1));
    }
}
