//! The offline check: a pure function from a recorded history to a [`Report`].
//!
//! A *grant* is an `Acquired` report with the worker's preceding `Invoke`. Its observed hold
//! is `[acquired, end]`, where `end` is the worker's `ReleaseInvoked`, or the moment it was
//! killed or disconnected, or the end of the run. Because a worker reports `Invoke` and
//! `ReleaseInvoked` and waits for the register's ack *before* it sends the request, and
//! reports `Acquired` only after the grant, the observed hold lies inside the true hold in
//! the store — as long as the lease did not end early. A lease ends early only through a
//! fault, and the checks below allow exactly those faults and no others.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use lockcore::Claim;

use super::event::{Event, EventKind, Held, Ms, WorkerId};
use super::report::{Check, Report, Stats, Violation};

/// What the checker needs to know beyond the history.
#[derive(Clone, Copy, Debug)]
pub struct CheckConfig {
    /// After each fault heals (SIGCONT, respawn after SIGKILL, store back up), some worker
    /// must acquire within this.
    pub liveness_bound: Duration,
    /// How late `lost()` may fire after the store let the lease go (a timer late on a
    /// loaded machine): a loss reported later than this after another grant began does not
    /// explain their overlap.
    pub lost_late: Duration,
}

/// A grant reconstructed from the history.
#[derive(Clone, Debug)]
struct Grant {
    worker: WorkerId,
    token: u64,
    /// What it takes of the key's capacity.
    claim: Claim,
    /// When the worker's acquire was invoked (recorded before it was sent).
    invoked: Duration,
    /// When the grant was reported.
    acquired: Duration,
    /// When the observed hold ended.
    end: Option<Duration>,
    /// When `lost()` fired for it, if it did.
    lost: Option<Duration>,
}

/// A stretch of time a fault lasted: `[from, to]`.
#[derive(Clone, Copy, Debug)]
struct Window {
    from: Duration,
    to: Duration,
}

struct Parsed {
    grants: Vec<Grant>,
    /// The grant each event belongs to (reads, writes), by event index.
    grant_of: HashMap<usize, usize>,
    pauses: HashMap<WorkerId, Vec<Window>>,
    restarts: Vec<Window>,
    /// Heals: what healed and when.
    heals: Vec<(String, Duration)>,
    end: Duration,
}

fn parse(history: &[Event], stats: &mut Stats) -> Parsed {
    // Nothing after the end of the run counts (the workers are being stopped).
    let history = match history.iter().position(|e| e.kind == EventKind::End) {
        Some(end) => &history[..=end],
        None => history,
    };
    let end = history.last().map_or(Duration::ZERO, |e| e.at);
    let mut p = Parsed {
        grants: Vec::new(),
        grant_of: HashMap::new(),
        pauses: HashMap::new(),
        restarts: Vec::new(),
        heals: Vec::new(),
        end,
    };
    let mut invoked: HashMap<WorkerId, Duration> = HashMap::new();
    let mut current: HashMap<WorkerId, usize> = HashMap::new();
    let mut last_grant: HashMap<WorkerId, usize> = HashMap::new();
    let mut paused_since: HashMap<WorkerId, Duration> = HashMap::new();
    let mut down_since: Option<Duration> = None;
    let mut killed_at: Option<Duration> = None;
    let mut workers = std::collections::BTreeSet::new();
    for (i, e) in history.iter().enumerate() {
        if let Some(w) = e.kind.worker() {
            workers.insert(w);
        }
        let mut close = |current: &mut HashMap<WorkerId, usize>, w: WorkerId| {
            if let Some(g) = current.remove(&w) {
                p.grants[g].end = Some(e.at);
            }
        };
        match &e.kind {
            EventKind::Invoke { worker } => {
                invoked.insert(*worker, e.at);
            }
            EventKind::Acquired {
                worker,
                token,
                claim,
            } => {
                stats.grants += 1;
                close(&mut current, *worker);
                let inv = invoked.remove(worker).unwrap_or(e.at).min(e.at);
                p.grants.push(Grant {
                    worker: *worker,
                    token: *token,
                    claim: *claim,
                    invoked: inv,
                    acquired: e.at,
                    end: None,
                    lost: None,
                });
                current.insert(*worker, p.grants.len() - 1);
                last_grant.insert(*worker, p.grants.len() - 1);
            }
            EventKind::AcquireFailed { worker, error } => {
                stats.failed_acquires += 1;
                if stats.first_failure.is_none() {
                    stats.first_failure = Some(format!("w{worker} at {}: {error}", at(e.at)));
                }
                invoked.remove(worker);
            }
            EventKind::Read {
                worker, outcome, ..
            } => {
                if outcome.is_err() {
                    stats.reads_rejected += 1;
                }
                if let Some(g) = current.get(worker) {
                    p.grant_of.insert(i, *g);
                }
            }
            EventKind::Write {
                worker, accepted, ..
            } => {
                if *accepted {
                    stats.writes_accepted += 1;
                } else {
                    stats.writes_rejected += 1;
                }
                if let Some(g) = current.get(worker) {
                    p.grant_of.insert(i, *g);
                }
            }
            EventKind::Lost { worker, ago } => {
                stats.lost += 1;
                if let Some(g) = current.get(worker).or(last_grant.get(worker)) {
                    p.grants[*g].lost = Some(e.at.saturating_sub(*ago));
                }
            }
            EventKind::ReleaseInvoked { worker } | EventKind::Gone { worker } => {
                close(&mut current, *worker)
            }
            EventKind::Killed { worker } => {
                stats.kills += 1;
                close(&mut current, *worker);
                killed_at = Some(e.at);
            }
            EventKind::Released { .. } => {}
            EventKind::Spawned { worker, .. } => {
                if killed_at.take().is_some() {
                    p.heals
                        .push((format!("respawn of a killed worker as w{worker}"), e.at));
                }
            }
            EventKind::Paused { worker } => {
                stats.pauses += 1;
                paused_since.insert(*worker, e.at);
            }
            EventKind::Resumed { worker } => {
                if let Some(from) = paused_since.remove(worker) {
                    let w = Window { from, to: e.at };
                    p.pauses.entry(*worker).or_default().push(w);
                }
                p.heals.push((format!("SIGCONT of w{worker}"), e.at));
            }
            // A partition excuses nothing: the holder's `lost()` must fire before anyone
            // else is granted the key, and its late writes must be refused by the fence.
            EventKind::Partitioned { .. } => stats.partitions += 1,
            EventKind::Healed { worker } => {
                p.heals.push((format!("the partition of w{worker}"), e.at));
            }
            // A clock step excuses nothing either: what it breaks is what the report is
            // for (clock-assisted tokens and leases rest on the store's clock).
            EventKind::ClockSet { offset_ms } => {
                stats.clock_steps.push((e.at, *offset_ms));
                p.heals
                    .push((format!("the clock step to {offset_ms:+} ms"), e.at));
            }
            EventKind::StoreDown => down_since = Some(e.at),
            EventKind::StoreUp => {
                stats.restarts += 1;
                let from = down_since.take().unwrap_or(e.at);
                p.restarts.push(Window { from, to: e.at });
                p.heals.push(("the store restart".to_owned(), e.at));
            }
            EventKind::End => {
                for (_, g) in current.drain() {
                    p.grants[g].end = Some(e.at);
                }
            }
        }
    }
    if let Some(k) = killed_at {
        p.heals.push(("a kill (no respawn)".to_owned(), k));
    }
    // A pause never resumed lasts to the end; so does a restart that never finished.
    for (w, from) in paused_since {
        p.pauses
            .entry(w)
            .or_default()
            .push(Window { from, to: end });
    }
    if let Some(from) = down_since {
        p.restarts.push(Window { from, to: end });
    }
    for g in &mut p.grants {
        g.end.get_or_insert(end);
    }
    stats.workers = workers.len();
    stats.duration = end;
    p
}

fn at(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// Checks a recorded history. Pure: the same history always gives the same report.
///
/// * **tokens unique** — no token belongs to two grants.
/// * **tokens increase in grant order** — if grant A was reported (`Acquired` received)
///   before B's acquire was invoked (`Invoke` received), A's grant really preceded B's
///   request, so A's token must be lower.
/// * **mutual exclusion** — when a grant is reported, it fits the key's capacity beside
///   every observed hold `[acquired, end]` it overlaps, except those whose overlap with it
///   a fault explains: `lost()` fired for one of the two, or one of the two workers was
///   paused (SIGSTOP) at some time between its own `Invoke` and the later of the two
///   `Acquired` reports, or the store was restarting at some time between the earlier of
///   the two `Invoke`s and the later `Acquired`. (A killed worker's hold ends at the kill.)
///   For exclusive locks: no two holds overlap. For a read-write key: readers overlap one
///   another, a writer overlaps nobody. For a semaphore of `n`: never more than `n` permits
///   out. Grants of two capacities never overlap (a store refuses the second).
/// * **no stale write accepted** — a write of grant A is accepted only if no grant B that
///   used the register (an accepted read or write) before it has a higher token or was
///   invoked after A was reported: such a B superseded A, and the fence must refuse A.
/// * **no lost update** — each accepted write is the previous accepted value plus one.
/// * **liveness after faults** — after each heal (SIGCONT, a partition healed, respawn after
///   a kill, store back up) a grant is reported within [`CheckConfig::liveness_bound`]; and at least one
///   grant overall.
pub fn check(history: &[Event], config: &CheckConfig) -> Report {
    let mut report = Report::default();
    let history = match history.iter().position(|e| e.kind == EventKind::End) {
        Some(end) => &history[..=end],
        None => history,
    };
    let p = parse(history, &mut report.stats);
    let v = &mut report.violations;
    unique_tokens(&p, v);
    token_order(&p, v);
    mutual_exclusion(&p, config, &mut report.stats, v);
    register_checks(history, &p, v);
    liveness(history, &p, config, &mut report.stats, v);
    report
}

fn unique_tokens(p: &Parsed, v: &mut Vec<Violation>) {
    let mut by_token: BTreeMap<u64, Vec<&Grant>> = BTreeMap::new();
    for g in &p.grants {
        by_token.entry(g.token).or_default().push(g);
    }
    let mut dups: Vec<(u64, Vec<&Grant>)> =
        by_token.into_iter().filter(|(_, g)| g.len() > 1).collect();
    dups.sort_by_key(|(_, g)| g[1].acquired);
    for (token, grants) in dups {
        let list: Vec<String> = grants
            .iter()
            .map(|g| format!("w{} at {}", g.worker, at(g.acquired)))
            .collect();
        v.push(Violation {
            check: Check::UniqueTokens,
            detail: format!(
                "token {token} granted {} times: {}",
                grants.len(),
                list.join(", ")
            ),
        });
    }
}

fn token_order(p: &Parsed, v: &mut Vec<Violation>) {
    let mut by_acq: Vec<&Grant> = p.grants.iter().collect();
    by_acq.sort_by_key(|g| g.acquired);
    let mut by_inv: Vec<&Grant> = p.grants.iter().collect();
    by_inv.sort_by_key(|g| g.invoked);
    let mut next = 0;
    let mut top: Option<&Grant> = None;
    for b in by_inv {
        while next < by_acq.len() && by_acq[next].acquired < b.invoked {
            if top.is_none_or(|t| by_acq[next].token > t.token) {
                top = Some(by_acq[next]);
            }
            next += 1;
        }
        if let Some(a) = top.filter(|a| a.token >= b.token) {
            v.push(Violation {
                check: Check::TokenOrder,
                detail: format!(
                    "w{} got token {} (acquired at {}) before w{} asked (invoked at {}), \
                     yet w{} got token {} (acquired at {})",
                    a.worker,
                    a.token,
                    at(a.acquired),
                    b.worker,
                    at(b.invoked),
                    b.worker,
                    b.token,
                    at(b.acquired)
                ),
            });
        }
    }
}

/// Why the overlap of grants `a` and `b` (`a` reported first) is allowed, if it is.
fn explanation(p: &Parsed, config: &CheckConfig, a: &Grant, b: &Grant) -> Option<String> {
    let later = b.acquired.max(a.acquired);
    for g in [a, b] {
        let paused = p.pauses.get(&g.worker).into_iter().flatten();
        if paused.clone().any(|w| w.from < later && w.to > g.invoked) {
            return Some(format!("w{} paused past its lease", g.worker));
        }
    }
    let first = a.invoked.min(b.invoked);
    if p.restarts.iter().any(|w| w.from < later && w.to > first) {
        return Some("store restart".to_owned());
    }
    // `lost()` fires before the store lets a lease go (at the latest a margin before its
    // end), so it explains an overlap only if it fired before the later grant, give or take
    // a late timer; a loss noticed well after another client got the key (the holder's
    // next renewal finding it taken) is what a broken lock looks like.
    [a, b]
        .into_iter()
        .find(|g| {
            g.lost
                .is_some_and(|fired| fired <= later + config.lost_late)
        })
        .map(|g| format!("lost() fired for w{}", g.worker))
}

fn mutual_exclusion(p: &Parsed, config: &CheckConfig, stats: &mut Stats, v: &mut Vec<Violation>) {
    let mut order: Vec<&Grant> = p.grants.iter().collect();
    order.sort_by_key(|g| g.acquired);
    let mut open: Vec<&Grant> = Vec::new();
    for b in order {
        open.retain(|a| a.end.unwrap_or(p.end) > b.acquired);
        let mut beside: Vec<&Grant> = Vec::new();
        for a in &open {
            match explanation(p, config, a, b) {
                Some(why) => *stats.explained_overlaps.entry(why).or_default() += 1,
                None => beside.push(a),
            }
        }
        let used = beside
            .iter()
            .fold(0u64, |sum, a| sum.saturating_add(a.claim.weight()));
        let fits = b.claim.fits(used, 0) && beside.iter().all(|a| a.claim.same_capacity(&b.claim));
        if !fits {
            let held: Vec<String> = beside
                .iter()
                .map(|a| {
                    format!(
                        "w{} held token {}{} from {} to {}",
                        a.worker,
                        a.token,
                        Held(&a.claim),
                        at(a.acquired),
                        at(a.end.unwrap_or(p.end))
                    )
                })
                .collect();
            v.push(Violation {
                check: Check::MutualExclusion,
                detail: format!(
                    "{}; w{} acquired token {}{} at {} with no fault to explain it",
                    held.join("; "),
                    b.worker,
                    b.token,
                    Held(&b.claim),
                    at(b.acquired)
                ),
            });
        }
        open.push(b);
    }
}

/// Stale writes and lost updates, over the register's operations in the order it did them.
fn register_checks(history: &[Event], p: &Parsed, v: &mut Vec<Violation>) {
    // Over grants that used the register so far: the highest token, the latest invocation.
    let mut top_token: Option<&Grant> = None;
    let mut latest_invoked: Option<&Grant> = None;
    let mut value = 0u64;
    for (i, e) in history.iter().enumerate() {
        let (accepted, written) = match &e.kind {
            EventKind::Read { outcome, .. } => (outcome.is_ok(), None),
            EventKind::Write {
                accepted, value, ..
            } => (*accepted, Some(*value)),
            _ => continue,
        };
        if !accepted {
            continue;
        }
        let grant = p.grant_of.get(&i).map(|g| &p.grants[*g]);
        if let (Some(new), Some(a)) = (written, grant) {
            let superseded = top_token
                .filter(|b| b.token > a.token)
                .or(latest_invoked.filter(|b| b.invoked > a.acquired));
            if let Some(b) = superseded {
                v.push(Violation {
                    check: Check::StaleWrite,
                    detail: format!(
                        "w{}'s write of {new} with token {} accepted at {}, after w{} (token {}, \
                         invoked at {}, after w{} acquired at {}) had used the register",
                        a.worker,
                        a.token,
                        at(e.at),
                        b.worker,
                        b.token,
                        at(b.invoked),
                        a.worker,
                        at(a.acquired)
                    ),
                });
            }
        }
        if let Some(new) = written {
            if new != value.wrapping_add(1) {
                v.push(Violation {
                    check: Check::LostUpdate,
                    detail: format!(
                        "{} wrote {new} at {} but the previous accepted value was {value}",
                        e.kind.worker().map_or("?".to_owned(), |w| format!("w{w}")),
                        at(e.at)
                    ),
                });
            }
            value = new;
        }
        if let Some(g) = grant {
            if top_token.is_none_or(|t| g.token > t.token) {
                top_token = Some(g);
            }
            if latest_invoked.is_none_or(|t| g.invoked > t.invoked) {
                latest_invoked = Some(g);
            }
        }
    }
}

fn liveness(
    history: &[Event],
    p: &Parsed,
    config: &CheckConfig,
    stats: &mut Stats,
    v: &mut Vec<Violation>,
) {
    if p.grants.is_empty() {
        v.push(Violation {
            check: Check::Liveness,
            detail: "no worker ever acquired the lock".to_owned(),
        });
    }
    for (what, healed) in &p.heals {
        let next = history
            .iter()
            .find(|e| e.at > *healed && matches!(e.kind, EventKind::Acquired { .. }))
            .map(|e| e.at - *healed);
        stats.heal_latencies.push((what.clone(), next));
        match next {
            Some(l) if l <= config.liveness_bound => {}
            Some(l) => v.push(Violation {
                check: Check::Liveness,
                detail: format!(
                    "after {what} at {}, the next grant came only {} later (bound {})",
                    at(*healed),
                    Ms(l),
                    Ms(config.liveness_bound)
                ),
            }),
            None => v.push(Violation {
                check: Check::Liveness,
                detail: format!(
                    "after {what} at {}, no grant in the remaining {} of the run (bound {})",
                    at(*healed),
                    Ms(p.end.saturating_sub(*healed)),
                    Ms(config.liveness_bound)
                ),
            }),
        }
    }
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
