//! lockbench with the peer crates whose dependencies cannot share the workspace's build:
//! `distributed-lock-postgres` 0.2 beside the `postgres` target's rows. The harness, the
//! cases, the table and `results.json` are lockbench's own files (`benches/lockbench`),
//! compiled here as they are; only the list of backends is this crate's.
//!
//! ```text
//! cd benches/peers
//! cargo bench --bench peers -- postgres --case uncontended --case concurrent64 --case handoff
//! ```
//!
//! Why a crate of its own: see `README.md` beside this file.

// The harness serves every backend; this crate registers one, so some of it is unused.
#![allow(dead_code, unused_imports)]

#[path = "../lockbench/cases.rs"]
mod cases;
#[path = "../lockbench/harness.rs"]
mod harness;
#[path = "../lockbench/histogram.rs"]
mod histogram;
#[path = "../lockbench/plot.rs"]
mod plot;
#[path = "../lockbench/processes.rs"]
mod processes;
#[path = "../lockbench/report.rs"]
mod report;
#[path = "../lockbench/scale.rs"]
mod scale;
#[path = "../lockbench/shared.rs"]
mod shared;
#[path = "../lockbench/sql.rs"]
mod sql;
#[path = "../lockbench/target.rs"]
mod target;
#[path = "../lockbench/waiters.rs"]
mod waiters;

mod postgres_peer;

use std::process::ExitCode;

use harness::Registration;
// The shared modules reach the settings as `crate::Settings`.
use harness::Settings;

fn registered() -> Vec<Registration> {
    vec![Registration::of::<postgres_peer::PostgresPeers>()]
}

fn main() -> ExitCode {
    harness::main(registered())
}
