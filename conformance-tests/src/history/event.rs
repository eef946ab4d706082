//! The recorded history: what workers reported and what the nemesis did, each stamped by
//! the checker's one monotonic clock when the register received or did it.

use std::fmt;
use std::time::Duration;

use lockcore::{Claim, ClaimMode};

/// One worker process (one incarnation: a worker killed and respawned gets a new id).
pub type WorkerId = u32;

/// One entry of a history: when (since the run started, by the checker's clock) and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// When the register received the report (or the nemesis acted), since the start.
    pub at: Duration,
    /// What happened.
    pub kind: EventKind,
}

/// What a worker reported or the nemesis did.
///
/// A worker's reports of one attempt come in this order: [`Invoke`](Self::Invoke) (acked
/// *before* the worker sends the acquire), then [`Acquired`](Self::Acquired) (after the
/// grant) or [`AcquireFailed`](Self::AcquireFailed); under the lock [`Read`](Self::Read),
/// [`Write`](Self::Write), possibly [`Lost`](Self::Lost); then
/// [`ReleaseInvoked`](Self::ReleaseInvoked) (acked *before* the worker sends the release)
/// and [`Released`](Self::Released).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The worker is about to send an acquire for the key.
    Invoke {
        /// The worker.
        worker: WorkerId,
    },
    /// The worker holds the key with this fencing token: the whole key, a reader's share or
    /// a semaphore's permits.
    Acquired {
        /// The worker.
        worker: WorkerId,
        /// The grant's fencing token.
        token: u64,
        /// What the grant takes of the key's capacity.
        claim: Claim,
    },
    /// The acquire failed (timeout, store unavailable, …).
    AcquireFailed {
        /// The worker.
        worker: WorkerId,
        /// The error, as displayed.
        error: String,
    },
    /// A fenced read of the register: `Ok(value)` if accepted, `Err(highest)` if the token
    /// was below the highest the register had seen.
    Read {
        /// The worker.
        worker: WorkerId,
        /// The token the read carried.
        token: u64,
        /// The value read, or the highest token seen when rejected.
        outcome: Result<u64, u64>,
    },
    /// A fenced write of `value` to the register.
    Write {
        /// The worker.
        worker: WorkerId,
        /// The token the write carried.
        token: u64,
        /// The value written (the value read plus one).
        value: u64,
        /// Whether the register accepted it.
        accepted: bool,
    },
    /// The guard's `lost()` fired during the hold, `ago` before the report.
    Lost {
        /// The worker.
        worker: WorkerId,
        /// How long before the report `lost()` fired (by the worker's clock).
        ago: Duration,
    },
    /// The worker is about to send the release.
    ReleaseInvoked {
        /// The worker.
        worker: WorkerId,
    },
    /// The release returned (its outcome or error, as displayed).
    Released {
        /// The worker.
        worker: WorkerId,
        /// The outcome.
        outcome: String,
    },
    /// A worker process was started (its reports follow).
    Spawned {
        /// The new worker.
        worker: WorkerId,
        /// Its process id.
        pid: u32,
    },
    /// The worker's connection to the register closed (it exited or was killed).
    Gone {
        /// The worker.
        worker: WorkerId,
    },
    /// Nemesis: SIGSTOP sent to the worker.
    Paused {
        /// The worker.
        worker: WorkerId,
    },
    /// Nemesis: SIGCONT sent to the worker (a fault heals).
    Resumed {
        /// The worker.
        worker: WorkerId,
    },
    /// Nemesis: SIGKILL sent to the worker. Its hold, if any, ends here in the history.
    Killed {
        /// The worker.
        worker: WorkerId,
    },
    /// Nemesis: the worker's connections to the store are cut off in both directions
    /// (held, not closed), as by a network partition.
    Partitioned {
        /// The worker.
        worker: WorkerId,
    },
    /// Nemesis: the worker's partition heals (what it sent and was sent meanwhile is
    /// delivered, as TCP delivers it after a partition).
    Healed {
        /// The worker.
        worker: WorkerId,
    },
    /// Nemesis: the store's wall clock is about to be set to the real time plus `offset_ms`.
    ClockSet {
        /// The new offset of the store's clock, in milliseconds (negative: behind).
        offset_ms: i64,
    },
    /// Nemesis: the store restart begins.
    StoreDown,
    /// Nemesis: the store restart finished (a fault heals).
    StoreUp,
    /// The run ends: the workers are stopped. Holds still open end here.
    End,
}

impl EventKind {
    /// The worker the event is about, if any.
    pub fn worker(&self) -> Option<WorkerId> {
        use EventKind::*;
        match self {
            Invoke { worker }
            | Acquired { worker, .. }
            | AcquireFailed { worker, .. }
            | Read { worker, .. }
            | Write { worker, .. }
            | Lost { worker, .. }
            | ReleaseInvoked { worker }
            | Released { worker, .. }
            | Spawned { worker, .. }
            | Gone { worker }
            | Paused { worker }
            | Resumed { worker }
            | Partitioned { worker }
            | Healed { worker }
            | Killed { worker } => Some(*worker),
            ClockSet { .. } | StoreDown | StoreUp | End => None,
        }
    }
}

/// What a claim holds, as a suffix of a report line: nothing for the whole key.
pub(crate) struct Held<'a>(pub &'a Claim);

impl fmt::Display for Held<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.mode() {
            ClaimMode::Exclusive => Ok(()),
            ClaimMode::Shared => f.write_str(" (shared)"),
            _ => write!(f, " ({} of {} permits)", self.0.weight(), self.0.capacity()),
        }
    }
}

/// A duration as milliseconds with one decimal, the unit of every report line.
pub(crate) struct Ms(pub Duration);

impl fmt::Display for Ms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1} ms", self.0.as_secs_f64() * 1000.0)
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:>9.3} s] ", self.at.as_secs_f64())?;
        use EventKind::*;
        match &self.kind {
            Invoke { worker } => write!(f, "w{worker} invoke acquire"),
            Acquired {
                worker,
                token,
                claim,
            } => write!(f, "w{worker} acquired token {token}{}", Held(claim)),
            AcquireFailed { worker, error } => write!(f, "w{worker} acquire failed: {error}"),
            Read {
                worker,
                token,
                outcome: Ok(v),
            } => write!(f, "w{worker} read {v} with token {token}"),
            Read {
                worker,
                token,
                outcome: Err(h),
            } => write!(
                f,
                "w{worker} read with token {token} REJECTED (highest {h})"
            ),
            Write {
                worker,
                token,
                value,
                accepted,
            } => write!(
                f,
                "w{worker} write {value} with token {token} {}",
                if *accepted { "accepted" } else { "REJECTED" }
            ),
            Lost { worker, ago } => write!(f, "w{worker} lost() fired {} before", Ms(*ago)),
            ReleaseInvoked { worker } => write!(f, "w{worker} invoke release"),
            Released { worker, outcome } => write!(f, "w{worker} released: {outcome}"),
            Spawned { worker, pid } => write!(f, "w{worker} spawned (pid {pid})"),
            Gone { worker } => write!(f, "w{worker} disconnected"),
            Paused { worker } => write!(f, "nemesis: SIGSTOP w{worker}"),
            Resumed { worker } => write!(f, "nemesis: SIGCONT w{worker}"),
            Killed { worker } => write!(f, "nemesis: SIGKILL w{worker}"),
            Partitioned { worker } => write!(f, "nemesis: w{worker} cut off from the store"),
            Healed { worker } => write!(f, "nemesis: w{worker}'s partition heals"),
            ClockSet { offset_ms } => {
                write!(
                    f,
                    "nemesis: the store's clock set to real time {offset_ms:+} ms"
                )
            }
            StoreDown => write!(f, "nemesis: store restart begins"),
            StoreUp => write!(f, "nemesis: store restarted"),
            End => write!(f, "end of run"),
        }
    }
}
