//! The in-process reference backend. Ours: `LockClient` over a shared `MemoryBackend`.
//! Raw: the same `MemoryBackend`'s `LockBackend` methods called directly.

use std::sync::Arc;
use std::time::Duration;

use lockcore::driver::BoxError;
use lockcore::driver::{AcquireOutcome, LockBackendExt};
use lockcore::memory::MemoryBackend;
use lockcore::{LockBackend, LockKey, Owner, ReleaseOutcome};

use crate::target::{RawLock, Target};

/// One store for the whole run: every "instance" is a handle on it, as clients of one
/// server would be.
pub struct Memory {
    store: Arc<MemoryBackend>,
}

impl Target for Memory {
    const NAME: &'static str = "memory";
    type Raw = MemoryRaw;

    async fn setup() -> Result<Self, BoxError> {
        Ok(Memory {
            store: MemoryBackend::new(),
        })
    }

    async fn backend(&self) -> Result<Arc<dyn LockBackend>, BoxError> {
        Ok(self.store.clone())
    }

    async fn raw(&self) -> Result<Vec<(&'static str, MemoryRaw)>, BoxError> {
        Ok(vec![("raw", MemoryRaw(self.store.clone()))])
    }
}

/// Calls the store's operations directly, statically dispatched.
pub struct MemoryRaw(Arc<MemoryBackend>);

impl RawLock for MemoryRaw {
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, BoxError> {
        let outcome = LockBackendExt::try_acquire(&*self.0, key, owner, ttl).await?;
        Ok(matches!(outcome, AcquireOutcome::Acquired(_)))
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
        let outcome = LockBackend::release(&*self.0, key, owner).await?;
        Ok(outcome == ReleaseOutcome::Released)
    }
}
