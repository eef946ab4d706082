//! The whole conformance suite on a three-server ZooKeeper ensemble
//! (`DISTLOCK_TEST_ZK_CLUSTER_URL`): every client lists all three servers.

mod common;

use common::ZkHarness;

conformance_tests::suite!(
    in_tree conformance,
    capabilities: distlock_zookeeper::CAPABILITIES,
    faults: true,
    shared: true,
    semaphores: true,
    fair: true,
    harness: || async { ZkHarness::from_env("DISTLOCK_TEST_ZK_CLUSTER_URL") },
);
