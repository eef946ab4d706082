//! The narrow waist every driver implements.

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Serialize;

pub use crate::hint::WaitHint;
use crate::{Claim, FencingToken, LockError, LockKey, Owner};

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
    /// The store orders only the waiters that have waited long: a request refused for
    /// [`STARVING_AFTER`](crate::STARVING_AFTER) or more marks the key as its next turn
    /// ([`starving_for`](crate::starving_for)), and the earliest-arrived of them is
    /// served before anyone else asks (the rule is under
    /// [`starving_for`](crate::starving_for)). A
    /// releasing process asking again at once no longer wins every time: a waiter is
    /// bypassed by at most a few grants once it is the longest waiting.
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
}

/// What a backend can do, declared once and checked by lockcore and the conformance suite.
///
/// Built with `const fn`s so drivers can declare it as a constant:
///
/// ```
/// use std::time::Duration;
/// use lockcore::{Capabilities, FencingGuarantee};
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
    /// Whether [`LockBackend::try_claim`] takes shared claims of a read-write key
    /// ([`Claim::shared`]) besides the exclusive lock.
    pub shared: bool,
    /// Whether [`LockBackend::try_claim`] takes semaphore permits ([`Claim::permits`]).
    pub semaphores: bool,
    /// Whether [`LockBackend::extend_many`] renews a batch in a fixed number of requests
    /// (one or two per [`RENEWAL_BATCH`]) rather than one request per renewal.
    pub batched_renewals: bool,
    /// Whether [`LockBackend::release_and_claim`] hands a released lease's room to the next
    /// claim in one request to the store, rather than the default's two. lockcore then
    /// hands a shared or permit hold released by one of a client's requests straight to the
    /// client's next waiting request for the same claim.
    pub hand_over: bool,
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
            hand_over: false,
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

    /// Sets [`hand_over`](Self::hand_over).
    pub const fn with_hand_over(mut self, hand_over: bool) -> Self {
        self.hand_over = hand_over;
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

/// What the store applied when it granted (or re-granted) a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Grant {
    /// The holder's fencing token (the same token on a same-owner re-grant).
    pub token: FencingToken,
    /// The TTL the store applied, counted from the start of the request.
    pub ttl: Duration,
    /// A tighter validity the backend computed itself (Redlock: `ttl − elapsed − drift`).
    pub valid_until: Option<Instant>,
}

impl Grant {
    /// A grant of `token` for `ttl`.
    pub fn new(token: FencingToken, ttl: Duration) -> Self {
        Grant {
            token,
            ttl,
            valid_until: None,
        }
    }

    /// Caps the lease's validity at `valid_until`.
    pub fn with_valid_until(mut self, valid_until: Instant) -> Self {
        self.valid_until = Some(valid_until);
        self
    }
}

/// Another owner holds the lock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Contention {
    /// The holder's remaining TTL, when the store told it.
    pub remaining_ttl: Option<Duration>,
    /// What [`LockBackend::wait_released`] should wait from.
    pub hint: WaitHint,
}

impl Contention {
    /// Contention with the holder's remaining TTL, if known.
    pub fn new(remaining_ttl: Option<Duration>) -> Self {
        Contention {
            remaining_ttl,
            hint: WaitHint::none(),
        }
    }

    /// Attaches a [`WaitHint`].
    pub fn with_hint(mut self, hint: WaitHint) -> Self {
        self.hint = hint;
        self
    }
}

/// The answer to [`LockBackend::try_acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The owner holds the lock now.
    Acquired(Grant),
    /// Another owner holds it.
    Held(Contention),
}

/// The answer to [`LockBackend::extend`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtendOutcome {
    /// The lease was renewed; the [`Grant`] carries the token and the TTL applied.
    Extended(Grant),
    /// The owner does not hold the lock: it expired or was taken over.
    NotHeld,
}

/// What a release did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ReleaseOutcome {
    /// The store freed the lock.
    Released,
    /// The owner did not hold it (expired, taken over, or already released); nothing was freed.
    NotHeld,
    /// A reentrant hold was counted down; the lock stays held by the remaining holds.
    StillHeld {
        /// Holds left on this (key, owner).
        holds: usize,
    },
}

/// What [`LockBackend::inspect`] shows of a held lock (and [`LockBackend::inspect_all`] of
/// each live lease). Never the owner token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LockInfo {
    /// The holder's public label.
    pub holder: String,
    /// The holder's fencing token.
    pub token: FencingToken,
    /// Time left on the lease, when the store tells it.
    pub remaining_ttl: Option<Duration>,
    /// What the lease takes of the key (exclusive for a plain lock).
    pub claim: Claim,
}

impl LockInfo {
    /// Describes a held lock.
    pub fn new(
        holder: impl Into<String>,
        token: FencingToken,
        remaining_ttl: Option<Duration>,
    ) -> Self {
        LockInfo {
            holder: holder.into(),
            token,
            remaining_ttl,
            claim: Claim::exclusive(),
        }
    }

    /// Sets what the lease takes of the key.
    pub fn with_claim(mut self, claim: Claim) -> Self {
        self.claim = claim;
        self
    }
}

/// The most renewals the watchdog sends in one [`LockBackend::extend_many`] request; a
/// backend whose store takes fewer at once splits the batch itself.
pub const RENEWAL_BATCH: usize = 1024;

/// How many renewals the default [`LockBackend::extend_many`] sends at once.
const DEFAULT_BATCH_CONCURRENCY: usize = 16;

/// One lease to renew in [`LockBackend::extend_many`]: what [`LockBackend::extend`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Renewal<'a> {
    /// The key held.
    pub key: &'a LockKey,
    /// Its owner.
    pub owner: &'a Owner,
    /// The TTL to renew the lease to, from now.
    pub ttl: Duration,
}

impl<'a> Renewal<'a> {
    /// A renewal of `owner`'s lease on `key` to `ttl`.
    pub fn new(key: &'a LockKey, owner: &'a Owner, ttl: Duration) -> Self {
        Renewal { key, owner, ttl }
    }
}

/// A hand-over in two requests, the default of [`LockBackend::release_and_claim`], for an
/// override to fall back on where it cannot do both in one (an override cannot call the
/// trait's default): `backend`'s `release` of `owner`'s hold, then `next`'s `try_claim`.
///
/// # Errors
///
/// The release's error, without claiming; the claim's own is the inner result.
pub async fn release_then_claim<B: LockBackend + ?Sized>(
    backend: &B,
    key: &LockKey,
    owner: &Owner,
    next: &Owner,
    ttl: Duration,
    claim: Claim,
) -> Result<(ReleaseOutcome, Result<AcquireOutcome, LockError>), LockError> {
    let released = backend.release(key, owner).await?;
    Ok((released, backend.try_claim(key, next, ttl, claim).await))
}

/// The atomic operations a store must provide; everything else (waiting, deadlines,
/// renewal, reentrancy, cancellation, lost-lock signalling) lives once in
/// [`LockClient`](crate::LockClient).
///
/// Each operation is atomic in the store and **idempotent per owner**: a request whose
/// answer was lost can be sent again, or compensated with [`release`](Self::release), with
/// the same owner. Keys arrive validated; a backend must still treat them as data.
///
/// Object-safe: clients hold an `Arc<dyn LockBackend>`. A third-party backend proves itself
/// with the `conformance-tests` crate (see `docs/writing-a-driver.md`).
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// A short name for errors and logs (`"redis"`, `"postgres"`, …).
    fn name(&self) -> &'static str;

    /// What this backend can do.
    fn capabilities(&self) -> Capabilities;

    /// Takes the lock if it is free or expired. If `owner` already holds it, succeeds again
    /// with the same token without shortening the expiry. Otherwise reports the holder's
    /// remaining TTL when known.
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError>;

    /// Frees the lock if `owner` holds it; [`ReleaseOutcome::NotHeld`] otherwise. Never frees
    /// another owner's lock.
    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError>;

    /// Renews `owner`'s lease to `ttl` from now (never shortening it);
    /// [`ExtendOutcome::NotHeld`] if it was lost. Never creates the key.
    async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError>;

    /// Renews many leases in as few requests as the store allows: the watchdog sends every
    /// renewal due at the same moment on the same backend through here, at most
    /// [`RENEWAL_BATCH`] at once. Each renewal means exactly what [`extend`](Self::extend)
    /// means for it, whatever else is in the batch: one lost lease answers
    /// [`ExtendOutcome::NotHeld`] for itself alone, and a lease released while the batch is
    /// in flight is never re-created.
    ///
    /// Answers one outcome per renewal, in order. `Err` is a failure of the whole request
    /// (every renewal in it failed); an `Err` inside the list is one renewal's own failure.
    /// The default sends [`extend`](Self::extend) for each renewal, 16 at once, so a
    /// driver without a batch operation keeps working (the watchdog sends such a backend
    /// its renewals one by one anyway, spread out as the holds were taken).
    ///
    /// # Errors
    ///
    /// Whatever [`extend`](Self::extend) reports, for the whole batch or for one renewal.
    async fn extend_many(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        let mut outcomes = Vec::with_capacity(renewals.len());
        for chunk in renewals.chunks(DEFAULT_BATCH_CONCURRENCY) {
            let sent = chunk.iter().map(|r| self.extend(r.key, r.owner, r.ttl));
            outcomes.extend(futures_util::future::join_all(sent).await);
        }
        Ok(outcomes)
    }

    /// The holder of `key`, or `None` if it is free. A key held by shared claims shows one
    /// of its leases (the newest); [`inspect_all`](Self::inspect_all) lists them all.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError>;

    /// Takes `claim` on `key` (see [`Claim`]): granted when the weights of the other
    /// owners' live leases, plus `claim`'s weight, plus another owner's live reservation,
    /// fit the capacity ([`Claim::fits`]); a refused claim records a reservation as
    /// [`Claim::fits`] describes. The same idempotency as [`try_acquire`](Self::try_acquire):
    /// a claim by an owner that already holds a lease on the key succeeds again with that
    /// lease's token, never shortening it. Every grant, whatever its mode, takes the key's
    /// next fencing token. A claim whose capacity differs from the one stored with the key
    /// is [`LockError::capacity_mismatch`]. [`release`](Self::release),
    /// [`extend`](Self::extend) and [`abandon`](Self::abandon) find the lease by (key, owner)
    /// whatever its mode; [`try_acquire`](Self::try_acquire) is the exclusive claim and must
    /// respect shared leases and reservations on a backend that declares
    /// [`Capabilities::shared`] or [`Capabilities::semaphores`].
    ///
    /// lockcore sends only claims the backend's [`Capabilities`] declare, and sends
    /// exclusive claims to [`try_acquire`](Self::try_acquire). The default answers an
    /// exclusive claim with `try_acquire` and any other with
    /// [`LockError::claims_unsupported`].
    async fn try_claim(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
        claim: Claim,
    ) -> Result<AcquireOutcome, LockError> {
        if claim.is_exclusive() {
            self.try_acquire(key, owner, ttl).await
        } else {
            Err(LockError::claims_unsupported(self.name(), &claim))
        }
    }

    /// Releases `owner`'s hold of `key` as [`release`](Self::release) does, then tries
    /// `next`'s `claim` as [`try_claim`](Self::try_claim) does: a hand-over from one holder
    /// to a waiter of the same process, which never leaves the room free between the two.
    ///
    /// The two are not one transaction: the claim is decided after the release exactly as a
    /// claim sent right after it would be (reservations, marks and other owners' claims
    /// respected). A backend that declares [`Capabilities::hand_over`] does both in one
    /// request to the store; lockcore calls this only on such a backend, only for claims
    /// that are not exclusive, and only for an owner other than `owner`.
    ///
    /// # Errors
    ///
    /// The outer error means neither answer came (either may have been applied): lockcore
    /// then releases again by owner and `next` claims again, both idempotent. The inner
    /// result is the claim's own, as `try_claim` answers it. The default is
    /// [`release_then_claim`]: `release`, then `try_claim`.
    async fn release_and_claim(
        &self,
        key: &LockKey,
        owner: &Owner,
        next: &Owner,
        ttl: Duration,
        claim: Claim,
    ) -> Result<(ReleaseOutcome, Result<AcquireOutcome, LockError>), LockError> {
        release_then_claim(self, key, owner, next, ttl, claim).await
    }

    /// Every live lease on `key`, in grant order (tokens ascending); empty if it is free.
    /// The default lists what [`inspect`](Self::inspect) shows.
    async fn inspect_all(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        Ok(self.inspect(key).await?.into_iter().collect())
    }

    /// Resolves when `key` is probably free, or after `max_wait`.
    ///
    /// Subscribes first, then re-checks the key, so a release between the failed attempt
    /// and the subscription is never slept through. Spurious wake-ups are allowed; the
    /// caller tries again either way.
    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError>;

    /// Frees `key` whoever holds it (every lease, and any reservation): an operator's
    /// break-lock. The holder is not told and
    /// may still be running; only fencing tokens protect the resource then.
    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError>;

    /// `owner` was told the lock is held and has given up waiting for it (deadline,
    /// cancellation, error) without acquiring it. A backend that queues waiters in the store
    /// (FIFO fairness) removes `owner`'s place in the queue here, so it does not block the
    /// queue until its lease runs out; a backend with shared claims removes `owner`'s
    /// reservation ([`Claim::fits`]). Called in the background when a request gives up, and
    /// in line when a refused request queues behind another request of its client (which
    /// its reservation could hold back; as the head it claims again). It may find nothing
    /// to remove. The default does nothing.
    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        let _ = (key, owner);
        Ok(())
    }

    /// A waiter of this process was just granted a shared or permit claim on `key`: wake
    /// the next waiter of the key in this process, which may fit too. A release wakes one
    /// waiter per process; each shared grant passes the wake-up on, so a release that frees
    /// room for many wakes as many as fit, not every waiter at once. A backend with a
    /// [`ReleaseNotifier`](crate::ReleaseNotifier) calls its
    /// [`notify_one`](crate::ReleaseNotifier::notify_one); the default does nothing.
    fn wake_next(&self, key: &LockKey) {
        let _ = key;
    }

    /// Closes connections and background tasks. The default does nothing.
    async fn shutdown(&self) {}
}
