//! The whole conformance suite on one etcd member (`DISTLOCK_TEST_ETCD_URL`).

mod common;

use common::EtcdHarness;

conformance_tests::suite!(
    in_tree conformance,
    capabilities: distlock_etcd::CAPABILITIES,
    faults: true,
    shared: true,
    semaphores: true,
    fair: true,
    harness: || async { EtcdHarness::from_env("DISTLOCK_TEST_ETCD_URL") },
);
