//! The whole conformance suite on FIFO namespaces (`fair=true`): on one member
//! (`DISTLOCK_TEST_ETCD_URL`) and on the three-member cluster
//! (`DISTLOCK_TEST_ETCD_CLUSTER_URL`).

mod common;

use common::EtcdHarness;

conformance_tests::suite!(
    in_tree single,
    capabilities: driver_etcd::FIFO_CAPABILITIES,
    faults: true,
    shared: true,
    semaphores: true,
    fair: true,
    harness: || async { EtcdHarness::fifo_from_env("DISTLOCK_TEST_ETCD_URL") },
);

conformance_tests::suite!(
    in_tree cluster,
    capabilities: driver_etcd::FIFO_CAPABILITIES,
    faults: true,
    shared: true,
    semaphores: true,
    fair: true,
    harness: || async { EtcdHarness::fifo_from_env("DISTLOCK_TEST_ETCD_CLUSTER_URL") },
);
