//! Fault hooks for in-process stores, which have no network link to disturb.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use lockcore::{
    AcquireOutcome, Capabilities, ExtendOutcome, LockBackend, LockClient, LockError, LockInfo,
    LockKey, Owner, ReleaseOutcome, WaitHint,
};
use tokio::sync::watch;

use crate::harness::{FaultClient, FaultLink, FaultStore};

type Factory = Box<dyn Fn() -> Arc<dyn LockBackend> + Send + Sync>;

/// A [`FaultStore`] for a backend that lives in this process (like
/// [`MemoryBackend`](lockcore::memory::MemoryBackend)): `stop` makes every call fail with
/// [`LockError::Unavailable`], `start` replaces the store with a fresh one from the factory
/// (a restart loses everything), and each client talks through a [`FaultLayer`].
pub struct InProcessStore {
    switch: Arc<Switch>,
}

struct Switch {
    running: AtomicBool,
    current: RwLock<Arc<dyn LockBackend>>,
    make: Factory,
}

impl Switch {
    fn current(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        if !self.running.load(Ordering::SeqCst) {
            return Err(LockError::unavailable(
                "in-process store",
                "the store is stopped",
            ));
        }
        Ok(self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone())
    }
}

impl InProcessStore {
    /// A running store made by `make`, which is called again at every restart.
    pub fn new(make: impl Fn() -> Arc<dyn LockBackend> + Send + Sync + 'static) -> Self {
        let current = RwLock::new(make());
        InProcessStore {
            switch: Arc::new(Switch {
                running: AtomicBool::new(true),
                current,
                make: Box::new(make),
            }),
        }
    }
}

#[async_trait]
impl FaultStore for InProcessStore {
    async fn client(&self) -> Result<FaultClient, LockError> {
        let layer = Arc::new(FaultLayer::over(self.switch.clone())?);
        Ok(FaultClient {
            client: LockClient::new(layer.clone()),
            link: layer,
        })
    }

    async fn stop(&self) {
        self.switch.running.store(false, Ordering::SeqCst);
    }

    async fn start(&self) {
        *self
            .switch
            .current
            .write()
            .unwrap_or_else(|e| e.into_inner()) = (self.switch.make)();
        self.switch.running.store(true, Ordering::SeqCst);
    }
}

/// One client's link to an [`InProcessStore`]: a backend wrapper that can hold calls
/// (pause) and delay answers after the store applied them.
pub struct FaultLayer {
    switch: Arc<Switch>,
    caps: Capabilities,
    name: &'static str,
    paused: watch::Sender<bool>,
    delay: Mutex<Duration>,
}

impl std::fmt::Debug for FaultLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultLayer")
            .field("backend", &self.name)
            .finish_non_exhaustive()
    }
}

impl FaultLayer {
    fn over(switch: Arc<Switch>) -> Result<Self, LockError> {
        let backend = switch.current()?;
        let (paused, _) = watch::channel(false);
        Ok(FaultLayer {
            caps: backend.capabilities(),
            name: backend.name(),
            switch,
            paused,
            delay: Mutex::new(Duration::ZERO),
        })
    }

    /// Runs one call: held while paused, refused while the store is stopped, answered
    /// late while a delay is set.
    async fn call<T, F>(&self, op: impl FnOnce(Arc<dyn LockBackend>) -> F) -> Result<T, LockError>
    where
        F: std::future::Future<Output = Result<T, LockError>>,
    {
        let mut paused = self.paused.subscribe();
        let _ = paused.wait_for(|p| !*p).await;
        let backend = self.switch.current()?;
        let answer = op(backend).await;
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
}

#[async_trait]
impl LockBackend for FaultLayer {
    fn name(&self) -> &'static str {
        self.name
    }

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        self.call(|b| async move { b.try_acquire(key, owner, ttl).await })
            .await
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.call(|b| async move { b.release(key, owner).await })
            .await
    }

    async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        self.call(|b| async move { b.extend(key, owner, ttl).await })
            .await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.call(|b| async move { b.inspect(key).await }).await
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        self.call(|b| async move { b.wait_released(key, hint, max_wait).await })
            .await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.call(|b| async move { b.force_release(key).await })
            .await
    }
}
