//! The in-memory reference backend.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::lease::now_on;
use crate::notify::ReleaseNotifier;
use crate::{
    AcquireOutcome, Capabilities, Claim, ClaimRequest, ClockSource, Contention, ExtendOutcome,
    Fairness, FencingGuarantee, FencingToken, Grant, LockBackend, LockError, LockInfo, LockKey,
    Owner, OwnerToken, ReleaseOutcome, Renewal, SetOutcome, WaitHint,
};

/// What the memory backend declares: strict fencing, release notifications, shared claims
/// and semaphores, batched renewals (a batch costs no round trip), TTLs from 1 ms, judged by
/// this process's monotonic clock.
pub const MEMORY_CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::Strict)
    .with_notifications(true)
    .with_claims(true, true)
    .with_batched_renewals(true)
    .with_fairness(Fairness::Bounded)
    .with_clock(ClockSource::Local);

/// A complete lock store inside this process: the reference implementation of the
/// contract, with strict fencing and release notifications.
///
/// Clients built over clones of the same `Arc<MemoryBackend>` contend with each other as
/// clients of a server would. Useful for tests, single-process applications, and as the
/// model the conformance suite holds every driver to.
///
/// # Examples
///
/// ```
/// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
/// use distlock_core::{LockClient, memory::MemoryBackend};
///
/// let store = MemoryBackend::new();
/// let a = LockClient::new(store.clone());
/// let b = LockClient::new(store);
/// let held = a.lock("job").try_acquire().await?.expect("free");
/// assert!(b.lock("job").try_acquire().await?.is_none());
/// held.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct MemoryBackend {
    state: Mutex<State>,
    notifier: ReleaseNotifier,
    /// Leases on tokio's clock (the test store's) rather than the monotonic clock.
    tokio_clock: bool,
}

/// The last token any memory store of this process handed out: one counter for every key
/// (tokens then increase per key as well, and no per-key counter has to outlive its lock)
/// and for every store, so a store replaced by a fresh one — an in-process "restart", as the
/// conformance harness's fault hooks do — keeps handing out higher tokens for the same key.
static LAST_TOKEN: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Default)]
struct State {
    locks: HashMap<LockKey, Entry>,
    sweep_at: usize,
}

/// A key's claims: its capacity, its leases in grant order, and the reservation of the
/// oldest waiting claim that did not fit.
#[derive(Clone, Debug)]
struct Entry {
    capacity: u64,
    leases: Vec<Lease>,
    reservation: Option<Reservation>,
    /// Bumped whenever room is freed (a release, an expiry seen, a reservation dropped): a
    /// waiter's hint, so a release between its refusal and its wait is never slept through.
    version: u64,
}

#[derive(Clone, Debug)]
struct Lease {
    owner: OwnerToken,
    label: Arc<str>,
    weight: u64,
    token: FencingToken,
    expires_at: Instant,
}

#[derive(Clone, Debug)]
struct Reservation {
    owner: OwnerToken,
    weight: u64,
    expires_at: Instant,
    /// When its request arrived: a request that arrived earlier and says so
    /// ([`ClaimRequest::waited`]) goes before it and takes its place when refused.
    since: Instant,
}

impl Entry {
    /// Drops expired leases and an expired reservation: whether anything is left.
    fn prune(&mut self, now: Instant) -> bool {
        let before = self.leases.len();
        self.leases.retain(|l| l.expires_at > now);
        let mut freed = self.leases.len() != before;
        if self
            .reservation
            .as_ref()
            .is_some_and(|r| r.expires_at <= now)
        {
            self.reservation = None;
            freed = true;
        }
        if freed {
            self.version += 1;
        }
        !self.leases.is_empty() || self.reservation.is_some()
    }

    fn lease_of(&mut self, owner: &OwnerToken) -> Option<&mut Lease> {
        self.leases.iter_mut().find(|l| l.owner == *owner)
    }

    fn info(&self, lease: &Lease, now: Instant) -> LockInfo {
        let claim = Claim::from_parts(lease.weight, self.capacity).unwrap_or(Claim::exclusive());
        LockInfo::new(&*lease.label, lease.token, Some(lease.expires_at - now)).with_claim(claim)
    }
}

impl MemoryBackend {
    /// A new, empty store.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A new, empty store whose leases follow tokio's clock ([`ClockSource::Tokio`]), for
    /// the test store.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn on_tokio_clock() -> Arc<Self> {
        Arc::new(MemoryBackend {
            tokio_clock: true,
            ..Self::default()
        })
    }

    fn clock(&self) -> ClockSource {
        if self.tokio_clock {
            ClockSource::Tokio
        } else {
            ClockSource::Local
        }
    }

    fn now(&self) -> Instant {
        now_on(self.clock())
    }

    /// The process-wide store called `name`, created on first use and shared by every
    /// caller that names it while any of them keeps it alive (`memory:NAME` URLs).
    pub fn named(name: &str) -> Arc<Self> {
        static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<MemoryBackend>>>> = OnceLock::new();
        let mut reg = REGISTRY
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(store) = reg.get(name).and_then(Weak::upgrade) {
            return store;
        }
        reg.retain(|_, w| w.strong_count() > 0);
        let store = Self::new();
        reg.insert(name.to_owned(), Arc::downgrade(&store));
        store
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many keys are held right now (expired leases not counted).
    pub fn held_count(&self) -> usize {
        let now = self.now();
        let state = self.state();
        let held = |e: &Entry| e.leases.iter().any(|l| l.expires_at > now);
        state.locks.values().filter(|e| held(e)).count()
    }

    /// Rewrites `key`'s live leases behind their holders' backs to name a new owner each
    /// (labelled `label`), keeping every lease's token, weight and expiry: what an operator
    /// editing a store's records by hand does. Returns how many leases were rewritten.
    ///
    /// For tests of what a lock does when its record changes hands outside the lock
    /// protocol (the conformance suite's `FaultStore::tamper`); a holder whose lease was
    /// rewritten finds it gone at its next extend.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use distlock_core::{LockClient, LockError, LockKey, memory::MemoryBackend};
    ///
    /// let store = MemoryBackend::new();
    /// let locks = LockClient::new(store.clone());
    /// let held = locks.lock("job").watchdog(false).acquire().await?;
    /// assert_eq!(store.reassign(&LockKey::new("job")?, "intruder"), 1);
    /// assert!(matches!(held.extend().await, Err(LockError::NotHeld { .. })));
    /// assert_eq!(locks.inspect("job").await?.map(|i| i.token), Some(held.token()));
    /// # Ok(()) }
    /// ```
    pub fn reassign(&self, key: &LockKey, label: &str) -> usize {
        let now = self.now();
        let mut state = self.state();
        let Some(entry) = state.locks.get_mut(key) else {
            return 0;
        };
        let mut rewritten = 0;
        for lease in entry.leases.iter_mut().filter(|l| l.expires_at > now) {
            let stranger = Owner::new(label);
            lease.owner = *stranger.token();
            lease.label = Arc::from(stranger.label());
            rewritten += 1;
        }
        rewritten
    }

    /// Removes `owner`'s lease of `key`: [`ReleaseOutcome::Released`] if it was live.
    fn unhold(&self, key: &LockKey, owner: &Owner) -> ReleaseOutcome {
        let now = self.now();
        let mut state = self.state();
        let Some(entry) = state.locks.get_mut(key) else {
            return ReleaseOutcome::NotHeld;
        };
        let Some(at) = entry.leases.iter().position(|l| l.owner == *owner.token()) else {
            return ReleaseOutcome::NotHeld;
        };
        let lease = entry.leases.remove(at);
        entry.version += 1;
        if !entry.prune(now) {
            state.locks.remove(key);
        }
        if lease.expires_at > now {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        }
    }

    /// The claim rule of [`Claim::fits`](crate::Claim::fits), with the reservation, in one
    /// step under the lock.
    fn decide(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let now = self.now();
        let mut state = self.state();
        state.sweep(now);
        decide_in(&mut state.locks, now, request)
    }

    /// Every claim of a set under one hold of the lock: each decided as
    /// [`decide`](Self::decide) does, and the keys put back as they were if one is refused.
    fn decide_all(&self, requests: &[ClaimRequest<'_>]) -> Result<SetOutcome, LockError> {
        let now = self.now();
        let mut state = self.state();
        state.sweep(now);
        let before: Vec<Option<Entry>> = requests
            .iter()
            .map(|r| state.locks.get(r.key).cloned())
            .collect();
        let mut grants = Vec::with_capacity(requests.len());
        for (index, request) in requests.iter().enumerate() {
            let refused = match decide_in(&mut state.locks, now, request) {
                Ok(AcquireOutcome::Acquired(grant)) => {
                    grants.push(grant);
                    continue;
                }
                Ok(AcquireOutcome::Held(contention)) => Ok(SetOutcome::Held { index, contention }),
                Err(e) => Err(e),
            };
            // The refusal's reservation and the grants before it go with the rest.
            for (request, entry) in requests.iter().zip(before) {
                match entry {
                    Some(entry) => state.locks.insert(request.key.clone(), entry),
                    None => state.locks.remove(request.key),
                };
            }
            return refused;
        }
        Ok(SetOutcome::Acquired(grants))
    }
}

impl State {
    /// Drops the keys nobody holds any more, once the map has doubled since the last sweep.
    fn sweep(&mut self, now: Instant) {
        if self.locks.len() >= self.sweep_at {
            self.locks.retain(|_, e| e.prune(now));
            self.sweep_at = (self.locks.len() * 2).max(1024);
        }
    }
}

/// The claim rule of [`Claim::fits`](crate::Claim::fits), with the reservation, on the
/// store's locked map at `now`.
fn decide_in(
    locks: &mut HashMap<LockKey, Entry>,
    now: Instant,
    request: &ClaimRequest<'_>,
) -> Result<AcquireOutcome, LockError> {
    let ClaimRequest {
        key,
        owner,
        ttl,
        claim,
        waited,
        ..
    } = *request;
    let me = *owner.token();
    let entry = locks.entry(key.clone()).or_insert_with(|| Entry {
        capacity: claim.capacity(),
        leases: Vec::new(),
        reservation: None,
        version: 0,
    });
    if !entry.prune(now) {
        // Free: any capacity takes it.
        entry.capacity = claim.capacity();
    } else if entry.capacity != claim.capacity() {
        return Err(LockError::capacity_mismatch(key, entry.capacity, &claim));
    }
    if let Some(mine) = entry.lease_of(&me) {
        mine.expires_at = mine.expires_at.max(now + ttl);
        return Ok(AcquireOutcome::Acquired(Grant::new(mine.token, ttl)));
    }
    let used: u64 = entry.leases.iter().map(|l| l.weight).sum();
    // A request that has waited long arrived at `now − waited`; an earlier arrival's
    // mark stands in its way, a later one's does not.
    let arrival = waited.map(|waited| now.checked_sub(waited).unwrap_or(now));
    let reserved = entry
        .reservation
        .as_ref()
        .filter(|r| r.owner != me && arrival.is_none_or(|a| a >= r.since))
        .map_or(0, |r| r.weight);
    if claim.fits(used, reserved) {
        // Taken under the store's lock, so grants of this store are numbered in order.
        let token = FencingToken(LAST_TOKEN.fetch_add(1, Ordering::SeqCst) + 1);
        entry.leases.push(Lease {
            owner: me,
            label: Arc::from(owner.label()),
            weight: claim.weight(),
            token,
            expires_at: now + ttl,
        });
        if entry.reservation.as_ref().is_some_and(|r| r.owner == me) {
            entry.reservation = None;
        }
        return Ok(AcquireOutcome::Acquired(Grant::new(token, ttl)));
    }
    // An exclusive lock behind an exclusive lock reserves only once it has waited
    // long; any other refusal keeps the earliest waiter's place (its own is refreshed,
    // a later arrival's is taken over).
    let exclusive_only =
        claim.is_exclusive() && entry.leases.iter().all(|l| l.weight == claim.weight());
    if (!exclusive_only || arrival.is_some()) && reserved == 0 {
        let since = match &entry.reservation {
            Some(r) if r.owner == me => r.since.min(arrival.unwrap_or(now)),
            _ => arrival.unwrap_or(now),
        };
        // A mark for a long wait lives a short while unless renewed.
        let lasts = match arrival {
            Some(_) => ttl.min(crate::starving::STARVING_MARK_TTL),
            None => ttl,
        };
        entry.reservation = Some(Reservation {
            owner: me,
            weight: claim.weight(),
            expires_at: now + lasts,
            since,
        });
    }
    let kept = (entry.reservation.as_ref()).is_some_and(|r| r.owner == me && r.expires_at > now);
    let mut hint = WaitHint::at_revision(i64::try_from(entry.version).unwrap_or(i64::MAX))
        .with_reservation(kept);
    let soonest = if reserved > 0 && claim.fits(used, 0) {
        // Only the reservation stands in the way: wait for it to be taken or dropped.
        hint = hint.behind_reservation();
        entry.reservation.as_ref().map(|r| r.expires_at - now)
    } else {
        entry.leases.iter().map(|l| l.expires_at - now).min()
    };
    Ok(AcquireOutcome::Held(
        Contention::new(soonest).with_hint(hint),
    ))
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        MEMORY_CAPABILITIES.with_clock(self.clock())
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        self.decide(request)
    }

    async fn claim_all(
        &self,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Option<SetOutcome>, LockError> {
        self.decide_all(requests).map(Some)
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        let outcome = self.unhold(key, owner);
        if outcome == ReleaseOutcome::Released {
            self.notifier.notify_one(key);
        }
        Ok(outcome)
    }

    /// Every renewal under one look at the clock, in one step under the lock.
    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        let now = self.now();
        let mut state = self.state();
        let renewed = renewals.iter().map(|r| {
            let lease = state
                .locks
                .get_mut(r.key)
                .and_then(|e| e.lease_of(r.owner.token()))
                .filter(|l| l.expires_at > now);
            Ok(match lease {
                Some(l) => {
                    l.expires_at = l.expires_at.max(now + r.ttl);
                    ExtendOutcome::Extended(Grant::new(l.token, r.ttl))
                }
                None => ExtendOutcome::NotHeld,
            })
        });
        Ok(renewed.collect())
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        let now = self.now();
        let state = self.state();
        let Some(entry) = state.locks.get(key) else {
            return Ok(Vec::new());
        };
        Ok(entry
            .leases
            .iter()
            .filter(|l| l.expires_at > now)
            .map(|l| entry.info(l, now))
            .collect())
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let subscription = self.notifier.subscribe(key, place);
        let now = self.now();
        let remaining = {
            let state = self.state();
            let Some(entry) = state.locks.get(key) else {
                return Ok(());
            };
            let changed = hint
                .revision()
                .is_some_and(|seen| u64::try_from(seen).ok() != Some(entry.version));
            let soonest = entry
                .leases
                .iter()
                .map(|l| l.expires_at)
                .filter(|t| *t > now)
                .min();
            // Free of leases but reserved: the reservation's owner takes it next.
            let reserved = entry
                .reservation
                .as_ref()
                .map(|r| r.expires_at)
                .filter(|t| *t > now && hint.is_behind_reservation());
            match soonest.or(reserved) {
                Some(t) if !changed => t - now,
                _ => return Ok(()),
            }
        };
        let _ = tokio::time::timeout(max_wait.min(remaining), subscription.released()).await;
        Ok(())
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        let now = self.now();
        let removed = self.state().locks.remove(key);
        let live = removed.is_some_and(|e| e.leases.iter().any(|l| l.expires_at > now));
        if live {
            self.notifier.notify_one(key);
            Ok(ReleaseOutcome::Released)
        } else {
            Ok(ReleaseOutcome::NotHeld)
        }
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        let now = self.now();
        let mut state = self.state();
        let Some(entry) = state.locks.get_mut(key) else {
            return Ok(());
        };
        if entry
            .reservation
            .as_ref()
            .is_some_and(|r| r.owner == *owner.token())
        {
            entry.reservation = None;
            entry.version += 1;
            if !entry.prune(now) {
                state.locks.remove(key);
            }
            drop(state);
            // The reservation may have kept lighter claims waiting.
            self.notifier.notify_one(key);
        }
        Ok(())
    }

    fn notifier(&self) -> Option<&ReleaseNotifier> {
        Some(&self.notifier)
    }
}
