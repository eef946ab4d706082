//! The whole distlock conformance suite against a Redis Cluster: the shared test cluster
//! (three masters, three replicas) for ordinary scenarios, a one-node cluster of their own
//! for fault scenarios.

mod common;

use common::cluster::ClusterHarness;

conformance_tests::suite!(
    in_tree conformance,
    capabilities: distlock_redis::CAPABILITIES,
    faults: true,
    shared: true,
    semaphores: true,
    fair: bounded,
    harness: || async { ClusterHarness::new() },
);
