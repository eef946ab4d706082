//! Fault hooks for in-process stores, which have no network link to disturb.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use lockcore::driver::{
    AcquireOutcome, Capabilities, ClaimRequest, ExtendOutcome, ReleaseNotifier, Renewal,
    SetOutcome, WaitHint,
};
use lockcore::memory::MemoryBackend;
use lockcore::{LockBackend, LockClient, LockError, LockInfo, LockKey, Owner, ReleaseOutcome};
use tokio::sync::watch;

use crate::harness::{FaultClient, FaultLink, FaultStore, Restart, Tamper};

type Factory = Box<dyn Fn() -> Made + Send + Sync>;

/// What the factory made: the store clients talk to, and the memory store underneath it
/// when there is one (its records can then be rewritten in place).
struct Made {
    backend: Arc<dyn LockBackend>,
    memory: Option<Arc<MemoryBackend>>,
}
type Source = Box<dyn Fn() -> Arc<dyn LockBackend> + Send + Sync>;

/// A [`FaultStore`] for a backend that lives in this process (like
/// [`MemoryBackend`]): `stop` makes every call fail with
/// [`LockError::Unavailable`], `start` replaces the store with a fresh one from the factory
/// (a restart loses everything), and each client talks through a [`FaultLayer`] over the
/// one shared store.
pub struct InProcessStore {
    shared: Arc<Shared>,
    zone: Option<Arc<AtomicI32>>,
    restarts: Option<Arc<AtomicU64>>,
    rewrites: Option<Arc<AtomicU64>>,
    reconnects: Reconnects,
}

struct Shared {
    switch: StoreSwitch,
    current: RwLock<Made>,
    make: Factory,
}

impl Shared {
    fn current(&self) -> Arc<dyn LockBackend> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .backend
            .clone()
    }

    fn memory(&self) -> Option<Arc<MemoryBackend>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .memory
            .clone()
    }
}

impl InProcessStore {
    /// A running store made by `make`, which is called again at every restart.
    ///
    /// Its [`tamper`](FaultStore::tamper) deletes with the store's
    /// [`force_release`](LockBackend::force_release) and cannot rewrite a record: a store
    /// over a [`MemoryBackend`] made with [`over_memory`](Self::over_memory) can.
    pub fn new(make: impl Fn() -> Arc<dyn LockBackend> + Send + Sync + 'static) -> Self {
        Self::with_factory(Box::new(move || Made {
            backend: make(),
            memory: None,
        }))
    }

    /// A running store over a fresh [`MemoryBackend`] at every restart, which `wrap` turns
    /// into the store clients talk to (the memory store itself, or a layer over it).
    /// Every [`Tamper`] works on it: records are rewritten in the memory store underneath.
    pub fn over_memory(
        wrap: impl Fn(Arc<MemoryBackend>) -> Arc<dyn LockBackend> + Send + Sync + 'static,
    ) -> Self {
        Self::with_factory(Box::new(move || {
            let memory = MemoryBackend::new();
            Made {
                backend: wrap(memory.clone()),
                memory: Some(memory),
            }
        }))
    }

    fn with_factory(make: Factory) -> Self {
        let current = RwLock::new(make());
        let shared = Shared {
            switch: StoreSwitch::new(),
            current,
            make,
        };
        InProcessStore {
            shared: Arc::new(shared),
            zone: None,
            restarts: None,
            rewrites: None,
            reconnects: Reconnects::Apart,
        }
    }

    /// Clients whose links open a connection cut by [`FaultLink::cut`] inside the call that
    /// needs it, so a call that stops waiting leaves none open and the next starts over: a
    /// driver that connects that way, for the self-test to show the scenarios catching it.
    /// By default a link opens it in a task of its own, which outlives the call.
    pub fn with_reconnects_in_the_call(mut self) -> Self {
        self.reconnects = Reconnects::InTheCall;
        self
    }

    /// A store whose sessions have a time zone: [`FaultStore::set_time_zone`] writes the
    /// minutes east of UTC into `zone`, for the store (made by the factory) to read.
    pub fn with_time_zone(mut self, zone: Arc<AtomicI32>) -> Self {
        self.zone = Some(zone);
        self
    }

    /// A store that counts in `restarts` every [`FaultStore::restart`] keeping its data,
    /// for the store (made by the factory) to read: what a store forgets across a restart
    /// even when it keeps its data (loaded scripts, prepared statements, sessions).
    pub fn with_restart_count(mut self, restarts: Arc<AtomicU64>) -> Self {
        self.restarts = Some(restarts);
        self
    }

    /// A store that counts in `rewrites` every [`Tamper::Rewrite`] of a record, for the
    /// store (made by the factory) to read: what changes when a record is written again
    /// with the same content (a modification revision, a row version).
    pub fn with_rewrite_count(mut self, rewrites: Arc<AtomicU64>) -> Self {
        self.rewrites = Some(rewrites);
        self
    }
}

#[async_trait]
impl FaultStore for InProcessStore {
    async fn client(&self) -> Result<FaultClient, LockError> {
        let first = self.shared.current();
        let shared = self.shared.clone();
        let layer = Arc::new(FaultLayer::with_source(
            first.name(),
            first.capabilities(),
            self.shared.switch.clone(),
            Box::new(move || shared.current()),
            self.reconnects,
        ));
        Ok(FaultClient {
            client: LockClient::new(layer.clone()),
            link: layer,
        })
    }

    async fn stop(&self) -> Result<(), LockError> {
        self.shared.switch.stop();
        Ok(())
    }

    async fn start(&self) -> Result<(), LockError> {
        *self
            .shared
            .current
            .write()
            .unwrap_or_else(|e| e.into_inner()) = (self.shared.make)();
        self.shared.switch.start();
        Ok(())
    }

    /// Keeping data, the same store serves again after a moment stopped; losing it, a
    /// fresh one from the factory does.
    async fn restart(&self, how: Restart) -> Result<bool, LockError> {
        self.stop().await?;
        match how {
            Restart::KeepData => {
                if let Some(restarts) = &self.restarts {
                    restarts.fetch_add(1, Ordering::SeqCst);
                }
                self.shared.switch.start();
            }
            Restart::LoseData => self.start().await?,
        }
        Ok(true)
    }

    async fn set_time_zone(&self, minutes: i32) -> Result<bool, LockError> {
        Ok(match &self.zone {
            Some(zone) => {
                zone.store(minutes, Ordering::SeqCst);
                true
            }
            None => false,
        })
    }

    /// Deletes through the store's own break-lock ([`LockBackend::force_release`]), which
    /// is what a store-native delete is for a store in this process; rewrites records in
    /// the memory store of [`over_memory`](InProcessStore::over_memory).
    async fn tamper(&self, key: &LockKey, how: Tamper) -> Result<(), LockError> {
        let memory = || {
            self.shared.memory().ok_or_else(|| {
                LockError::config(
                    "reassigning a record needs the store's records: make the InProcessStore \
                     with InProcessStore::over_memory",
                )
            })
        };
        match how {
            Tamper::Delete => self.shared.current().force_release(key).await.map(drop),
            Tamper::Reassign => match memory()?.reassign(key, "stranger") {
                0 => Err(LockError::config(format!(
                    "no live lease of {:?} to reassign",
                    key.as_str()
                ))),
                _ => Ok(()),
            },
            // A memory store has no revisions: the same content written again changes only
            // the count a store made by the factory may read.
            Tamper::Rewrite => {
                if let Some(rewrites) = &self.rewrites {
                    rewrites.fetch_add(1, Ordering::SeqCst);
                }
                Ok(())
            }
        }
    }
}

/// Whether an in-process store counts as running: shared by the [`FaultLayer`]s of its
/// clients, so stopping it makes every client's calls fail at once.
#[derive(Clone, Debug)]
pub struct StoreSwitch(Arc<AtomicBool>);

impl Default for StoreSwitch {
    fn default() -> Self {
        StoreSwitch(Arc::new(AtomicBool::new(true)))
    }
}

impl StoreSwitch {
    /// A running store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls fail with [`LockError::Unavailable`] from now on.
    pub fn stop(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    /// Calls reach the store again.
    pub fn start(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether the store is running.
    pub fn is_running(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// One client's link to an in-process store: a backend wrapper that refuses calls while the
/// store's [`StoreSwitch`] is off, holds them while paused, and delivers answers late while
/// a delay is set. [`InProcessStore`] uses it; a driver whose store has no server to stop
/// (SQLite) wraps each client's own backend in one with [`FaultLayer::new`].
pub struct FaultLayer {
    source: Source,
    switch: StoreSwitch,
    caps: Capabilities,
    name: &'static str,
    paused: watch::Sender<bool>,
    delay: Mutex<Duration>,
    link: Arc<Connection>,
    /// The stores this layer has reached, for [`notifier`](LockBackend::notifier).
    reached: Reached,
}

/// The stores a [`FaultLayer`] has reached, each kept for as long as the layer lives, so
/// that the layer can lend out the current store's notifier (a restart that loses data
/// replaces the store: a list of one, plus one per such restart).
#[derive(Default)]
struct Reached {
    backend: OnceLock<Arc<dyn LockBackend>>,
    next: OnceLock<Box<Reached>>,
}

impl Reached {
    /// `current`, as kept in the list (added at its end if it was not there).
    fn keep(&self, current: Arc<dyn LockBackend>) -> &Arc<dyn LockBackend> {
        let mut node = self;
        loop {
            let kept = node.backend.get_or_init(|| current.clone());
            if Arc::ptr_eq(kept, &current) {
                return kept;
            }
            node = node.next.get_or_init(Box::default);
        }
    }
}

/// How a [`FaultLayer`] opens its connection again after [`FaultLink::cut`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reconnects {
    /// In a task of its own, which a call that stops waiting leaves running.
    Apart,
    /// Inside the call that needs it (see [`InProcessStore::with_reconnects_in_the_call`]).
    InTheCall,
}

/// A layer's connection to its store, as a networked client has one: open until
/// [`FaultLink::cut`], then opened again by the next call, which takes the delay set by
/// [`FaultLink::slow_connects`].
#[derive(Debug)]
struct Connection {
    open: AtomicBool,
    /// Whether a task is opening it (reconnecting apart).
    opening: AtomicBool,
    opened: tokio::sync::Notify,
    delay: Mutex<Duration>,
    reconnects: Reconnects,
}

impl Connection {
    fn delay(&self) -> Duration {
        *self.delay.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns once the connection is open, opening it if it was cut.
    async fn ready(self: &Arc<Self>) {
        loop {
            // Registered before looking, so an opening that ends in between is not missed.
            let opened = self.opened.notified();
            if self.open.load(Ordering::SeqCst) {
                return;
            }
            match self.reconnects {
                Reconnects::InTheCall => {
                    tokio::time::sleep(self.delay()).await;
                    self.open.store(true, Ordering::SeqCst);
                    return;
                }
                Reconnects::Apart => {
                    if !self.opening.swap(true, Ordering::SeqCst) {
                        let this = self.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(this.delay()).await;
                            this.open.store(true, Ordering::SeqCst);
                            this.opening.store(false, Ordering::SeqCst);
                            this.opened.notify_waiters();
                        });
                    }
                    opened.await;
                }
            }
        }
    }
}

impl std::fmt::Debug for FaultLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultLayer")
            .field("backend", &self.name)
            .finish_non_exhaustive()
    }
}

impl FaultLayer {
    /// Wraps `backend`; its calls fail while `switch` is stopped.
    pub fn new(backend: Arc<dyn LockBackend>, switch: StoreSwitch) -> Self {
        let (name, caps) = (backend.name(), backend.capabilities());
        Self::with_source(
            name,
            caps,
            switch,
            Box::new(move || backend.clone()),
            Reconnects::Apart,
        )
    }

    fn with_source(
        name: &'static str,
        caps: Capabilities,
        switch: StoreSwitch,
        source: Source,
        reconnects: Reconnects,
    ) -> Self {
        let (paused, _) = watch::channel(false);
        FaultLayer {
            source,
            switch,
            caps,
            name,
            paused,
            delay: Mutex::new(Duration::ZERO),
            link: Arc::new(Connection {
                open: AtomicBool::new(true),
                opening: AtomicBool::new(false),
                opened: tokio::sync::Notify::new(),
                delay: Mutex::new(Duration::ZERO),
                reconnects,
            }),
            reached: Reached::default(),
        }
    }

    /// Runs one call: held while paused, refused while the store is stopped, answered
    /// late while a delay is set.
    async fn call<T, F>(&self, op: impl FnOnce(Arc<dyn LockBackend>) -> F) -> Result<T, LockError>
    where
        F: std::future::Future<Output = Result<T, LockError>>,
    {
        let mut paused = self.paused.subscribe();
        let _ = paused.wait_for(|p| !*p).await;
        if !self.switch.is_running() {
            return Err(LockError::unavailable(self.name, "the store is stopped"));
        }
        self.link.ready().await;
        let answer = op((self.source)()).await;
        let delay = *self.delay.lock().unwrap_or_else(|e| e.into_inner());
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let _ = paused.wait_for(|p| !*p).await;
        answer
    }
}

#[async_trait]
impl FaultLink for FaultLayer {
    async fn pause(&self) {
        self.paused.send_replace(true);
    }

    async fn resume(&self) {
        self.paused.send_replace(false);
    }

    async fn delay_answers(&self, delay: Duration) {
        *self.delay.lock().unwrap_or_else(|e| e.into_inner()) = delay;
    }

    /// The layer's one connection, opened again after [`cut`](Self::cut) by the next call,
    /// takes `delay` to open.
    async fn slow_connects(&self, delay: Duration) -> bool {
        *self.link.delay.lock().unwrap_or_else(|e| e.into_inner()) = delay;
        true
    }

    async fn cut(&self) -> bool {
        self.link.open.store(false, Ordering::SeqCst);
        true
    }
}

#[async_trait]
impl LockBackend for FaultLayer {
    fn name(&self) -> &'static str {
        self.name
    }

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        self.call(|b| async move { b.claim(request).await }).await
    }

    async fn claim_all(
        &self,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Option<SetOutcome>, LockError> {
        self.call(|b| async move { b.claim_all(requests).await })
            .await
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.call(|b| async move { b.release(key, owner).await })
            .await
    }

    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        self.call(|b| async move { b.renew(renewals).await }).await
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        self.call(|b| async move { b.holders(key).await }).await
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        self.call(|b| async move { b.wait_released(key, hint, place, max_wait).await })
            .await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.call(|b| async move { b.force_release(key).await })
            .await
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.call(|b| async move { b.abandon(key, owner).await })
            .await
    }

    /// The store's own, reached at once: a wake-up inside this process, not a message over
    /// the link.
    fn notifier(&self) -> Option<&ReleaseNotifier> {
        self.reached.keep((self.source)()).notifier()
    }
}
