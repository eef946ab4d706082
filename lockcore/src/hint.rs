//! What a refused attempt tells the wait that follows it: [`WaitHint`].

use std::time::Duration;

/// An opaque hint from a failed attempt that tells
/// [`LockBackend::wait_released`](crate::LockBackend::wait_released) where to wait from: the
/// exact store state the attempt saw (etcd: the revision, so no release is
/// missed), or that the store asks for a pause before the next attempt rather than a wait
/// for a release (Redlock: after a split vote nobody holds the lock), and whether only
/// another waiter's reservation refused the attempt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WaitHint {
    revision: Option<i64>,
    retry_after: Option<Duration>,
    behind_reservation: bool,
    reservation: Option<bool>,
}

impl WaitHint {
    /// No hint.
    pub const fn none() -> Self {
        WaitHint {
            revision: None,
            retry_after: None,
            behind_reservation: false,
            reservation: None,
        }
    }

    /// A hint carrying the store revision the attempt saw.
    pub const fn at_revision(revision: i64) -> Self {
        WaitHint {
            revision: Some(revision),
            retry_after: None,
            behind_reservation: false,
            reservation: None,
        }
    }

    /// A hint that the next attempt should come after `pause`, whether or not a release
    /// is seen: the contention was transient (a split vote), not a holder to wait for.
    pub const fn retry_after(pause: Duration) -> Self {
        WaitHint {
            revision: None,
            retry_after: Some(pause),
            behind_reservation: false,
            reservation: None,
        }
    }

    /// Marks the refusal as one by another waiter's reservation alone: the claim fits the
    /// leases, but the room is kept for an earlier waiter ([`Claim::fits`](crate::Claim::fits)), which is about
    /// to take it (or gives up, or its reservation lapses).
    ///
    /// The client then passes the wake-up that led to the refused attempt on to the waiters
    /// of this process queued behind it (the reservation's owner may be one of them), and
    /// waits for the next change of the key rather than a blind pause. A backend's
    /// [`wait_released`](crate::LockBackend::wait_released) should not take a key that is free
    /// of leases as a reason to return at once under this hint: it may be free but
    /// reserved; wait for a change (a release, the reservation's removal) within
    /// `max_wait`, which the client bounds by the reservation's expiry.
    pub const fn behind_reservation(mut self) -> Self {
        self.behind_reservation = true;
        self
    }

    /// Says whether the store holds a reservation of the claiming owner's once it refused
    /// the attempt (recorded or refreshed by it, or left by an earlier one).
    ///
    /// The client removes a reservation ([`LockBackend::abandon`](crate::LockBackend::abandon)) before a refused
    /// `try_acquire` (or a wait whose deadline passed) answers, so that the room it keeps
    /// goes to the next request at once. With `false` it spares that round trip; without
    /// this hint it assumes a refused claim that is not exclusive holds one, and leaves an
    /// exclusive claim's to the background clean-up.
    pub const fn with_reservation(mut self, kept: bool) -> Self {
        self.reservation = Some(kept);
        self
    }

    /// Whether [`with_reservation`](Self::with_reservation) says the store holds a
    /// reservation of the claiming owner's; `None` when the backend does not say.
    pub fn reservation(&self) -> Option<bool> {
        self.reservation
    }

    /// The store revision, if the backend recorded one.
    pub fn revision(&self) -> Option<i64> {
        self.revision
    }

    /// The pause set by [`retry_after`](Self::retry_after), if any.
    pub fn retry_delay(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Whether [`behind_reservation`](Self::behind_reservation) marked the refusal.
    pub fn is_behind_reservation(&self) -> bool {
        self.behind_reservation
    }
}
