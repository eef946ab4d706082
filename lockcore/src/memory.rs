//! The in-memory reference backend.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::notify::ReleaseNotifier;
use crate::{
    AcquireOutcome, Capabilities, ClockSource, Contention, ExtendOutcome, FencingGuarantee,
    FencingToken, Grant, LockBackend, LockError, LockInfo, LockKey, Owner, OwnerToken,
    ReleaseOutcome, WaitHint,
};

/// What the memory backend declares: strict fencing, release notifications, TTLs from
/// 1 ms, judged by this process's monotonic clock.
pub const MEMORY_CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::Strict)
    .with_notifications(true)
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
/// # #[tokio::main] async fn main() -> Result<(), lockcore::LockError> {
/// use lockcore::{LockClient, memory::MemoryBackend};
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
}

#[derive(Debug, Default)]
struct State {
    locks: HashMap<LockKey, Entry>,
    /// One counter for every key: tokens then increase per key as well, and no per-key
    /// counter has to outlive its lock.
    last_token: u64,
    sweep_at: usize,
}

#[derive(Debug)]
struct Entry {
    owner: OwnerToken,
    label: Arc<str>,
    token: FencingToken,
    expires_at: Instant,
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        self.expires_at > now
    }
}

impl MemoryBackend {
    /// A new, empty store.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
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

    /// How many keys are held right now (expired entries not counted).
    pub fn held_count(&self) -> usize {
        let now = Instant::now();
        self.state().locks.values().filter(|e| e.live(now)).count()
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        MEMORY_CAPABILITIES
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        if let Some(e) = state.locks.get_mut(key) {
            if e.live(now) {
                if e.owner == *owner.token() {
                    e.expires_at = e.expires_at.max(now + ttl);
                    return Ok(AcquireOutcome::Acquired(Grant::new(e.token, ttl)));
                }
                return Ok(AcquireOutcome::Held(Contention::new(Some(
                    e.expires_at - now,
                ))));
            }
        }
        if state.locks.len() >= state.sweep_at {
            state.locks.retain(|_, e| e.live(now));
            state.sweep_at = (state.locks.len() * 2).max(1024);
        }
        state.last_token += 1;
        let token = FencingToken(state.last_token);
        let entry = Entry {
            owner: *owner.token(),
            label: Arc::from(owner.label()),
            token,
            expires_at: now + ttl,
        };
        state.locks.insert(key.clone(), entry);
        Ok(AcquireOutcome::Acquired(Grant::new(token, ttl)))
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        match state.locks.get(key) {
            Some(e) if e.owner == *owner.token() => {
                let live = e.live(now);
                state.locks.remove(key);
                drop(state);
                if live {
                    self.notifier.notify_one(key);
                    Ok(ReleaseOutcome::Released)
                } else {
                    Ok(ReleaseOutcome::NotHeld)
                }
            }
            _ => Ok(ReleaseOutcome::NotHeld),
        }
    }

    async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        match state.locks.get_mut(key) {
            Some(e) if e.owner == *owner.token() && e.live(now) => {
                e.expires_at = e.expires_at.max(now + ttl);
                Ok(ExtendOutcome::Extended(Grant::new(e.token, ttl)))
            }
            _ => Ok(ExtendOutcome::NotHeld),
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let now = Instant::now();
        let state = self.state();
        Ok(state
            .locks
            .get(key)
            .filter(|e| e.live(now))
            .map(|e| LockInfo::new(&*e.label, e.token, Some(e.expires_at - now))))
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        _hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let subscription = self.notifier.subscribe(key);
        let now = Instant::now();
        let remaining = match self.state().locks.get(key) {
            Some(e) if e.live(now) => e.expires_at - now,
            _ => return Ok(()),
        };
        let _ = tokio::time::timeout(max_wait.min(remaining), subscription.released()).await;
        Ok(())
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        let now = Instant::now();
        let removed = self.state().locks.remove(key);
        match removed {
            Some(e) if e.live(now) => {
                self.notifier.notify_one(key);
                Ok(ReleaseOutcome::Released)
            }
            _ => Ok(ReleaseOutcome::NotHeld),
        }
    }
}
