//! The history checker: a multi-process workload on one key under faults, recorded and
//! checked offline.
//!
//! Worker processes (this test binary, run again on the same test) loop: acquire the key,
//! do a fenced read-modify-write of a counter in a register — a small TCP
//! server in the checker process, independent of the store, that refuses tokens below the
//! highest it has seen — and release. Every step is reported to the register, so the whole
//! history is timestamped by one clock. Meanwhile a nemesis pauses a worker (SIGSTOP) past
//! its lease, cuts a holder off from the store past its lease (a partition, through
//! per-worker proxies), kills one (SIGKILL) and starts another, and restarts the store
//! through a hook of the caller's. Then [`check`] judges the history: tokens unique and increasing in
//! grant order, no overlapping holds without a fault to explain them, no stale write
//! accepted, no lost update, and the lock granted again after every fault heals.
//! [`Workload::mode`] runs readers and writers of a read-write lock, or the holders of a
//! semaphore's permits, instead: then holds may overlap as far as the key's capacity allows.
//!
//! A driver opts in with one test (see `docs/history-checker.md`):
//!
//! ```ignore
//! distlock_conformance::history_test!(
//!     history,
//!     workload: distlock_conformance::history::Workload::new(Duration::from_millis(500)),
//!     connect: |address: String| async move {
//!         Ok(LockClient::new(MyBackend::connect(&address).await?))
//!     },
//!     store: || async { MyHistoryStore::start().await },
//! );
//! ```

mod check;
mod event;
mod nemesis;
mod register;
mod report;
mod worker;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use lockcore::{LockClient, LockError};

/// The attribute for implementing [`HistoryStore`] (its `restart` is async), re-exported so
/// a driver's tests need no `async-trait` dependency of their own.
pub use async_trait::async_trait;

pub use check::{check, CheckConfig};
pub use event::{Event, EventKind, WorkerId};
pub use report::{Check, Report, Stats, Violation};

use nemesis::Nemesis;
use register::Register;
use worker::{Spawner, WorkerConfig};

/// The store the workers lock on, as the checker sees it: an address for the workers and
/// an optional restart hook for the nemesis.
#[async_trait]
pub trait HistoryStore: Send + Sync {
    /// What every worker's `connect` receives: a URL, a list of addresses, a file path —
    /// whatever the test's `connect` understands.
    fn address(&self) -> String;

    /// Whether [`restart`](Self::restart) is implemented. When it is not, the nemesis skips
    /// the store restart and the report says so.
    fn can_restart(&self) -> bool {
        false
    }

    /// Stops the store and starts it again at the same address (losing data or not: the
    /// store's business). Returns when it accepts connections again.
    async fn restart(&self) -> Result<(), String> {
        Err("this store has no restart hook".to_owned())
    }

    /// The store's TCP endpoints, for the partition nemesis: each worker then reaches them
    /// through loopback proxies of its own ([`address_via`](Self::address_via)), which the
    /// nemesis can cut off. Empty (the default): no partition, and the report says so.
    fn endpoints(&self) -> Vec<SocketAddr> {
        Vec::new()
    }

    /// Whether [`set_clock`](Self::set_clock) is implemented. When it is not, the nemesis
    /// skips the clock steps and the report says so.
    fn can_set_clock(&self) -> bool {
        false
    }

    /// Sets the store's wall clock to the real time plus `offset_ms` (negative: behind).
    /// Returns once the store reads its clock so. The step is the store's alone: the
    /// workers' and the checker's clocks do not move.
    async fn set_clock(&self, offset_ms: i64) -> Result<(), String> {
        let _ = offset_ms;
        Err("this store has no clock hook".to_owned())
    }

    /// The [`address`](Self::address) with each of [`endpoints`](Self::endpoints) replaced by
    /// the one at the same place in `via`.
    fn address_via(&self, via: &[SocketAddr]) -> String {
        let _ = via;
        self.address()
    }
}

/// A store at a fixed address with no restart hook.
#[derive(Clone, Debug)]
pub struct Address(pub String);

impl HistoryStore for Address {
    fn address(&self) -> String {
        self.0.clone()
    }
}

/// What the workers take of the key, and what they do with the register while they hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The exclusive lock, and a fenced read-modify-write of the register (the default).
    Exclusive,
    /// A read-write lock: one attempt in three is a writer (the exclusive claim and the
    /// read-modify-write), the others readers (`shared()`) that make a fenced read and hold on
    /// a moment. The checks: no writer overlaps another holder, and no write is accepted
    /// from a token older than one a reader presented.
    ReadWrite,
    /// A semaphore of this many permits: every attempt takes one permit, makes a fenced
    /// read (refused when a holder with a newer token read first: fencing orders a
    /// semaphore's holders as it orders readers) and holds on a moment. The check: never
    /// more permits out than this.
    Semaphore(u32),
}

impl Mode {
    /// The mode [`Display`](std::fmt::Display) wrote.
    fn parse(s: &str) -> Option<Mode> {
        match s {
            "exclusive" => Some(Mode::Exclusive),
            "read-write" => Some(Mode::ReadWrite),
            _ => s
                .strip_prefix("semaphore:")
                .and_then(|n| n.parse().ok())
                .map(Mode::Semaphore),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mode::Exclusive => f.write_str("exclusive"),
            Mode::ReadWrite => f.write_str("read-write"),
            Mode::Semaphore(n) => write!(f, "semaphore:{n}"),
        }
    }
}

/// The shape of a run: how many workers, the lease, which faults, how long.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Worker processes running at once (default 4).
    pub workers: usize,
    /// The TTL of every acquisition; at least the backend's minimum.
    pub ttl: Duration,
    /// What the workers take of the key (default [`Mode::Exclusive`]).
    pub mode: Mode,
    /// Rounds of faults (default 1): each round pauses, kills and restarts once.
    pub rounds: usize,
    /// Whether to SIGSTOP a worker mid-update past its lease (default true).
    pub pause: bool,
    /// Whether to SIGKILL a holder and start another worker (default true).
    pub kill: bool,
    /// Whether to restart the store, if it can (default true).
    pub restart: bool,
    /// Whether to cut a holder off from the store past its lease, if the store names its
    /// endpoints (default true): see [`HistoryStore::endpoints`].
    pub partition: bool,
    /// Whether to step the store's wall clock forward and back, if it can (default false:
    /// a clock-assisted store is expected to fail under it, see [`HistoryStore::set_clock`]
    /// and `docs/fencing.md`).
    pub clock: bool,
    /// Whether faults land at varied points of a hold (default true): the kill, and the
    /// pauses of rounds after the first, come a random 0–12 ms after their trigger; the
    /// report notes each offset.
    pub jitter: bool,
    /// Grants to see before the first fault (default 10).
    pub warmup_grants: usize,
    /// How long the workload runs on after the last fault (default 500 ms + one TTL).
    pub tail: Duration,
    /// The liveness bound (default three TTLs plus three seconds).
    pub liveness: Option<Duration>,
    /// The longest the whole run may take before it is abandoned (default 60 s).
    pub limit: Duration,
}

impl Workload {
    /// The default workload with leases of `ttl`.
    pub fn new(ttl: Duration) -> Workload {
        Workload {
            workers: 4,
            ttl,
            mode: Mode::Exclusive,
            rounds: 1,
            pause: true,
            kill: true,
            restart: true,
            partition: true,
            clock: false,
            jitter: true,
            warmup_grants: 10,
            tail: Duration::from_millis(500) + ttl,
            liveness: None,
            limit: Duration::from_secs(60),
        }
    }

    /// Turns the partition nemesis on or off.
    pub fn partition(mut self, on: bool) -> Self {
        self.partition = on;
        self
    }

    /// Turns the clock steps on or off: see [`Workload::clock`].
    pub fn clock_steps(mut self, on: bool) -> Self {
        self.clock = on;
        self
    }

    /// Turns the faults' jitter on or off.
    pub fn jitter(mut self, on: bool) -> Self {
        self.jitter = on;
        self
    }

    /// Sets the number of worker processes.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// Sets what the workers take of the key.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the rounds of faults (0: none, the workload alone).
    pub fn rounds(mut self, n: usize) -> Self {
        self.rounds = n;
        self
    }

    /// Chooses the faults.
    pub fn faults(mut self, pause: bool, kill: bool, restart: bool) -> Self {
        self.pause = pause;
        self.kill = kill;
        self.restart = restart;
        self
    }

    /// Sets the liveness bound.
    pub fn liveness(mut self, bound: Duration) -> Self {
        self.liveness = Some(bound);
        self
    }

    /// The liveness bound in force.
    pub fn liveness_bound(&self) -> Duration {
        self.liveness
            .unwrap_or_else(|| nemesis::default_liveness_bound(self.ttl))
    }

    /// How long a paused worker stays stopped: two TTLs and 200 ms, so its lease runs out.
    pub fn pause_for(&self) -> Duration {
        self.ttl * 2 + Duration::from_millis(200)
    }
}

/// Runs the history check as test `test_name` and panics with the report if a check
/// fails; returns the report otherwise. In a worker process (this binary started again by
/// the checker) it runs the worker instead and exits the process.
///
/// `test_name` is the test's full path as libtest prints it (`history`, or `mod::history`
/// inside a module): the checker starts workers with `--exact test_name`.
/// [`history_test!`](crate::history_test) fills it in. `connect` builds a client of the
/// store from [`HistoryStore::address`]; it runs in the workers. `store` starts the store;
/// it runs only in the checker.
pub fn run<C, CFut, S, SFut, St>(
    test_name: &str,
    workload: Workload,
    connect: C,
    store: S,
) -> Report
where
    C: Fn(String) -> CFut,
    CFut: Future<Output = Result<LockClient, LockError>>,
    S: FnOnce() -> SFut,
    SFut: Future<Output = St>,
    St: HistoryStore,
{
    let report = run_report(test_name, workload, connect, store);
    // Shown by libtest with --nocapture, or when the test fails.
    eprintln!("{test_name}: {report}");
    if !report.passed() {
        panic!("the history check of {test_name} failed:\n{report}");
    }
    report
}

/// As [`run`], but returns the report whatever it says (to show that a broken lock
/// fails). Panics only if the run itself cannot be done (no runtime, a worker that cannot
/// start, a store restart that fails).
pub fn run_report<C, CFut, S, SFut, St>(
    test_name: &str,
    workload: Workload,
    connect: C,
    store: S,
) -> Report
where
    C: Fn(String) -> CFut,
    CFut: Future<Output = Result<LockClient, LockError>>,
    S: FnOnce() -> SFut,
    SFut: Future<Output = St>,
    St: HistoryStore,
{
    serve_as_worker(test_name, connect);
    if let Some(thread) = std::thread::current().name() {
        if thread != "main" && thread != test_name {
            panic!(
                "history::run was given the test name {test_name:?}, but libtest runs this \
                 test as {thread:?}: workers started with `--exact {test_name}` would run \
                 nothing (history_test! gets the name right)"
            );
        }
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("{test_name}: cannot build a tokio runtime: {e}"),
    };
    let result = rt.block_on(async {
        let store = store().await;
        execute(test_name, &store, &workload).await
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    match result {
        Ok(report) => report,
        Err(e) => panic!("the history run of {test_name} could not be done: {e}"),
    }
}

/// If this process is a worker the checker started for test `test_name`, runs the worker
/// and exits the process; otherwise returns at once. [`run`] and [`run_report`] call it
/// first; call it yourself at the top of a test that drives [`execute`] in a runtime of its
/// own.
pub fn serve_as_worker<C, CFut>(test_name: &str, connect: C)
where
    C: Fn(String) -> CFut,
    CFut: Future<Output = Result<LockClient, LockError>>,
{
    match WorkerConfig::from_env(test_name) {
        Some(Ok(config)) => worker::worker_main(config, connect),
        Some(Err(e)) => {
            eprintln!("history worker of {test_name}: {e}");
            std::process::exit(2);
        }
        None => {}
    }
}

/// Records a history against `store` with worker processes running test `test_name`, and
/// checks it. The test must call [`serve_as_worker`] first, with the same name.
///
/// # Errors
///
/// If the register or a worker cannot start, the current executable is unknown, a store
/// restart fails, or the run exceeds [`Workload::limit`].
pub async fn execute(
    test_name: &str,
    store: &dyn HistoryStore,
    workload: &Workload,
) -> Result<Report, String> {
    let register = Register::start()
        .await
        .map_err(|e| format!("cannot start the register: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("no current executable: {e}"))?;
    let hex = lockcore::driver::OwnerToken::generate().to_hex();
    let key = format!("history-{}", hex.get(..12).unwrap_or(&hex));
    let spawner = Spawner {
        exe,
        test_name: test_name.to_owned(),
        config: WorkerConfig {
            register: register.addr(),
            id: 0,
            store: store.address(),
            key,
            ttl: workload.ttl,
            lifetime: workload.limit + Duration::from_secs(30),
            mode: workload.mode,
        },
    };
    let mut nemesis = Nemesis {
        register: &register,
        spawner: &spawner,
        workers: Vec::new(),
        proxies: Vec::new(),
        next_id: 1,
        store,
        workload,
        notes: Vec::new(),
    };
    nemesis.spawn_workers().await?;
    let outcome = tokio::time::timeout(workload.limit, nemesis.run()).await;
    // Holds still open end here; the workers are stopped only after, so no hold of the
    // history outlives its real one.
    register.record(EventKind::End);
    nemesis.stop_workers();
    let notes = std::mem::take(&mut nemesis.notes);
    drop(nemesis);
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(format!(
                "the run did not finish within {:?}",
                workload.limit
            ))
        }
    }
    let history = register.finish();
    let mut report = check(
        &history,
        &CheckConfig {
            liveness_bound: workload.liveness_bound(),
            // Generous: a watchdog thread starved on a loaded machine fires late.
            lost_late: workload.ttl / 2,
        },
    );
    report.notes.extend(notes);
    tracing::info!(test = test_name, "history check:\n{report}");
    Ok(report)
}

/// One `#[test]` running the history check ([`history::run`](crate::history::run)) with
/// the test's name filled in:
///
/// ```ignore
/// distlock_conformance::history_test!(
///     #[ignore = "optional attributes go first"]
///     history,
///     workload: Workload::new(ttl),
///     connect: |address: String| async move { /* a LockClient of the store */ },
///     store: || async { /* something implementing HistoryStore */ },
/// );
/// ```
#[macro_export]
macro_rules! history_test {
    ($(#[$meta:meta])* $name:ident, workload: $workload:expr, connect: $connect:expr,
     store: $store:expr $(,)?) => {
        $(#[$meta])*
        #[test]
        fn $name() {
            // libtest names a test by its path without the crate.
            let name = match module_path!().split_once("::") {
                Some((_, path)) => format!("{path}::{}", stringify!($name)),
                None => stringify!($name).to_owned(),
            };
            $crate::history::run(&name, $workload, $connect, $store);
        }
    };
}
