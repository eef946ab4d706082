//! The whole suite on the in-memory reference backend, through exactly the public API a
//! third-party driver uses.

use std::sync::Arc;
use std::time::Duration;

use conformance_tests::layer::InProcessStore;
use conformance_tests::{FaultStore, Harness};
use lockcore::memory::{MemoryBackend, MEMORY_CAPABILITIES};
use lockcore::{LockClient, LockError};

struct MemoryHarness {
    store: Arc<MemoryBackend>,
}

#[async_trait::async_trait]
impl Harness for MemoryHarness {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(self.store.clone()))
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(300)
    }

    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        Ok(Some(Box::new(InProcessStore::new(|| MemoryBackend::new()))))
    }
}

conformance_tests::suite!(
    in_tree conformance,
    capabilities: MEMORY_CAPABILITIES,
    notifications: true,
    faults: true,
    shared: true,
    semaphores: true,
    harness: || async { MemoryHarness { store: MemoryBackend::new() } },
);
