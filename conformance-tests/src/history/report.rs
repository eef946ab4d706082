//! What the checker reports: the checks, their violations, counts of the history.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::event::Ms;

/// One property of a history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    /// No fencing token is granted twice.
    UniqueTokens,
    /// A grant observed before another was requested has the lower token.
    TokenOrder,
    /// No two observed holds overlap unless a fault explains it.
    MutualExclusion,
    /// No write is accepted from a holder superseded by a grant that already used the
    /// register.
    StaleWrite,
    /// Every accepted write is the previous accepted value plus one.
    LostUpdate,
    /// After each fault heals some worker acquires within the bound.
    Liveness,
}

impl Check {
    /// Every check, in report order.
    pub const ALL: [Check; 6] = [
        Check::UniqueTokens,
        Check::TokenOrder,
        Check::MutualExclusion,
        Check::StaleWrite,
        Check::LostUpdate,
        Check::Liveness,
    ];

    /// The check's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Check::UniqueTokens => "tokens unique",
            Check::TokenOrder => "tokens increase in grant order",
            Check::MutualExclusion => "mutual exclusion",
            Check::StaleWrite => "no stale write accepted",
            Check::LostUpdate => "no lost update",
            Check::Liveness => "liveness after faults",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One finding of a failed check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The check that failed.
    pub check: Check,
    /// What was seen, with times and workers.
    pub detail: String,
}

/// Counts of what a history contains.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Worker processes (incarnations) seen.
    pub workers: usize,
    /// Grants (`Acquired` reports).
    pub grants: usize,
    /// Acquires that failed.
    pub failed_acquires: usize,
    /// The first failed acquire's error, for diagnosis.
    pub first_failure: Option<String>,
    /// Writes the register accepted.
    pub writes_accepted: usize,
    /// Writes the register rejected (stale token).
    pub writes_rejected: usize,
    /// Reads the register rejected (stale token).
    pub reads_rejected: usize,
    /// `lost()` reports.
    pub lost: usize,
    /// Workers paused (SIGSTOP).
    pub pauses: usize,
    /// Workers killed (SIGKILL).
    pub kills: usize,
    /// Store restarts.
    pub restarts: usize,
    /// Workers cut off from the store (network partitions).
    pub partitions: usize,
    /// The store's clock steps: when (since the start) and the new offset in milliseconds.
    pub clock_steps: Vec<(Duration, i64)>,
    /// Overlapping holds explained by a fault, by explanation.
    pub explained_overlaps: BTreeMap<String, usize>,
    /// Time from each heal to the next grant (`None`: none came).
    pub heal_latencies: Vec<(String, Option<Duration>)>,
    /// Length of the run.
    pub duration: Duration,
}

/// What the checker found: statistics, notes from the run, and violations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Counts of the history.
    pub stats: Stats,
    /// Every violation, in history order per check.
    pub violations: Vec<Violation>,
    /// Remarks of the run (a fault skipped and why).
    pub notes: Vec<String>,
}

impl Report {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The checks that failed, each once, in report order.
    pub fn failed_checks(&self) -> Vec<Check> {
        Check::ALL
            .into_iter()
            .filter(|c| self.violations.iter().any(|v| v.check == *c))
            .collect()
    }
}

/// How many violations of one check a report shows before summing up the rest.
const SHOWN: usize = 3;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        writeln!(
            f,
            "history: {} worker processes over {:.1} s, {} grants, {} failed acquires, {} lost() \
             reports; register: {} writes accepted, {} writes and {} reads rejected as stale",
            s.workers,
            s.duration.as_secs_f64(),
            s.grants,
            s.failed_acquires,
            s.lost,
            s.writes_accepted,
            s.writes_rejected,
            s.reads_rejected
        )?;
        if let Some(first) = &s.first_failure {
            writeln!(f, "first failed acquire: {first}")?;
        }
        writeln!(
            f,
            "faults: {} pause(s) past the TTL, {} partition(s) past the TTL, {} kill(s) with \
             respawn, {} store restart(s)",
            s.pauses, s.partitions, s.kills, s.restarts
        )?;
        if !s.clock_steps.is_empty() {
            let steps: Vec<String> = s
                .clock_steps
                .iter()
                .map(|(at, offset)| format!("{offset:+} ms at {:.3} s", at.as_secs_f64()))
                .collect();
            writeln!(f, "store clock set to real time {}", steps.join(", "))?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        if !s.explained_overlaps.is_empty() {
            let list: Vec<String> = s
                .explained_overlaps
                .iter()
                .map(|(why, n)| format!("{n} × {why}"))
                .collect();
            writeln!(
                f,
                "overlapping holds explained by faults: {}",
                list.join(", ")
            )?;
        }
        for (heal, latency) in &s.heal_latencies {
            match latency {
                Some(l) => writeln!(f, "after {heal}: next grant in {}", Ms(*l))?,
                None => writeln!(f, "after {heal}: no grant")?,
            }
        }
        for check in Check::ALL {
            let found: Vec<&Violation> = self
                .violations
                .iter()
                .filter(|v| v.check == check)
                .collect();
            if found.is_empty() {
                writeln!(f, "  ok      {check}")?;
                continue;
            }
            writeln!(f, "  FAILED  {check}: {} violation(s)", found.len())?;
            for v in found.iter().take(SHOWN) {
                writeln!(f, "            - {}", v.detail)?;
            }
            if found.len() > SHOWN {
                writeln!(f, "            - … and {} more", found.len() - SHOWN)?;
            }
        }
        if self.passed() {
            write!(f, "PASSED")
        } else {
            let names: Vec<&str> = self.failed_checks().iter().map(|c| c.name()).collect();
            write!(f, "FAILED: {}", names.join(", "))
        }
    }
}
