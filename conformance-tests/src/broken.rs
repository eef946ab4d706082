//! Deliberately broken backends: each breaks one promise of the contract, so the suite's
//! self-test can show which scenarios catch it. A scenario no broken backend can fail is a
//! scenario to strengthen.

mod claims;
mod client_side;
mod leases;
mod tokens;

pub use client_side::BrokenStore;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lockcore::driver::{
    AcquireOutcome, Capabilities, ClaimRequest, Contention, ExtendOutcome, Fairness, Grant,
    LockBackendExt, ReleaseNotifier, Renewal, SetOutcome, WaitHint,
};
use lockcore::memory::MemoryBackend;
use lockcore::{
    Claim, ClaimMode, FencingToken, LockBackend, LockError, LockInfo, LockKey, Owner,
    ReleaseOutcome,
};

/// Which promise a [`Broken`] backend breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Breakage {
    /// Grants the lock to every caller, taking it from the holder.
    GrantsEveryone,
    /// Release frees the lock whoever asks.
    ReleaseIgnoresOwner,
    /// Every holder gets token 1.
    TokensDoNotIncrease,
    /// Locks stay held long after their TTL (the TTL is ignored).
    NeverExpires,
    /// Declares release notifications but never sends one: waiters sleep until timeouts.
    NotificationsNeverFire,
    /// Applies an acquisition, then loses its answer (the caller sees an error).
    AcquireAnswerLost,
    /// Extend reports success whoever holds the key (a live lease is taken as proof).
    ExtendIgnoresOwner,
    /// Inspect shows the owner token as the holder's label.
    InspectShowsOwnerToken,
    /// Release answers `Released` but leaves the lock in place (until its TTL).
    ReleaseDoesNothing,
    /// Extend of a key nobody holds creates it for the caller (a renewal resurrects a lock).
    ExtendCreates,
    /// A semaphore of `n` permits lets `n + 1` out (and shows `n` everywhere).
    SemaphoreAdmitsOneMore,
    /// Shared claims ignore an exclusive lease: readers get in while a writer holds the key
    /// (a writer still waits for readers).
    ReadersIgnoreWriter,
    /// A refused claim leaves no reservation: a writer waits for ever behind a stream of
    /// overlapping readers.
    ReservationsNeverKept,
    /// A claim whose capacity differs from the key's is granted as a claim of the key's
    /// own kind (a semaphore of 4 on a semaphore of 8 takes permits of the 8, a lock on a
    /// semaphore takes all its permits) instead of refused.
    CapacityMismatchGranted,
    /// A shared grant does not pass the wake-up on (the backend shows lockcore no
    /// [`notifier`](LockBackend::notifier) to pass it on with): a release wakes one waiting
    /// reader per process, the others sleep until their timeouts.
    SharedGrantWakesNobody,
    /// Extend sets the TTL it is given, shortening a longer remaining lease.
    ExtendShortens,
    /// A same-owner re-grant sets the TTL it is given, shortening a longer remaining lease.
    RegrantShortens,
    /// A same-owner re-grant is a new grant: the holder's lease gets the key's next token
    /// (what a Redlock re-grant did when a copy granted late, not written back yet, was among
    /// its first answers).
    RegrantNewToken,
    /// An acquisition takes the key's next token at its first attempt, then writes the lock
    /// with it when an attempt gets in (an INCR, then SET NX retried until it succeeds): a
    /// holder that came in between has a higher token than the slow acquisition.
    TokenBeforeLock,
    /// A `claim` of a held key waits until it is free (a blocking lock call) instead of
    /// answering "held".
    TryAcquireBlocks,
    /// The first claim of a key the store has no record of answers "held" by nobody (a
    /// driver that takes a missing row for contention, say): a process alone on a fresh
    /// key is refused.
    NewKeyRefused,
    /// The store applies a quarter less than the TTL the grant reports (an expiry rounded
    /// down, or counted from an earlier instant than the request's start).
    GrantOverstatesTtl,
    /// Release frees the lock but answers `NotHeld` (the deleted count read the wrong way).
    ReleaseAnswersNotHeld,
    /// Tokens come from a per-key counter of the store with no floor: a restarted store
    /// hands out 1, 2, … again.
    CounterRestarts,
    /// TTLs are stored and reported rounded down to a 10 ms tick: a request at the
    /// minimum TTL gets none.
    TtlRoundedDown,
    /// Keys are stored truncated to 16 bytes (a column too short): keys that share their
    /// first 16 bytes are one lock.
    KeysTruncated,
    /// A client that cannot reach the store answers "held by another" (any failure of the
    /// acquire taken for contention). A breakage of the client side: see [`BrokenStore`].
    UnreachableLooksHeld,
    /// Extend answers from a lease the store keeps beside the lock record: while that lease
    /// lives, a renewal succeeds even though the record was deleted (an etcd keep-alive, or
    /// a session's liveness, taken as proof that the key is still ours).
    ExtendTrustsLease,
    /// Writes each expiry by the UTC clock and judges it by the local time of the store's
    /// sessions (`NOW()` where `UTC_TIMESTAMP()` was meant): in a zone ahead of UTC every
    /// lock expires at once, behind it locks outlive their TTL by hours.
    ExpiryOnLocalClock,
    /// After a restart that kept the store's data, every call fails as a script the store
    /// forgot would (`NOSCRIPT`): a driver that never reloads what a restarted store lost
    /// (scripts, prepared statements, a session) and never reconnects.
    ForgetsAfterRestart,
    /// Knows its holder by the record's modification revision seen at the grant (etcd's
    /// `mod_revision`, a row version) and shows that revision in the token: the same
    /// content written again by another program makes the holder's extend answer
    /// `NotHeld` and moves the token inspect reports.
    HolderByRevision,
    /// Declares FIFO fairness ([`Fairness::Fifo`]) but keeps no
    /// order: after a release, whoever asks first gets the key (the memory store, never
    /// told how long a request waited).
    ClaimsFifo,
    /// Declares bounded fairness ([`Fairness::Bounded`], as the memory store does) but never
    /// reads how long a request waited ([`ClaimRequest::waited`]), so it keeps no marks:
    /// after a release, whoever asks first gets the key.
    MarksIgnored,
    /// Renews a batch as one unit: when one renewal of a batch finds its lease gone, every
    /// renewal of the batch answers `NotHeld`.
    BatchAllOrNothing,
    /// Answers a batch's outcomes in another order than its renewals (as a driver that
    /// reads a store's unordered answer by position).
    BatchOutOfOrder,
    /// A batch renewal re-grants a lease it finds gone (an upsert in the batch statement),
    /// although a renewal alone does not.
    BatchRecreates,
    /// A batch of more than 500 renewals fails as a whole (a statement over a store's limit
    /// on compound terms, as SQLite's).
    BatchCapped,
    /// Renews through one lease shared by every hold of the client (a session's lease): a
    /// batch renewal also extends every other hold this backend granted, renewed or not.
    BatchCarriesEveryHold,
    /// Renews a batch's shared leases by a second path (as a SQL driver renews leases in
    /// their own table) and puts their answers back in another order among the leases'
    /// places; the locks' answers stay where they were.
    BatchLeasesMisplaced,
    /// Opens a connection that was cut inside the request that needs it, so a renewal that
    /// gives up (it may wait a quarter of the TTL) takes the half-open connection down with
    /// it and the next one starts over: once connections open slower than that, nothing
    /// gets through. The store itself is not broken: the self-test's fault store gives this
    /// breakage links that reconnect this way
    /// ([`InProcessStore::with_reconnects_in_the_call`](crate::layer::InProcessStore::with_reconnects_in_the_call)).
    ReconnectsInTheCall,
    /// A batch renews a shared lease it finds lapsed while other leases keep the key
    /// read-locked (it asks whether the key is read-locked, not whether this owner's lease
    /// lives), answering `Extended` to a reader whose lease had ended.
    LapsedLeaseRenewed,
    /// Takes a set of keys in one request ([`LockBackend::claim_all`]) key by key inside
    /// the store, and answers a refused key without undoing the keys granted before it:
    /// a refused set leaves part of itself held.
    SetsPartly,
}

impl Breakage {
    /// Every breakage.
    pub const ALL: [Breakage; 42] = [
        Breakage::GrantsEveryone,
        Breakage::ReleaseIgnoresOwner,
        Breakage::TokensDoNotIncrease,
        Breakage::NeverExpires,
        Breakage::NotificationsNeverFire,
        Breakage::AcquireAnswerLost,
        Breakage::ExtendIgnoresOwner,
        Breakage::InspectShowsOwnerToken,
        Breakage::ReleaseDoesNothing,
        Breakage::ExtendCreates,
        Breakage::SemaphoreAdmitsOneMore,
        Breakage::ReadersIgnoreWriter,
        Breakage::ReservationsNeverKept,
        Breakage::CapacityMismatchGranted,
        Breakage::SharedGrantWakesNobody,
        Breakage::ExtendShortens,
        Breakage::RegrantShortens,
        Breakage::RegrantNewToken,
        Breakage::TokenBeforeLock,
        Breakage::TryAcquireBlocks,
        Breakage::NewKeyRefused,
        Breakage::GrantOverstatesTtl,
        Breakage::ReleaseAnswersNotHeld,
        Breakage::CounterRestarts,
        Breakage::TtlRoundedDown,
        Breakage::KeysTruncated,
        Breakage::UnreachableLooksHeld,
        Breakage::ExtendTrustsLease,
        Breakage::ExpiryOnLocalClock,
        Breakage::ForgetsAfterRestart,
        Breakage::HolderByRevision,
        Breakage::ClaimsFifo,
        Breakage::MarksIgnored,
        Breakage::BatchAllOrNothing,
        Breakage::BatchOutOfOrder,
        Breakage::BatchRecreates,
        Breakage::BatchCapped,
        Breakage::BatchCarriesEveryHold,
        Breakage::BatchLeasesMisplaced,
        Breakage::ReconnectsInTheCall,
        Breakage::LapsedLeaseRenewed,
        Breakage::SetsPartly,
    ];
}

/// A [`MemoryBackend`] with one [`Breakage`]. It declares what the memory backend declares
/// (shared claims and semaphores included), and every breakage applies to every kind of
/// claim.
#[derive(Debug)]
pub struct Broken {
    inner: Arc<MemoryBackend>,
    breakage: Breakage,
    owners: Mutex<HashMap<LockKey, String>>,
    tokens: Mutex<tokens::Tokens>,
    leases: Mutex<leases::Leases>,
    zone: Arc<AtomicI32>,
    restarts: Arc<AtomicU64>,
    /// How often records were written again behind the driver's back.
    rewrites: Arc<AtomicU64>,
    /// [`Breakage::HolderByRevision`]: the rewrites counted when each key was granted.
    revisions: Mutex<HashMap<LockKey, u64>>,
    /// [`Breakage::BatchCarriesEveryHold`]: every hold granted.
    granted: Mutex<Vec<(LockKey, Owner)>>,
    /// [`Breakage::NewKeyRefused`]: the keys claimed so far.
    seen: Mutex<HashSet<LockKey>>,
}

impl Broken {
    /// Wraps `inner` (share one inner store between several `Broken` to get several clients).
    pub fn new(inner: Arc<MemoryBackend>, breakage: Breakage) -> Self {
        Broken {
            inner,
            breakage,
            owners: Mutex::default(),
            tokens: Mutex::default(),
            leases: Mutex::default(),
            zone: Arc::default(),
            restarts: Arc::default(),
            rewrites: Arc::default(),
            revisions: Mutex::default(),
            granted: Mutex::default(),
            seen: Mutex::default(),
        }
    }

    /// Reads how often its records were written again with the same content from
    /// `rewrites`, which
    /// [`InProcessStore::with_rewrite_count`](crate::layer::InProcessStore::with_rewrite_count)
    /// counts.
    pub fn with_rewrite_count(mut self, rewrites: Arc<AtomicU64>) -> Self {
        self.rewrites = rewrites;
        self
    }

    /// The revision of `key`'s record now, as [`Breakage::HolderByRevision`] counts it.
    fn revision(&self) -> u64 {
        self.rewrites.load(Ordering::SeqCst)
    }

    fn revisions(&self) -> std::sync::MutexGuard<'_, HashMap<LockKey, u64>> {
        self.revisions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads how often its store restarted keeping its data from `restarts`, which
    /// [`InProcessStore::with_restart_count`](crate::layer::InProcessStore::with_restart_count)
    /// counts.
    pub fn with_restart_count(mut self, restarts: Arc<AtomicU64>) -> Self {
        self.restarts = restarts;
        self
    }

    /// The error of every call of [`Breakage::ForgetsAfterRestart`] once the store restarted.
    fn forgotten(&self) -> Result<(), LockError> {
        if self.breakage == Breakage::ForgetsAfterRestart
            && self.restarts.load(Ordering::SeqCst) > 0
        {
            return Err(LockError::backend(
                "broken-memory",
                "NOSCRIPT No matching script. Please use EVAL.",
            ));
        }
        Ok(())
    }

    /// Reads its sessions' time zone (minutes east of UTC) from `zone`, which
    /// [`InProcessStore::with_time_zone`](crate::layer::InProcessStore::with_time_zone)
    /// sets.
    pub fn with_time_zone(mut self, zone: Arc<AtomicI32>) -> Self {
        self.zone = zone;
        self
    }

    /// The TTL a store that judges expiry by its sessions' local time effectively applies
    /// when asked for `ttl`.
    fn local_clock_ttl(&self, ttl: Duration) -> Duration {
        let minutes = self.zone.load(Ordering::SeqCst);
        let shift = Duration::from_secs(u64::from(minutes.unsigned_abs()) * 60);
        if minutes >= 0 {
            ttl.saturating_sub(shift).max(Duration::from_millis(1))
        } else {
            ttl + shift
        }
    }

    /// `claim` as the inner store takes it, from a request that has waited `waited` (see
    /// [`ClaimRequest::waited`]).
    async fn inner_claim(
        &self,
        waited: Option<Duration>,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
        claim: Claim,
    ) -> Result<AcquireOutcome, LockError> {
        claims::take(&self.inner, waited, key, owner, ttl, claim).await
    }

    fn tokens(&self) -> std::sync::MutexGuard<'_, tokens::Tokens> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, leases::Leases> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `key` as the store keeps it.
    fn stored(&self, key: &LockKey) -> LockKey {
        if self.breakage != Breakage::KeysTruncated || key.as_str().len() <= KEY_BYTES {
            return key.clone();
        }
        let s = key.as_str();
        let mut end = KEY_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        LockKey::new(&s[..end]).unwrap_or_else(|_| key.clone())
    }

    /// The token shown for an inner grant of `key`.
    fn shown_token(&self, key: &LockKey, token: FencingToken) -> FencingToken {
        self.tokens().shown(key, token).unwrap_or(token)
    }

    /// Every claim, whatever its mode, with the breakage applied, its token as shown.
    async fn shown_claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        self.forgotten()?;
        let key = &self.stored(request.key);
        let (owner, ttl, claim) = (request.owner, request.ttl, request.claim);
        let outcome = self.broken_claim(request.waited, key, owner, ttl, claim);
        Ok(match outcome.await? {
            AcquireOutcome::Acquired(g) => {
                AcquireOutcome::Acquired(Grant::new(self.shown_token(key, g.token), g.ttl))
            }
            held => held,
        })
    }

    async fn broken_claim(
        &self,
        waited: Option<Duration>,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
        claim: Claim,
    ) -> Result<AcquireOutcome, LockError> {
        match self.breakage {
            Breakage::GrantsEveryone => {
                if let AcquireOutcome::Held(_) =
                    self.inner_claim(waited, key, owner, ttl, claim).await?
                {
                    self.inner.force_release(key).await?;
                }
                self.inner_claim(waited, key, owner, ttl, claim).await
            }
            Breakage::TokensDoNotIncrease => Ok(
                match self.inner_claim(waited, key, owner, ttl, claim).await? {
                    AcquireOutcome::Acquired(g) => {
                        AcquireOutcome::Acquired(Grant::new(FencingToken(1), g.ttl))
                    }
                    held => held,
                },
            ),
            Breakage::NeverExpires => Ok(
                match self.inner_claim(waited, key, owner, FOREVER, claim).await? {
                    AcquireOutcome::Acquired(g) => {
                        AcquireOutcome::Acquired(Grant::new(g.token, ttl))
                    }
                    held => held,
                },
            ),
            Breakage::AcquireAnswerLost => {
                self.inner_claim(waited, key, owner, ttl, claim).await?;
                Err(LockError::unavailable(
                    "broken-memory",
                    "the answer was lost",
                ))
            }
            Breakage::InspectShowsOwnerToken => {
                let outcome = self.inner_claim(waited, key, owner, ttl, claim).await?;
                if let AcquireOutcome::Acquired(_) = outcome {
                    let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
                    owners.insert(key.clone(), owner.token().to_hex());
                }
                Ok(outcome)
            }
            Breakage::SemaphoreAdmitsOneMore => {
                claims::admit_one_more(&self.inner, waited, key, owner, ttl, claim).await
            }
            Breakage::ReadersIgnoreWriter => {
                claims::readers_ignore_writer(&self.inner, waited, key, owner, ttl, claim).await
            }
            Breakage::ClaimsFifo | Breakage::MarksIgnored => {
                // A mark the store made for a long wait is dropped at once: as a store that
                // never reads how long the request waited (no task switch in between, so
                // whoever asks first after a release wins, every time).
                let outcome = self.inner_claim(waited, key, owner, ttl, claim).await?;
                if claim.is_exclusive()
                    && matches!(outcome, AcquireOutcome::Held(_))
                    && waited.is_some()
                {
                    self.inner.abandon(key, owner).await?;
                }
                Ok(outcome)
            }
            Breakage::ReservationsNeverKept => {
                match self.inner_claim(waited, key, owner, ttl, claim).await? {
                    AcquireOutcome::Held(held) => {
                        // Dropped at once; the hint is dropped too, since dropping the
                        // reservation moved the key on from what the refusal saw.
                        self.inner.abandon(key, owner).await?;
                        Ok(AcquireOutcome::Held(Contention::new(held.remaining_ttl)))
                    }
                    granted => Ok(granted),
                }
            }
            Breakage::CapacityMismatchGranted => {
                match self.inner_claim(waited, key, owner, ttl, claim).await {
                    Err(LockError::Config { message }) => {
                        match claims::as_stored_kind(&self.inner, key, claim).await? {
                            Some(taken) => self.inner_claim(waited, key, owner, ttl, taken).await,
                            None => Err(LockError::Config { message }),
                        }
                    }
                    answer => answer,
                }
            }
            Breakage::RegrantNewToken => {
                let ExtendOutcome::Extended(old) = self.inner.extend(key, owner, ttl).await? else {
                    return self.inner_claim(waited, key, owner, ttl, claim).await;
                };
                self.inner.release(key, owner).await?;
                self.inner_claim(waited, key, owner, ttl.max(old.ttl), claim)
                    .await
            }
            Breakage::RegrantShortens => {
                // A probe that never shortens: whether the owner holds the key already.
                let ExtendOutcome::Extended(old) = self.inner.extend(key, owner, ttl).await? else {
                    return self.inner_claim(waited, key, owner, ttl, claim).await;
                };
                self.inner.release(key, owner).await?;
                let again = self.inner_claim(waited, key, owner, ttl, claim).await?;
                if let AcquireOutcome::Acquired(g) = &again {
                    let shown = self.shown_token(key, old.token);
                    self.tokens().show(key, g.token, shown);
                }
                Ok(again)
            }
            Breakage::TokenBeforeLock => {
                let taken = self.tokens().taken(key, owner);
                let outcome = self.inner_claim(waited, key, owner, ttl, claim).await?;
                if let AcquireOutcome::Acquired(g) = &outcome {
                    self.tokens().show(key, g.token, taken);
                }
                Ok(outcome)
            }
            Breakage::CounterRestarts => {
                let outcome = self.inner_claim(waited, key, owner, ttl, claim).await?;
                if let AcquireOutcome::Acquired(g) = &outcome {
                    let mut tokens = self.tokens();
                    if tokens.shown(key, g.token).is_none() {
                        let next = tokens.next(key);
                        tokens.show(key, g.token, next);
                    }
                }
                Ok(outcome)
            }
            Breakage::TryAcquireBlocks => {
                let until = tokio::time::Instant::now() + BLOCKED_AT_MOST;
                loop {
                    let outcome = self.inner_claim(waited, key, owner, ttl, claim).await?;
                    if matches!(outcome, AcquireOutcome::Acquired(_))
                        || tokio::time::Instant::now() >= until
                    {
                        return Ok(outcome);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            Breakage::GrantOverstatesTtl => Ok(
                match self
                    .inner_claim(waited, key, owner, ttl - ttl / 4, claim)
                    .await?
                {
                    AcquireOutcome::Acquired(g) => {
                        AcquireOutcome::Acquired(Grant::new(g.token, ttl))
                    }
                    held => held,
                },
            ),
            Breakage::TtlRoundedDown => {
                self.inner_claim(waited, key, owner, tick(ttl), claim).await
            }
            Breakage::ExpiryOnLocalClock => Ok(
                match self
                    .inner_claim(waited, key, owner, self.local_clock_ttl(ttl), claim)
                    .await?
                {
                    AcquireOutcome::Acquired(g) => {
                        AcquireOutcome::Acquired(Grant::new(g.token, ttl))
                    }
                    held => held,
                },
            ),
            Breakage::ExtendTrustsLease => {
                let outcome = self.inner_claim(waited, key, owner, ttl, claim).await?;
                if let AcquireOutcome::Acquired(g) = &outcome {
                    self.leases().granted(key, owner, g.token, g.ttl);
                }
                Ok(outcome)
            }
            Breakage::HolderByRevision => {
                let outcome = self.inner_claim(waited, key, owner, ttl, claim).await?;
                if let AcquireOutcome::Acquired(_) = &outcome {
                    self.revisions().insert(key.clone(), self.revision());
                }
                Ok(outcome)
            }
            _ => self.inner_claim(waited, key, owner, ttl, claim).await,
        }
    }

    /// What inspect shows, broken as configured.
    fn shown(&self, key: &LockKey, info: LockInfo) -> LockInfo {
        let claim = info.claim;
        let info = LockInfo::new(
            info.holder,
            self.shown_token(key, info.token),
            info.remaining_ttl,
        )
        .with_claim(claim);
        match self.breakage {
            Breakage::TokensDoNotIncrease => {
                LockInfo::new(info.holder, FencingToken(1), info.remaining_ttl).with_claim(claim)
            }
            Breakage::InspectShowsOwnerToken => {
                let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
                let holder = owners.get(key).cloned().unwrap_or(info.holder);
                LockInfo::new(holder, info.token, info.remaining_ttl).with_claim(claim)
            }
            Breakage::SemaphoreAdmitsOneMore => claims::shown_one_less(info),
            Breakage::HolderByRevision => LockInfo::new(
                info.holder,
                FencingToken(info.token.get() + self.revision()),
                info.remaining_ttl,
            )
            .with_claim(claim),
            _ => info,
        }
    }
}

const FOREVER: Duration = Duration::from_secs(3600);

/// How many bytes of a key [`Breakage::KeysTruncated`] keeps.
const KEY_BYTES: usize = 16;

/// How long [`Breakage::TryAcquireBlocks`] waits for a held key before answering "held".
const BLOCKED_AT_MOST: Duration = Duration::from_secs(10);

/// `ttl` rounded down to the 10 ms tick of [`Breakage::TtlRoundedDown`].
fn tick(ttl: Duration) -> Duration {
    const TICK: u128 = 10_000_000;
    let nanos = ttl.as_nanos() / TICK * TICK;
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[async_trait]
impl LockBackend for Broken {
    fn name(&self) -> &'static str {
        "broken-memory"
    }

    fn capabilities(&self) -> Capabilities {
        let caps = self.inner.capabilities();
        if self.breakage == Breakage::ClaimsFifo {
            caps.with_fairness(Fairness::Fifo)
        } else {
            caps
        }
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        if self.breakage == Breakage::NewKeyRefused {
            let new =
                (self.seen.lock().unwrap_or_else(|e| e.into_inner())).insert(request.key.clone());
            if new && self.inner.holders(request.key).await?.is_empty() {
                return Ok(AcquireOutcome::Held(Contention::new(None)));
            }
        }
        let outcome = self.shown_claim(request).await?;
        if self.breakage == Breakage::BatchCarriesEveryHold
            && request.claim.is_exclusive()
            && matches!(outcome, AcquireOutcome::Acquired(_))
        {
            let mut granted = self.granted.lock().unwrap_or_else(|e| e.into_inner());
            granted.push((request.key.clone(), request.owner.clone()));
        }
        Ok(outcome)
    }

    /// Only [`Breakage::SetsPartly`] takes sets in one request; every other breakage has
    /// its sets taken key by key, through its broken [`claim`](Self::claim).
    async fn claim_all(
        &self,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Option<SetOutcome>, LockError> {
        if self.breakage != Breakage::SetsPartly {
            return Ok(None);
        }
        let mut grants = Vec::with_capacity(requests.len());
        for (index, request) in requests.iter().enumerate() {
            match self.claim(request).await? {
                AcquireOutcome::Acquired(grant) => grants.push(grant),
                AcquireOutcome::Held(contention) => {
                    return Ok(Some(SetOutcome::Held { index, contention }))
                }
            }
        }
        Ok(Some(SetOutcome::Acquired(grants)))
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.forgotten()?;
        let key = &self.stored(key);
        match self.breakage {
            Breakage::ReleaseAnswersNotHeld => Ok(match self.inner.release(key, owner).await? {
                ReleaseOutcome::Released => ReleaseOutcome::NotHeld,
                other => other,
            }),
            Breakage::ReleaseIgnoresOwner => self.inner.force_release(key).await,
            Breakage::ExtendTrustsLease => {
                self.leases().released(key, owner);
                self.inner.release(key, owner).await
            }
            Breakage::ReleaseDoesNothing => Ok(match self.inner.inspect(key).await? {
                Some(_) => ReleaseOutcome::Released,
                None => ReleaseOutcome::NotHeld,
            }),
            Breakage::ReadersIgnoreWriter => match self.inner.release(key, owner).await? {
                ReleaseOutcome::NotHeld => {
                    self.inner.release(&claims::readers_key(key)?, owner).await
                }
                released => Ok(released),
            },
            _ => self.inner.release(key, owner).await,
        }
    }

    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        if self.breakage == Breakage::BatchCapped && renewals.len() > 500 {
            return Err(LockError::backend(
                "broken",
                "too many terms in compound SELECT",
            ));
        }
        let mut answers = Vec::with_capacity(renewals.len());
        for r in renewals {
            let answer = match self.renew_one(r.key, r.owner, r.ttl).await {
                Ok(ExtendOutcome::NotHeld) if self.breakage == Breakage::LapsedLeaseRenewed => {
                    let read_locked = self
                        .holders(r.key)
                        .await
                        .is_ok_and(|all| all.iter().any(|i| i.claim.mode() == ClaimMode::Shared));
                    match self.try_claim(r.key, r.owner, r.ttl, Claim::shared()).await {
                        Ok(AcquireOutcome::Acquired(g)) if read_locked => {
                            Ok(ExtendOutcome::Extended(g))
                        }
                        Ok(AcquireOutcome::Acquired(_)) => {
                            let _ = self.release(r.key, r.owner).await;
                            Ok(ExtendOutcome::NotHeld)
                        }
                        Ok(AcquireOutcome::Held(_)) => Ok(ExtendOutcome::NotHeld),
                        Err(e) => Err(e),
                    }
                }
                Ok(ExtendOutcome::NotHeld) if self.breakage == Breakage::BatchRecreates => {
                    match self.try_acquire(r.key, r.owner, r.ttl).await {
                        Ok(AcquireOutcome::Acquired(g)) => Ok(ExtendOutcome::Extended(g)),
                        Ok(AcquireOutcome::Held(_)) => Ok(ExtendOutcome::NotHeld),
                        Err(e) => Err(e),
                    }
                }
                other => other,
            };
            answers.push(answer);
        }
        if self.breakage == Breakage::BatchCarriesEveryHold {
            let granted = self
                .granted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(ttl) = renewals.first().map(|r| r.ttl) {
                for (key, owner) in &granted {
                    let _ = self.inner.extend(&self.stored(key), owner, ttl).await;
                }
            }
        }
        match self.breakage {
            Breakage::BatchAllOrNothing
                if answers
                    .iter()
                    .any(|a| matches!(a, Ok(ExtendOutcome::NotHeld))) =>
            {
                Ok(renewals
                    .iter()
                    .map(|_| Ok(ExtendOutcome::NotHeld))
                    .collect())
            }
            Breakage::BatchOutOfOrder => {
                answers.reverse();
                Ok(answers)
            }
            Breakage::BatchLeasesMisplaced => {
                let mut leases = Vec::new();
                for (i, r) in renewals.iter().enumerate() {
                    let held = self.inner.holders(&self.stored(r.key)).await?;
                    if held.iter().any(|l| l.claim.mode() != ClaimMode::Exclusive) {
                        leases.push(i);
                    }
                }
                let mut moved: Vec<_> = leases
                    .iter()
                    .rev()
                    .map(|&i| std::mem::replace(&mut answers[i], Ok(ExtendOutcome::NotHeld)))
                    .collect();
                for &i in leases.iter().rev() {
                    if let Some(answer) = moved.pop() {
                        answers[i] = answer;
                    }
                }
                Ok(answers)
            }
            _ => Ok(answers),
        }
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        let key = &self.stored(key);
        let mut all = self.inner.holders(key).await?;
        if self.breakage == Breakage::ReadersIgnoreWriter {
            all.extend(self.inner.holders(&claims::readers_key(key)?).await?);
            all.sort_by_key(|info| info.token);
        }
        Ok(all.into_iter().map(|info| self.shown(key, info)).collect())
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let key = &self.stored(key);
        match self.breakage {
            Breakage::NotificationsNeverFire => {
                tokio::time::sleep(max_wait).await;
                Ok(())
            }
            Breakage::ReadersIgnoreWriter => {
                // A writer refused by readers waits for the readers' key.
                let readers = claims::readers_key(key)?;
                if self.inner.holders(&readers).await?.is_empty() {
                    self.inner.wait_released(key, hint, place, max_wait).await
                } else {
                    let hint = WaitHint::none();
                    self.inner
                        .wait_released(&readers, &hint, place, max_wait)
                        .await
                }
            }
            _ => self.inner.wait_released(key, hint, place, max_wait).await,
        }
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        let key = &self.stored(key);
        let outcome = self.inner.force_release(key).await?;
        if self.breakage != Breakage::ReadersIgnoreWriter {
            return Ok(outcome);
        }
        let readers = self.inner.force_release(&claims::readers_key(key)?).await?;
        Ok(if outcome == ReleaseOutcome::Released {
            outcome
        } else {
            readers
        })
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        let key = &self.stored(key);
        if self.breakage == Breakage::ReadersIgnoreWriter {
            self.inner
                .abandon(&claims::readers_key(key)?, owner)
                .await?;
        }
        self.inner.abandon(key, owner).await
    }

    /// The inner store's, whose wake-ups this backend's waiters subscribe to; none for
    /// [`Breakage::SharedGrantWakesNobody`], so lockcore passes no wake-up on.
    fn notifier(&self) -> Option<&ReleaseNotifier> {
        match self.breakage {
            Breakage::SharedGrantWakesNobody => None,
            _ => self.inner.notifier(),
        }
    }
}

impl Broken {
    /// One renewal, with the breakage applied, its token as shown.
    async fn renew_one(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        self.forgotten()?;
        let key = &self.stored(key);
        Ok(match self.broken_extend(key, owner, ttl).await? {
            ExtendOutcome::Extended(g) => {
                ExtendOutcome::Extended(Grant::new(self.shown_token(key, g.token), g.ttl))
            }
            lost => lost,
        })
    }
    /// Every renewal, with the breakage applied.
    async fn broken_extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        match self.breakage {
            Breakage::HolderByRevision => {
                let seen = self.revisions().get(key).copied();
                if seen.is_some_and(|seen| seen != self.revision()) {
                    return Ok(ExtendOutcome::NotHeld);
                }
                self.inner.extend(key, owner, ttl).await
            }
            Breakage::ExtendShortens => {
                let ExtendOutcome::Extended(old) = self.inner.extend(key, owner, ttl).await? else {
                    return Ok(ExtendOutcome::NotHeld);
                };
                // Set to `ttl` from now: dropped and granted again, its token shown as before.
                let held = self.inner.holders(key).await?;
                let claim = held
                    .iter()
                    .find(|l| l.token == old.token)
                    .map_or(Claim::exclusive(), |l| l.claim);
                self.inner.release(key, owner).await?;
                Ok(
                    match self.inner_claim(None, key, owner, ttl, claim).await? {
                        AcquireOutcome::Acquired(g) => {
                            let shown = self.shown_token(key, old.token);
                            self.tokens().show(key, g.token, shown);
                            ExtendOutcome::Extended(g)
                        }
                        AcquireOutcome::Held(_) => ExtendOutcome::NotHeld,
                    },
                )
            }
            Breakage::GrantOverstatesTtl => {
                Ok(match self.inner.extend(key, owner, ttl - ttl / 4).await? {
                    ExtendOutcome::Extended(g) => ExtendOutcome::Extended(Grant::new(g.token, ttl)),
                    lost => lost,
                })
            }
            Breakage::TtlRoundedDown => self.inner.extend(key, owner, tick(ttl)).await,
            Breakage::ExpiryOnLocalClock => Ok(
                match self
                    .inner
                    .extend(key, owner, self.local_clock_ttl(ttl))
                    .await?
                {
                    ExtendOutcome::Extended(g) => ExtendOutcome::Extended(Grant::new(g.token, ttl)),
                    lost => lost,
                },
            ),
            Breakage::TokensDoNotIncrease => Ok(match self.inner.extend(key, owner, ttl).await? {
                ExtendOutcome::Extended(g) => {
                    ExtendOutcome::Extended(Grant::new(FencingToken(1), g.ttl))
                }
                lost => lost,
            }),
            Breakage::NeverExpires => Ok(match self.inner.extend(key, owner, FOREVER).await? {
                ExtendOutcome::Extended(g) => ExtendOutcome::Extended(Grant::new(g.token, ttl)),
                lost => lost,
            }),
            Breakage::ExtendIgnoresOwner => Ok(match self.inner.inspect(key).await? {
                Some(info) => ExtendOutcome::Extended(Grant::new(info.token, ttl)),
                None => ExtendOutcome::NotHeld,
            }),
            Breakage::ExtendTrustsLease => match self.inner.extend(key, owner, ttl).await? {
                ExtendOutcome::Extended(g) => {
                    self.leases().granted(key, owner, g.token, g.ttl);
                    Ok(ExtendOutcome::Extended(g))
                }
                ExtendOutcome::NotHeld => Ok(match self.leases().keep_alive(key, owner, ttl) {
                    Some(token) => ExtendOutcome::Extended(Grant::new(token, ttl)),
                    None => ExtendOutcome::NotHeld,
                }),
            },
            Breakage::ExtendCreates => match self.inner.extend(key, owner, ttl).await? {
                ExtendOutcome::NotHeld => match self.inner.try_acquire(key, owner, ttl).await? {
                    AcquireOutcome::Acquired(g) => Ok(ExtendOutcome::Extended(g)),
                    AcquireOutcome::Held(_) => Ok(ExtendOutcome::NotHeld),
                },
                extended => Ok(extended),
            },
            Breakage::ReadersIgnoreWriter => match self.inner.extend(key, owner, ttl).await? {
                ExtendOutcome::NotHeld => {
                    let readers = claims::readers_key(key)?;
                    self.inner.extend(&readers, owner, ttl).await
                }
                extended => Ok(extended),
            },
            _ => self.inner.extend(key, owner, ttl).await,
        }
    }
}
