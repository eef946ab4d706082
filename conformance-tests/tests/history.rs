//! The history checker must be able to fail: `memory:` across processes is a broken lock
//! (every worker process has a store of its own, so every worker holds the key at once and
//! tokens repeat), and the checker says which properties it breaks.

use std::time::Duration;

use distlock_conformance::history::{self, Address, Check, Mode, Workload};
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
    // Not `Check::LostUpdate`: whether a worker writes over a value it did not read depends
    // on how the workers interleave, and the fenced register rejects most stale writes
    // (one run under load had none to find). `check_tests.rs` shows that check can fail.
    for expected in [
        Check::UniqueTokens,
        Check::TokenOrder,
        Check::MutualExclusion,
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

/// The names libtest gives the tests below.
const MEMORY_SEMAPHORE: &str = "memory_semaphore_across_processes_fails";
const MEMORY_READ_WRITE: &str = "memory_read_write_across_processes_fails";

/// A run of `mode` on `memory:` across processes (every worker holds at once), no faults.
fn memory_run(name: &str, mode: Mode) -> history::Report {
    let workload = Workload::new(Duration::from_millis(300))
        .mode(mode)
        .rounds(0);
    let report = history::run_report(
        name,
        workload,
        |_address: String| async { Ok(LockClient::new(MemoryBackend::new())) },
        || async { Address("memory:".to_owned()) },
    );
    eprintln!("{report}");
    report
}

#[test]
fn memory_semaphore_across_processes_fails() {
    let report = memory_run(MEMORY_SEMAPHORE, Mode::Semaphore(2));
    assert!(
        report.failed_checks().contains(&Check::MutualExclusion),
        "four workers each holding a permit of two should fail:\n{report}"
    );
    assert!(
        report.to_string().contains("of 2 permits"),
        "the violation names the permits:\n{report}"
    );
}

#[test]
fn memory_read_write_across_processes_fails() {
    let report = memory_run(MEMORY_READ_WRITE, Mode::ReadWrite);
    let failed = report.failed_checks();
    assert!(
        failed.contains(&Check::MutualExclusion),
        "writers overlapping readers should fail:\n{report}"
    );
    assert!(
        report.to_string().contains("(shared)"),
        "readers are in the history:\n{report}"
    );
}
