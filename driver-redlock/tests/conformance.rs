//! The whole distlock conformance suite against Redlock on real redis-servers: on three
//! and on five of the shared test instances (a fresh key prefix per scenario), and on
//! servers of its own for the fault scenarios.

mod common;

use common::RedlockHarness;

conformance_tests::suite!(
    in_tree three,
    capabilities: distlock_redlock::CAPABILITIES,
    faults: true,
    shared: true,
    semaphores: false,
    fair: bounded,
    harness: || async { RedlockHarness::new(3) },
);

conformance_tests::suite!(
    in_tree five,
    capabilities: distlock_redlock::CAPABILITIES,
    faults: true,
    shared: true,
    semaphores: false,
    fair: bounded,
    harness: || async { RedlockHarness::new(5) },
);
