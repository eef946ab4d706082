//! lockbench: distlock's `LockClient` against a raw hand-written lock on the same store,
//! in one run, with ratios.
//!
//! ```text
//! cargo bench --bench lockbench                       # every compiled-in backend
//! cargo bench --bench lockbench -- memory             # backends whose name contains "memory"
//! cargo bench --bench lockbench -- memory --quick     # a short smoke run
//! cargo bench --bench lockbench -- --duration 5s --samples 200000
//! cargo bench --bench lockbench -- redlock --case handoff   # one case only
//! cargo bench --bench lockbench -- memory --plot docs/img   # SVG wait-time CDFs too
//! ```
//!
//! Cases, each beside its raw baseline: `uncontended` (sequential acquire+release on one
//! client), `concurrent64` (64 tasks on distinct keys), `handoff` (8 tasks over 2 clients on
//! one key, zero hold), `processes8` (8 processes on one key, 5 ms holds: fairness between
//! processes), and the shared-claim cases. The table goes to stdout, the rows to
//! `target/lockbench/results.json`. Adding a backend: see `README.md` beside this file.

// Without any backend compiled in (`--no-default-features`), the machinery is unused.
#![cfg_attr(not(feature = "memory"), allow(dead_code))]

// The harness (`harness.rs`) and what it runs; the backends follow.
mod cases;
mod harness;
mod histogram;
mod keys3;
mod plot;
mod processes;
mod report;
mod scale;
mod shared;
mod target;
mod waiters;

use std::process::ExitCode;

use harness::Registration;
// The shared modules reach the settings as `crate::Settings`.
use harness::Settings;

// ---- The registered backends: one module and one `push` line per driver. ----

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod redis_cluster;
#[cfg(feature = "redlock")]
mod redlock;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod sql;
#[cfg(feature = "zookeeper")]
mod zookeeper;

// One `#[cfg]`'d push per backend keeps adding a driver to one line.
#[allow(unused_mut, clippy::vec_init_then_push)]
fn registered() -> Vec<Registration> {
    let mut targets = Vec::new();
    #[cfg(feature = "memory")]
    targets.push(Registration::of::<memory::Memory>());
    #[cfg(feature = "redis")]
    targets.extend([
        Registration::of::<redis::Redis>(),
        Registration::of::<redis::RedisNoFence>(),
        Registration::of::<redis_cluster::RedisCluster>(),
        Registration::of::<redis_cluster::RedisCluster1>(),
    ]);
    #[cfg(feature = "redlock")]
    targets.extend([
        Registration::of::<redlock::Redlock3>(),
        Registration::of::<redlock::Redlock5>(),
        Registration::of::<redlock::Redlock3NoFence>(),
        Registration::of::<redlock::Redlock5NoFence>(),
    ]);
    #[cfg(feature = "etcd")]
    targets.extend([Registration::of::<etcd::Etcd>()]);
    #[cfg(feature = "zookeeper")]
    targets.push(Registration::of::<zookeeper::Zookeeper>());
    #[cfg(feature = "postgres")]
    targets.push(Registration::of::<sql::Postgres>());
    #[cfg(feature = "mysql")]
    targets.push(Registration::of::<sql::Mysql>());
    #[cfg(feature = "sqlite")]
    targets.push(Registration::of::<sql::Sqlite>());
    targets
}

fn main() -> ExitCode {
    harness::main(registered())
}
