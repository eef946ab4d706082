//! Bounded unfairness without a queue: a waiter that has waited long marks the key as its
//! own next turn, and the oldest such waiter wins ([`Fairness::Bounded`]).
//!
//! Across processes, a process that releases a key and asks again at once reaches the store
//! before any other process's waiter has even heard of the release: without help, it wins
//! nearly every time and the others can wait until their deadline. A backend that declares
//! [`Fairness::Bounded`] keeps one *mark* per key — the reservation of
//! [`Claim::fits`](crate::Claim::fits), also used against writer starvation — for the
//! longest-waiting request that asked for it:
//!
//! * lockcore tells the store how long a request has waited
//!   ([`ClaimRequest::waited`](crate::driver::ClaimRequest::waited)) on every attempt it
//!   makes once the request has waited [`STARVING_AFTER`] (time in the client's line for
//!   the key counts: requests are compared by arrival);
//! * the store converts that into the request's arrival on its own clock
//!   (`now − waited`, so no two machines' clocks are ever compared; a store whose atomic
//!   step cannot read a clock, as etcd, uses the client's wall clock, which then orders
//!   long waiters but decides neither exclusion nor a mark's life) and, when it refuses the
//!   attempt, records a mark for it unless an earlier arrival's mark lives; an earlier
//!   arrival displaces a later one's mark;
//! * while a mark lives, the key goes to no other request except one that arrived earlier
//!   still; the grant to the mark's owner removes it, [`abandon`] removes it when its
//!   request gives up, and it expires after [`STARVING_MARK_TTL`] (or the waiter's TTL if
//!   shorter) unless its waiter asks again, so a waiter that vanished blocks nobody long.
//!
//! A request that has waited less than [`STARVING_AFTER`] sends nothing, so uncontended
//! locks and quick hand-offs cost exactly what they did.
//!
//! [`Fairness::Bounded`]: crate::Fairness::Bounded
//! [`abandon`]: crate::LockBackend::abandon

use std::time::Duration;

/// How long a request waits before it asks the store to mark the key as its next turn
/// ([`ClaimRequest::waited`](crate::ClaimRequest::waited)). Shorter than any wait a person notices, longer than a hand-off on
/// every in-tree store (a release, its signal and the woken waiter's attempt: 0.2–6 ms).
pub const STARVING_AFTER: Duration = Duration::from_millis(20);

/// How long a mark made for a long wait lives in the store at most (the waiter's TTL if
/// shorter): a waiter that died while marked keeps others out of a free key no longer
/// than this. A live waiter renews its mark by asking again at least twice as often, as
/// long as its client has at most 500 marked requests: beyond that, their renewals share a
/// budget of 1,000 a second, all keys together.
pub const STARVING_MARK_TTL: Duration = Duration::from_secs(1);

/// How many attempts a client sends a second at most, all keys together, only to renew
/// the marks of its requests that wait long. Each is a write in the store: 6,000 marked
/// waiters on 6,000 keys renewing twice a second asked SQLite for 12,000 writes a second,
/// more than its one writer serves, and the releases the waiters were waiting for queued
/// behind them (none was served in two minutes).
pub(crate) const MARK_RENEWALS_PER_SECOND: u64 = 1_000;

/// How long a marked request of a client that has `marked` of them naps at most before it
/// asks again, renewing its mark: half a mark's life, or longer once the client's marked
/// requests together would renew more than [`MARK_RENEWALS_PER_SECOND`] times a second.
///
/// Beyond 500 marked requests a mark may lapse between two renewals. It is made again at
/// the waiter's next refused attempt, which a release wakes it for: the releasing process
/// may then take the key once more before the mark stands again. So at that scale the
/// bound grows by one grant per lapse, and the store is not flooded.
pub(crate) fn renew_marks_every(marked: usize) -> Duration {
    let marked = u64::try_from(marked).unwrap_or(u64::MAX);
    let spread = Duration::from_micros(marked.saturating_mul(1_000_000 / MARK_RENEWALS_PER_SECOND));
    spread.max(STARVING_MARK_TTL / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_renewed_twice_a_life_until_the_budget_binds() {
        assert_eq!(renew_marks_every(0), STARVING_MARK_TTL / 2);
        assert_eq!(renew_marks_every(500), STARVING_MARK_TTL / 2);
        assert_eq!(renew_marks_every(2_000), Duration::from_secs(2));
        assert_eq!(
            renew_marks_every(usize::MAX),
            Duration::from_micros(u64::MAX)
        );
    }
}
