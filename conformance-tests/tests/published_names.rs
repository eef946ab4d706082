//! `suite!` as a third-party driver's test file calls it: under the published names
//! `distlock_conformance` and `distlock_core`, with the workspace's own names for these
//! crates (`conformance_tests`, `lockcore`) shadowed by empty modules, so an expansion that
//! reached for either name instead of `$crate` would not compile here.

// The workspace knows distlock-core as `lockcore`; a driver's crate has it as `distlock_core`.
extern crate lockcore as distlock_core;

use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::Harness;
use distlock_core::memory::{MemoryBackend, MEMORY_CAPABILITIES};
use distlock_core::{LockClient, LockError};

/// Stands in the way of any path the macro would start with `lockcore::`.
#[allow(dead_code)]
mod lockcore {}
/// Stands in the way of any path the macro would start with `conformance_tests::`.
#[allow(dead_code)]
mod conformance_tests {}

struct ThirdParty {
    store: Arc<MemoryBackend>,
}

#[distlock_core::driver::async_trait]
impl Harness for ThirdParty {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(self.store.clone()))
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(300)
    }
}

distlock_conformance::suite!(
    third_party,
    capabilities: MEMORY_CAPABILITIES,
    faults: false,
    shared: true,
    semaphores: true,
    fair: bounded,
    harness: || async { ThirdParty { store: MemoryBackend::new() } },
);
