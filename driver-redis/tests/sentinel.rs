//! The whole distlock conformance suite against a master under Redis Sentinel: the shared
//! test set-up (a master, a replica, three sentinels) for ordinary scenarios; for fault
//! scenarios a master of their own, each client finding it through a sentinel of its own.

mod common;

use common::sentinel::SentinelHarness;

conformance_tests::suite!(
    in_tree conformance,
    capabilities: distlock_redis::CAPABILITIES,
    faults: true,
    shared: true,
    semaphores: true,
    fair: bounded,
    harness: || async { SentinelHarness::new() },
);
