//! What a backend declares it can do: its fencing guarantee, fairness, clock, TTL bounds,
//! and which claims it takes.

use std::time::Duration;

use serde::Serialize;

#[cfg(doc)]
use crate::{backend::RENEWAL_BATCH, ClaimRequest, LockBackend};
use crate::{Claim, LockError};

/// How far a backend's fencing tokens can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum FencingGuarantee {
    /// Tokens come from consensus or a durable counter: they increase whatever the clocks do.
    Strict,
    /// Tokens increase as long as the store's clock never steps backwards (a counter with a
    /// clock floor, so rows or keys can be deleted without tokens going back).
    ClockAssisted,
    /// The backend issues no tokens (every token is 0), e.g. Redlock with fencing switched
    /// off to save a round trip. A [`FencedResource`](crate::FencedResource) or a
    /// `WHERE fence <= $token` write then rejects nothing: use it only where nothing relies
    /// on tokens.
    None,
}

/// Whether waiters are served in arrival order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum Fairness {
    /// The store does not order waiters: after a release, whichever client tries first
    /// wins. (Within one [`LockClient`](crate::LockClient), requests for a key still take
    /// turns in arrival order.)
    None,
    /// Waiters are served in the order they queued in the store.
    Fifo,
    /// The store orders only the waiters that have waited long: a request refused after
    /// waiting [`STARVING_AFTER`](crate::driver::STARVING_AFTER) or more marks the key as
    /// its next turn, and the earliest-arrived of them is served before anyone else asks.
    /// A releasing process asking again at once no longer wins every time: a waiter is
    /// bypassed by at most a few grants once it is the longest waiting.
    ///
    /// lockcore sends such a request's wait in [`ClaimRequest::waited`]; the store applies
    /// this rule in the same atomic step as the claim:
    ///
    /// * the request arrived at the store's now less `waited` (never a client's clock, so
    ///   no two machines' clocks are compared; where the store's atomic step has no clock
    ///   to read, the client's wall clock less `waited` orders the marks, and the mark's
    ///   life still comes from the store);
    /// * another owner's *mark* (the reservation of [`Claim::fits`]) stands in the way of
    ///   every request but one that arrived strictly earlier, which may take the key and
    ///   leaves the mark to its owner;
    /// * a refused request that says how long it waited records its own mark, unless
    ///   another owner's mark lives that arrived no later; its own mark keeps its earliest
    ///   arrival and lives [`STARVING_MARK_TTL`](crate::driver::STARVING_MARK_TTL) (or the
    ///   TTL if shorter) from each refusal;
    /// * a request that says nothing never marks and never displaces a mark; the grant to
    ///   the mark's owner and [`LockBackend::abandon`] remove it.
    Bounded,
}

/// Whose clock decides when a lease has expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum ClockSource {
    /// The monotonic clock of this process (in-process backends).
    Local,
    /// The store's own clock, read inside the operation that changes the lock.
    Store,
    /// The clock of the tokio runtime that took the lock, which a test can pause and
    /// advance (`tokio::time::pause`): an in-process store that keeps its leases on
    /// tokio's clock (`distlock_core::testing::TestStore`, feature `testing`). lockcore then
    /// times the hold's renewals and its [`lost`](crate::LockHandle::lost) signal with
    /// that runtime's timers instead of its watchdog thread, so they move with the test's
    /// clock. Made for tests: once that runtime has shut down, nothing declares the hold
    /// lost any more (the watchdog thread would).
    Tokio,
}

/// What a backend can do, declared once and checked by lockcore and the conformance suite.
///
/// Built with `const fn`s so drivers can declare it as a constant:
///
/// ```
/// use std::time::Duration;
/// use distlock_core::driver::{Capabilities, FencingGuarantee};
///
/// const CAPS: Capabilities = Capabilities::new(FencingGuarantee::ClockAssisted)
///     .with_notifications(true)
///     .with_min_ttl(Duration::from_secs(2));
/// assert_eq!(CAPS.min_ttl, Duration::from_secs(2));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// How far fencing tokens can be trusted.
    pub fencing: FencingGuarantee,
    /// Whether [`LockBackend::wait_released`] is woken by the store on release (pub/sub,
    /// NOTIFY, watch) rather than by polling.
    pub notifications: bool,
    /// Whether waiters are served in order.
    pub fairness: Fairness,
    /// The shortest TTL the store honours; shorter requests are rounded up to it.
    pub min_ttl: Duration,
    /// The longest TTL accepted; longer requests are [`LockError::InvalidTtl`].
    pub max_ttl: Duration,
    /// Whose clock judges expiry.
    pub clock: ClockSource,
    /// Whether [`LockBackend::claim`] takes shared claims of a read-write key
    /// ([`Claim::shared`]) besides the exclusive lock.
    pub shared: bool,
    /// Whether [`LockBackend::claim`] takes semaphore permits ([`Claim::permits`]).
    pub semaphores: bool,
    /// Whether [`LockBackend::renew`] renews a batch in a fixed number of requests
    /// (one or two per [`RENEWAL_BATCH`]) rather than one request per renewal.
    pub batched_renewals: bool,
}

impl Capabilities {
    /// Capabilities with the given fencing guarantee, no notifications, no fairness, TTLs
    /// from 1 ms to 24 h, judged by the store's clock.
    pub const fn new(fencing: FencingGuarantee) -> Self {
        Capabilities {
            fencing,
            notifications: false,
            fairness: Fairness::None,
            min_ttl: Duration::from_millis(1),
            max_ttl: Duration::from_secs(24 * 3600),
            clock: ClockSource::Store,
            shared: false,
            semaphores: false,
            batched_renewals: false,
        }
    }

    /// Sets [`fencing`](Self::fencing).
    pub const fn with_fencing(mut self, fencing: FencingGuarantee) -> Self {
        self.fencing = fencing;
        self
    }

    /// Sets [`notifications`](Self::notifications).
    pub const fn with_notifications(mut self, notifications: bool) -> Self {
        self.notifications = notifications;
        self
    }

    /// Sets [`fairness`](Self::fairness).
    pub const fn with_fairness(mut self, fairness: Fairness) -> Self {
        self.fairness = fairness;
        self
    }

    /// Sets [`min_ttl`](Self::min_ttl).
    pub const fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }

    /// Sets [`max_ttl`](Self::max_ttl).
    pub const fn with_max_ttl(mut self, max_ttl: Duration) -> Self {
        self.max_ttl = max_ttl;
        self
    }

    /// Sets [`clock`](Self::clock).
    pub const fn with_clock(mut self, clock: ClockSource) -> Self {
        self.clock = clock;
        self
    }

    /// Sets [`batched_renewals`](Self::batched_renewals).
    pub const fn with_batched_renewals(mut self, batched: bool) -> Self {
        self.batched_renewals = batched;
        self
    }

    /// Sets [`shared`](Self::shared) and [`semaphores`](Self::semaphores).
    pub const fn with_claims(mut self, shared: bool, semaphores: bool) -> Self {
        self.shared = shared;
        self.semaphores = semaphores;
        self
    }

    /// Whether this backend takes `claim` (the exclusive lock always).
    pub const fn supports(&self, claim: &Claim) -> bool {
        match claim.mode() {
            crate::ClaimMode::Exclusive => true,
            crate::ClaimMode::Shared => self.shared,
            crate::ClaimMode::Permits => self.semaphores,
        }
    }

    /// The TTL a request for `ttl` gets: rounded up to [`min_ttl`](Self::min_ttl).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidTtl`] for zero or a TTL above [`max_ttl`](Self::max_ttl).
    pub fn effective_ttl(&self, ttl: Duration) -> Result<Duration, LockError> {
        if ttl.is_zero() {
            return Err(LockError::InvalidTtl {
                ttl,
                reason: "a lock needs a TTL above zero".into(),
            });
        }
        if ttl > self.max_ttl {
            return Err(LockError::InvalidTtl {
                ttl,
                reason: format!("this backend accepts TTLs up to {:?}", self.max_ttl),
            });
        }
        Ok(ttl.max(self.min_ttl))
    }
}
