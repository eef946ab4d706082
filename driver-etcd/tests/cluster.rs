//! The whole conformance suite on a three-member etcd cluster
//! (`DISTLOCK_TEST_ETCD_CLUSTER_URL`): every client lists all three endpoints.

mod common;

use common::EtcdHarness;

conformance_tests::suite!(
    in_tree conformance,
    capabilities: distlock_etcd::CAPABILITIES,
    faults: true,
    shared: true,
    semaphores: true,
    fair: true,
    harness: || async { EtcdHarness::from_env("DISTLOCK_TEST_ETCD_CLUSTER_URL") },
);
