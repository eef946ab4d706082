//! The whole suite on the in-memory reference backend, through exactly the public API a
//! third-party driver uses.

use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::layer::InProcessStore;
use distlock_conformance::{check, FaultStore, Harness, Outcome};
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
        Ok(Some(Box::new(InProcessStore::over_memory(|memory| memory))))
    }
}

distlock_conformance::suite!(
    in_tree conformance,
    capabilities: MEMORY_CAPABILITIES,
    notifications: true,
    faults: true,
    shared: true,
    semaphores: true,
    fair: bounded,
    extra: [every_client_sees_one_store],
    harness: || async { MemoryHarness { store: MemoryBackend::new() } },
);

/// A driver's own scenario, run by `suite!` beside the catalogue (`extra: [...]`): every
/// client of the harness sees the same store — what one holds, all see held, with its
/// token; once released, all see it free.
async fn every_client_sees_one_store(h: Arc<dyn Harness>) -> Outcome {
    let clients = [h.client().await?, h.client().await?, h.client().await?];
    let key = format!(
        "one-store-{}",
        lockcore::driver::OwnerToken::generate().to_hex()
    );
    let held = clients[0].lock(&key).acquire().await?;
    for c in &clients {
        let info = c.inspect(&key).await?;
        check!(
            info.map(|i| i.token) == Some(held.token()),
            "a client does not see the lock another client holds"
        );
    }
    held.release().await?;
    for c in &clients {
        check!(
            c.inspect(&key).await?.is_none(),
            "a client still sees a released lock"
        );
    }
    Ok(())
}
