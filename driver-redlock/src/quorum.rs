//! The quorum rule, as `docs/redlock.md` states it in "The algorithm, and what is different
//! from the write-ups" (rows *acquire*, *contention*, *too few answers*, *release*,
//! *extend*):
//!
//! * a majority of N instances is N/2+1 ([`majority`]);
//! * a lease is valid until `start + ttl − drift` (drift = 1% of the TTL + 2 ms,
//!   [`lockcore::driver::clock_drift`]), measured on this process's monotonic clock from the start
//!   of the round, so what is left of it is `ttl − elapsed − drift` ([`valid_until`]);
//! * a round stops waiting as soon as its outcome is decided: a majority agreed, or enough
//!   instances answered that it cannot ([`decided`]);
//! * a lock held by others is free again once at most N − (N/2+1) of their copies remain
//!   ([`time_until_at_most`]).

use std::time::{Duration, Instant};

use lockcore::driver::clock_drift;

/// The majority of `instances`: N/2+1.
pub(crate) fn majority(instances: usize) -> usize {
    instances / 2 + 1
}

/// The end of the validity of a lease of `ttl` whose round started at `started`:
/// `started + ttl − drift`, so that `ttl − elapsed − drift` is what is left of it.
pub(crate) fn valid_until(started: Instant, ttl: Duration) -> Instant {
    started + ttl.saturating_sub(clock_drift(ttl))
}

/// Whether a round can stop waiting: a majority agreed, nothing is pending, or a majority
/// can no longer agree and enough instances answered to say so (otherwise the pending ones
/// decide between "refused" and "too few answered").
pub(crate) fn decided(agreed: usize, answered: usize, pending: usize, quorum: usize) -> bool {
    agreed >= quorum || pending == 0 || (agreed + pending < quorum && answered >= quorum)
}

/// The time until at most `free_after` of these holds remain: the holds sorted longest
/// first, the one at index `free_after` (`None`, no expiry, counts as longest).
pub(crate) fn time_until_at_most(
    mut holds: Vec<Option<Duration>>,
    free_after: usize,
) -> Option<Duration> {
    holds.sort_by(|a, b| match (a, b) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, _) => std::cmp::Ordering::Less,
        (_, None) => std::cmp::Ordering::Greater,
        (Some(a), Some(b)) => b.cmp(a),
    });
    holds.get(free_after).copied().flatten()
}

/// What a release or an extension came to, and how many instances agreed to it (released
/// or renewed the owner's lock) out of how many answered at all (the rest failed or timed
/// out). A round stops at its decision, so the counts are of the answers until then. The
/// counts are for the unit tests; the round's `debug` event logs the same.
#[derive(Debug)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct Tally<O> {
    pub(crate) outcome: O,
    pub(crate) agreed: usize,
    pub(crate) answered: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_time_counts_down_to_a_free_majority() {
        let ms = |v: u64| Some(Duration::from_millis(v));
        // 5 instances, quorum 3: free once at most 2 hold it.
        assert_eq!(time_until_at_most(vec![ms(10), ms(30), ms(20)], 2), ms(10));
        assert_eq!(
            time_until_at_most(vec![ms(10), ms(30), ms(20), ms(5)], 2),
            ms(10)
        );
        assert_eq!(time_until_at_most(vec![None, ms(30), ms(20)], 1), ms(30));
        assert_eq!(time_until_at_most(vec![None, ms(30), ms(20)], 0), None);
    }

    #[test]
    fn majorities_and_validity() {
        assert_eq!([1, 2, 3, 4, 5, 6, 7].map(majority), [1, 2, 2, 3, 3, 4, 4]);
        // ttl − drift, drift = 1% of the TTL + 2 ms: never longer than the TTL.
        let started = Instant::now();
        assert_eq!(
            valid_until(started, Duration::from_secs(1)),
            started + Duration::from_millis(988)
        );
        assert_eq!(
            valid_until(started, Duration::from_millis(1)),
            started,
            "a TTL shorter than the drift leaves no validity"
        );
    }

    #[test]
    fn decisions() {
        // 5 instances, quorum 3.
        assert!(decided(3, 3, 2, 3));
        assert!(!decided(2, 2, 3, 3));
        // Cannot win, and three answered: contention, decided.
        assert!(decided(0, 3, 2, 3));
        // Cannot win, but too few answered yet to say whether it is contention.
        assert!(!decided(0, 1, 2, 3));
        assert!(decided(0, 1, 0, 3));
    }
}
