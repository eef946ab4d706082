//! The narrow waist every driver implements.

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Serialize;

pub use crate::capabilities::{Capabilities, ClockSource, Fairness, FencingGuarantee};
pub use crate::hint::WaitHint;
use crate::notify::ReleaseNotifier;
use crate::{Claim, FencingToken, LockError, LockKey, Owner};

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

/// The answer to [`LockBackend::claim`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The owner holds the lock now.
    Acquired(Grant),
    /// Another owner holds it.
    Held(Contention),
}

/// The answer to [`LockBackend::claim_all`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetOutcome {
    /// The owner holds every key now: one grant per request, in order.
    Acquired(Vec<Grant>),
    /// Another owner holds the key of request `index`; nothing of the set was applied.
    Held {
        /// The position of the refused request in the set.
        index: usize,
        /// What the store said of that key.
        contention: Contention,
    },
}

/// The answer to one renewal of [`LockBackend::renew`].
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

/// What [`LockBackend::holders`] shows of each live lease. Never the owner token.
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

/// The most renewals the watchdog sends in one [`LockBackend::renew`] request; a backend
/// whose store takes fewer at once splits the batch itself.
pub const RENEWAL_BATCH: usize = 1024;

/// One claim as [`LockBackend::claim`] receives it: everything the store needs to decide.
///
/// Built with [`ClaimRequest::new`]; the fields are public to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimRequest<'a> {
    /// The key to claim.
    pub key: &'a LockKey,
    /// Who claims it.
    pub owner: &'a Owner,
    /// The lease to grant, from the start of the request (already rounded up to
    /// [`Capabilities::min_ttl`]).
    pub ttl: Duration,
    /// What the request takes of the key: the whole capacity for an exclusive lock.
    pub claim: Claim,
    /// How long the request has waited for the key, sent only to a backend that declares
    /// [`Fairness::Bounded`] and only once the request has waited
    /// [`STARVING_AFTER`](crate::driver::STARVING_AFTER). The store applies the rule of
    /// [`Fairness::Bounded`] in the same atomic step as the claim; `None`: the request
    /// makes no mark and displaces none.
    pub waited: Option<Duration>,
}

impl<'a> ClaimRequest<'a> {
    /// A claim of `claim` on `key` by `owner` for `ttl`, that has not waited.
    pub fn new(key: &'a LockKey, owner: &'a Owner, ttl: Duration, claim: Claim) -> Self {
        ClaimRequest {
            key,
            owner,
            ttl,
            claim,
            waited: None,
        }
    }

    /// An exclusive claim of `key`: the whole capacity.
    pub fn exclusive(key: &'a LockKey, owner: &'a Owner, ttl: Duration) -> Self {
        Self::new(key, owner, ttl, Claim::exclusive())
    }

    /// The same claim, by a request that has waited `waited` (see
    /// [`waited`](Self::waited)).
    pub fn waited(mut self, waited: Duration) -> Self {
        self.waited = Some(waited);
        self
    }
}

/// One lease to renew in [`LockBackend::renew`].
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

/// The atomic operations a store must provide; everything else (waiting, deadlines,
/// renewal, reentrancy, cancellation, lost-lock signalling, the single-key conveniences of
/// [`LockBackendExt`]) lives once in lockcore.
///
/// Each operation is atomic in the store and **idempotent per owner**: a request whose
/// answer was lost can be sent again, or compensated with [`release`](Self::release), with
/// the same owner. Keys arrive validated; a backend must still treat them as data. What an
/// operation depends on is in its arguments: nothing is passed beside them.
///
/// Object-safe: clients hold an `Arc<dyn LockBackend>`. A third-party backend proves itself
/// with the `conformance-tests` crate (see `docs/writing-a-driver.md`).
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// A short name for errors and logs (`"redis"`, `"postgres"`, …).
    fn name(&self) -> &'static str;

    /// What this backend can do.
    fn capabilities(&self) -> Capabilities;

    /// Takes `request.claim` of `request.key` for `request.owner` (see [`Claim`]): granted
    /// when the weights of the other owners' live leases, plus the claim's weight, plus
    /// another owner's live reservation, fit the capacity ([`Claim::fits`]); a refused
    /// claim records a reservation as [`Claim::fits`] describes. An exclusive claim takes
    /// the whole capacity, so it is granted only on a key without other owners' leases.
    ///
    /// If the owner already holds a lease on the key, the claim succeeds again with that
    /// lease's token, never shortening its expiry. Every grant, whatever its mode, takes
    /// the key's next fencing token. A claim whose capacity differs from the one stored with
    /// the key is [`LockError::capacity_mismatch`]. A refusal tells the holders' remaining
    /// TTL when known, and what [`wait_released`](Self::wait_released) needs
    /// ([`WaitHint`]).
    ///
    /// lockcore sends only claims the backend's [`Capabilities`] declare; a backend answers
    /// any other with [`LockError::claims_unsupported`].
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError>;

    /// Takes every claim of `requests` in one atomic step of the store, or none of them:
    /// [`SetOutcome::Acquired`] with one grant per request, in order, or
    /// [`SetOutcome::Held`] naming the first request refused, with nothing of the set
    /// applied (no lease, no reservation, no queue place). Each key is decided by the rule
    /// of [`claim`](Self::claim) (a same-owner re-grant keeps its token; every new grant
    /// takes its key's next token); a refusal makes no reservation.
    ///
    /// lockcore sends it only for a fresh owner, with the requests sorted by key, each key
    /// once, and the same owner, TTL and claim in all of them. `Ok(None)` says this store
    /// cannot take this set in one step (the default, and Redis Cluster for keys in
    /// different slots): lockcore then takes the keys one by one, in that order, as it
    /// does for a backend without this operation.
    async fn claim_all(
        &self,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Option<SetOutcome>, LockError> {
        let _ = requests;
        Ok(None)
    }

    /// Frees `owner`'s lease on `key`, whatever its mode; [`ReleaseOutcome::NotHeld`] if it
    /// holds none. Never frees another owner's lease.
    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError>;

    /// Renews each lease to its TTL from now (never shortening it) in as few requests as
    /// the store allows: the watchdog sends every renewal due at the same moment on the
    /// same backend through here, at most [`RENEWAL_BATCH`] at once. A renewal answers
    /// [`ExtendOutcome::NotHeld`] for a lease that was lost, for itself alone, and never
    /// creates a key: a lease released while the batch is in flight is not re-created.
    ///
    /// Answers one outcome per renewal, in order. `Err` is a failure of the whole request
    /// (every renewal in it failed); an `Err` inside the list is one renewal's own failure.
    /// A store without a batch operation can answer with [`renew_each`].
    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError>;

    /// Every live lease on `key`, in grant order (tokens ascending); empty if it is free.
    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError>;

    /// Resolves when `key` is probably free, or after `max_wait`.
    ///
    /// Subscribes first, then re-checks the key, so a release between the refused claim
    /// and the subscription is never slept through. Spurious wake-ups are allowed; the
    /// caller claims again either way. `place` is the waiter's place in this process's line
    /// for the key (lower is earlier): a backend with a [`ReleaseNotifier`] subscribes with
    /// it, so that waiters are woken in that order.
    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError>;

    /// `owner` was refused and has given up waiting (deadline, cancellation, error)
    /// without acquiring: a backend that keeps something for a waiter in the store (a
    /// queue place, a reservation of [`Claim::fits`], a mark of [`Fairness::Bounded`])
    /// removes it here. It may find nothing to remove. The default does nothing.
    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        let _ = (key, owner);
        Ok(())
    }

    /// Frees `key` whoever holds it (every lease, and any reservation): an operator's
    /// break-lock. The holder is not told and may still be running; only fencing tokens
    /// protect the resource then.
    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError>;

    /// The notifier this backend's [`wait_released`](Self::wait_released) subscribes with,
    /// if it has one: lockcore wakes the next waiter of this process through it when a
    /// release left room for more than the waiter it woke (a shared grant, a refusal by
    /// another waiter's reservation). The default has none.
    fn notifier(&self) -> Option<&ReleaseNotifier> {
        None
    }

    /// Closes connections and background tasks. The default does nothing.
    async fn shutdown(&self) {}
}

/// How many renewals [`renew_each`] sends at once.
const RENEW_EACH_CONCURRENCY: usize = 16;

/// Renews each lease with its own request, 16 at once, for a store without a batch
/// operation: `renew_one` is the store's renewal of one lease.
///
/// # Errors
///
/// None of its own: each renewal's error is its entry in the list.
pub async fn renew_each<'r, F, Fut>(
    renewals: &'r [Renewal<'r>],
    renew_one: F,
) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError>
where
    F: Fn(&'r Renewal<'r>) -> Fut,
    Fut: std::future::Future<Output = Result<ExtendOutcome, LockError>>,
{
    let mut outcomes = Vec::with_capacity(renewals.len());
    for chunk in renewals.chunks(RENEW_EACH_CONCURRENCY) {
        outcomes.extend(futures_util::future::join_all(chunk.iter().map(&renew_one)).await);
    }
    Ok(outcomes)
}

/// The single-key conveniences, built on [`LockBackend`]'s operations for every backend,
/// so no driver can wire them differently. For tests and tools that talk to a backend
/// directly; applications use [`LockClient`](crate::LockClient).
#[async_trait]
pub trait LockBackendExt: LockBackend {
    /// [`claim`](LockBackend::claim) of the whole capacity: the exclusive lock.
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        self.claim(&ClaimRequest::exclusive(key, owner, ttl)).await
    }

    /// [`claim`](LockBackend::claim) of `claim`.
    async fn try_claim(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
        claim: Claim,
    ) -> Result<AcquireOutcome, LockError> {
        self.claim(&ClaimRequest::new(key, owner, ttl, claim)).await
    }

    /// [`renew`](LockBackend::renew) of one lease.
    async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let mut outcomes = self.renew(&[Renewal::new(key, owner, ttl)]).await?;
        let answered = outcomes.len();
        match outcomes.pop() {
            Some(outcome) if answered == 1 => outcome,
            _ => Err(LockError::backend(
                self.name(),
                format!("a renewal of one lease was answered with {answered} outcomes"),
            )),
        }
    }

    /// The newest live lease on `key` ([`holders`](LockBackend::holders)' last), or `None`
    /// if it is free.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        Ok(self.holders(key).await?.pop())
    }
}

impl<B: LockBackend + ?Sized> LockBackendExt for B {}
