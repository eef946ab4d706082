//! The history checker must be able to fail: `memory:` across processes is a broken lock
//! (every worker process has a store of its own, so every worker holds the key at once and
//! tokens repeat), and the checker says which properties it breaks.

use std::time::Duration;

use conformance_tests::history::{self, Address, Check, Workload};
use lockcore::memory::MemoryBackend;
use lockcore::LockClient;

/// The name libtest gives the test below (workers run it with `--exact`).
const MEMORY_ACROSS_PROCESSES: &str = "memory_across_processes_fails";

#[test]
fn memory_across_processes_fails() {
    let started = std::time::Instant::now();
    let workload = Workload::new(Duration::from_millis(300)).faults(true, true, false);
    let report = history::run_report(
        MEMORY_ACROSS_PROCESSES,
        workload,
        |_address: String| async { Ok(LockClient::new(MemoryBackend::new())) },
        || async { Address("memory:".to_owned()) },
    );
    eprintln!("{report}\n(took {:?})", started.elapsed());
    assert!(
        !report.passed(),
        "the checker let a broken lock pass:\n{report}"
    );
    let failed = report.failed_checks();
    for expected in [
        Check::UniqueTokens,
        Check::TokenOrder,
        Check::MutualExclusion,
        Check::LostUpdate,
    ] {
        assert!(
            failed.contains(&expected),
            "{expected} should fail on memory: across processes:\n{report}"
        );
    }
    assert!(
        !failed.contains(&Check::Liveness),
        "memory: never blocks, so liveness holds:\n{report}"
    );
}
