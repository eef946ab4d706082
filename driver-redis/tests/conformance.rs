//! The whole distlock conformance suite against a real redis-server: the shared test
//! server for ordinary scenarios (a fresh key prefix per scenario), servers of their own
//! for fault scenarios.

mod common;

use common::RedisHarness;

conformance_tests::suite!(
    in_tree conformance,
    capabilities: distlock_redis::CAPABILITIES,
    faults: true,
    shared: true,
    semaphores: true,
    fair: bounded,
    harness: || async { RedisHarness::new() },
);
