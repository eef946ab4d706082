//! One hold in the store, shared by every reentrant guard on it: its lease, its signals,
//! and its renewal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::lease::{lost_margin, now_on, valid_until, AtomicInstant};
use crate::metrics::{Meter, RenewalOutcome};
use crate::watchdog::{self, align, Schedule, Watch, Watched, BATCHES_IN_FLIGHT};
use crate::{
    Claim, ClockSource, ErrorChain, ExtendOutcome, FencingToken, Grant, LockBackend, LockError,
    LockKey, Operation, Owner, Renewal,
};

/// Who holds what: the key, the owner, and the claim.
pub(crate) struct Holder {
    pub(crate) key: LockKey,
    pub(crate) owner: Owner,
    pub(crate) claim: Claim,
}

/// One hold in the store, shared by every reentrant guard on it.
pub(crate) struct Hold {
    pub(crate) key: LockKey,
    pub(crate) owner: Owner,
    /// What the hold takes of the key; re-entry must ask the same.
    pub(crate) claim: Claim,
    pub(crate) token: FencingToken,
    pub(crate) ttl: Duration,
    valid_until: AtomicInstant,
    /// Set when the hold is known (or must be assumed) lost.
    lost: AtomicBool,
    /// What only a watched hold needs, made on first use: a hold nobody watches costs
    /// neither (see [`Watchers`]).
    watchers: OnceLock<Box<Watchers>>,
    /// Set when the hold is released: the watchdog stops. A flag, not a token: nothing
    /// awaits it, and the watchdog reads it for every hold it renews, where a token's node
    /// would be an allocation per hold and a mutex per read (lockbench `redis --case
    /// scale_holds --scale-holds 100000` shows the watchdog's CPU).
    stopped: AtomicBool,
    /// Orders `stop` and `lost`: once the hold is released, `lost()` never fires (a renewal
    /// answered, or a deadline reached, just as the release began must not report a loss
    /// after the caller saw the release).
    signals: Mutex<()>,
    pub(crate) runtime: Handle,
    pub(crate) backend: Arc<dyn LockBackend>,
    /// Whether the watchdog renews the lease.
    pub(crate) renew: bool,
    /// Whether the backend renews batches in one request
    /// ([`Capabilities::batched_renewals`](crate::Capabilities::batched_renewals)): the
    /// hold's renewals then fall on the watchdog's grid, to be batched with others.
    pub(crate) batched: bool,
    /// Whether the backend keeps its leases on tokio's clock
    /// ([`ClockSource::Tokio`](crate::driver::ClockSource::Tokio)): the runtime's timers
    /// then time the hold, so a paused test clock moves it.
    tokio_clock: bool,
    /// The hold's identity in the watchdog's schedule.
    id: u64,
    watch: Mutex<Watch>,
    /// What the client records about its locks.
    pub(crate) meter: Meter,
    /// When the store granted the hold (the answer's arrival).
    pub(crate) granted: Instant,
    /// Counted in the meter's holds until stopped or dropped.
    counted: AtomicBool,
}

/// The signals of a hold that someone watches.
#[derive(Default)]
struct Watchers {
    /// Cancelled when the hold is lost; made on first use (`lost()`, `lost_token()`), so a
    /// hold nobody watches costs no token (112 bytes and an allocation per hold).
    lost_signal: OnceLock<CancellationToken>,
    /// Whether renewals are going through (see [`LockHandle::renewal_failing`]); made on
    /// first use (a failed renewal or an observer), so a hold costs no channel until then.
    health: OnceLock<tokio::sync::watch::Sender<RenewalHealth>>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("valid_until", &self.valid_until())
            .field("backend", &self.backend.name())
            .finish_non_exhaustive()
    }
}

/// Whether a hold's renewals are going through: the early warning before
/// [`LockHandle::lost`](crate::LockHandle::lost).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenewalHealth {
    /// No renewal has failed since the last one that succeeded (or since the lock was taken).
    Renewing,
    /// Renewals have been failing since `since`; they are retried until one succeeds or the
    /// lock must be assumed lost (at the latest shortly before
    /// [`valid_until`](crate::LockHandle::valid_until)).
    Failing {
        /// When the first failure of this run happened.
        since: Instant,
        /// Failed renewals in a row.
        failures: u32,
        /// The last failure, with its causes, on one line.
        last_error: String,
    },
}

impl RenewalHealth {
    /// Whether renewals are failing.
    pub fn is_failing(&self) -> bool {
        matches!(self, RenewalHealth::Failing { .. })
    }
}

impl Hold {
    /// A new hold of `key` by `owner`, granted by an attempt sent at `attempt_started` and
    /// answered at `granted`, watched by the watchdog (renewed if `renew`).
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] if the watchdog cannot run (the operating system refused to
    /// start its thread).
    pub(crate) fn start(
        backend: Arc<dyn LockBackend>,
        meter: Meter,
        Holder { key, owner, claim }: Holder,
        renew: bool,
        (attempt_started, granted): (Instant, Instant),
        grant: Grant,
        runtime: &Handle,
    ) -> Result<Arc<Hold>, LockError> {
        let schedule = schedule()?;
        meter.granted(&key, claim.mode());
        let caps = backend.capabilities();
        let batched = caps.batched_renewals;
        let tokio_clock = caps.clock == ClockSource::Tokio;
        let interval = grant.ttl / 3;
        let first_renewal = granted + interval;
        let hold = Arc::new(Hold {
            key,
            owner,
            claim,
            token: grant.token,
            ttl: grant.ttl,
            valid_until: AtomicInstant::new(valid_until(
                attempt_started,
                grant.ttl,
                grant.valid_until,
            )),
            lost: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            signals: Mutex::new(()),
            runtime: runtime.clone(),
            backend,
            renew,
            batched,
            tokio_clock,
            id: watchdog::next_id(),
            watch: Mutex::new(Watch::new(if batched {
                align(first_renewal, interval)
            } else {
                first_renewal
            })),
            meter,
            granted,
            counted: AtomicBool::new(true),
            watchers: OnceLock::new(),
        });
        schedule.start(&hold);
        Ok(hold)
    }

    /// Stops the watchdog: the hold is being released.
    pub(crate) fn stop(&self) {
        self.uncount();
        {
            let _order = self.signals.lock().unwrap_or_else(|e| e.into_inner());
            self.stopped.store(true, Ordering::Release);
        }
        if let Ok(schedule) = schedule() {
            schedule.stop(self);
        }
    }

    /// The hold no longer counts among the process's holds (once, whichever comes first of
    /// its release and its drop).
    fn uncount(&self) {
        if self.counted.swap(false, Ordering::Relaxed) {
            self.meter.hold_ended(&self.key);
        }
    }

    /// The store renewed the lease with an extension sent at `started`: the lease runs on
    /// (never shortened) and renewals are healthy.
    pub(crate) fn extended(&self, started: Instant, grant: &Grant) {
        self.valid_until
            .raise(valid_until(started, grant.ttl, grant.valid_until));
        self.renewed();
    }

    /// Now, on the clock of the hold's store (see [`now_on`]).
    pub(crate) fn now(&self) -> Instant {
        now_on(if self.tokio_clock {
            ClockSource::Tokio
        } else {
            ClockSource::Local
        })
    }

    /// When the hold must be assumed lost if renewals keep failing.
    pub(crate) fn lost_at(&self) -> Instant {
        let end = self.valid_until();
        end.checked_sub(lost_margin(self.ttl)).unwrap_or(end)
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.valid_until.load()
    }

    fn watchers(&self) -> &Watchers {
        self.watchers.get_or_init(Box::default)
    }

    /// Fires `lost()`, unless the hold was released first.
    pub(crate) fn mark_lost(&self) {
        let _order = self.signals.lock().unwrap_or_else(|e| e.into_inner());
        if !self.is_lost() && !self.stopped.load(Ordering::Acquire) {
            tracing::warn!(key = %self.key, token = %self.token, "lock lost");
            self.meter.lost(&self.key);
            // Under `signals`, as the signal is made: made before, it is cancelled here;
            // made after, it sees the flag.
            self.lost.store(true, Ordering::SeqCst);
            if let Some(signal) = self.watchers.get().and_then(|w| w.lost_signal.get()) {
                signal.cancel();
            }
        }
    }

    /// Whether the hold was found (or assumed) lost.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// The signal cancelled when the hold is lost (already cancelled if it is).
    pub(crate) fn lost_signal(&self) -> &CancellationToken {
        let _order = self.signals.lock().unwrap_or_else(|e| e.into_inner());
        let signal = self
            .watchers()
            .lost_signal
            .get_or_init(CancellationToken::new);
        if self.is_lost() {
            signal.cancel();
        }
        signal
    }

    pub(crate) fn health(&self) -> &tokio::sync::watch::Sender<RenewalHealth> {
        self.watchers()
            .health
            .get_or_init(|| tokio::sync::watch::Sender::new(RenewalHealth::Renewing))
    }

    /// A renewal went through: renewals are healthy (again).
    fn renewed(&self) {
        let Some(health) = self.watchers.get().and_then(|w| w.health.get()) else {
            return; // never failed, nobody watching
        };
        health.send_if_modified(|h| {
            let was_failing = h.is_failing();
            if was_failing {
                tracing::info!(key = %self.key, token = %self.token, "lock renewal recovered");
            }
            *h = RenewalHealth::Renewing;
            was_failing
        });
    }

    /// A renewal failed with `error` (the hold may still be valid).
    pub(crate) fn renewal_failed(&self, error: String) {
        self.health().send_modify(|h| {
            *h = match h {
                RenewalHealth::Failing {
                    since, failures, ..
                } => RenewalHealth::Failing {
                    since: *since,
                    failures: failures.saturating_add(1),
                    last_error: error,
                },
                RenewalHealth::Renewing => RenewalHealth::Failing {
                    since: self.now(),
                    failures: 1,
                    last_error: error,
                },
            }
        });
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.uncount();
    }
}

/// The process's schedule of holds, starting its thread the first time.
///
/// # Errors
///
/// [`LockError::Backend`] if the operating system refuses to start the thread.
pub(crate) fn schedule() -> Result<&'static Schedule<Hold>, LockError> {
    static SCHEDULE: std::sync::OnceLock<Result<&'static Schedule<Hold>, String>> =
        std::sync::OnceLock::new();
    SCHEDULE
        .get_or_init(watchdog::start::<Hold>)
        .as_ref()
        .map(|s| *s)
        .map_err(|e| LockError::backend("lockcore", format!("cannot start the watchdog: {e}")))
}

impl Watched for Hold {
    fn watch(&self) -> &Mutex<Watch> {
        &self.watch
    }

    fn watch_id(&self) -> u64 {
        self.id
    }

    fn renews(&self) -> bool {
        self.renew
    }

    fn lost_at(&self) -> Instant {
        Hold::lost_at(self)
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    fn mark_lost(&self) {
        Hold::mark_lost(self)
    }

    fn timed_by(&self) -> Option<&Handle> {
        self.tokio_clock.then_some(&self.runtime)
    }

    fn batch_key(&self) -> Option<(usize, tokio::runtime::Id)> {
        self.batched.then(|| {
            let backend = Arc::as_ptr(&self.backend).cast::<()>() as usize;
            (backend, self.runtime.id())
        })
    }

    fn start_renewals(schedule: &'static Schedule<Hold>, batches: Vec<Vec<Arc<Hold>>>) {
        let Some(first) = batches.first().and_then(|b| b.first()) else {
            return;
        };
        let runtime = first.runtime.clone();
        let turns = first.batch_key().map(batch_turns);
        for batch in batches {
            let turns = turns.clone();
            runtime.spawn(async move {
                // Waits its turn among every batch of the backend in flight, this round's
                // and an earlier round's still running.
                let _turn = match turns {
                    Some(turns) => turns.acquire_owned().await.ok(),
                    None => None,
                };
                renew_batch(schedule, batch).await;
            });
        }
    }
}

/// The turns of one backend's renewal batches on one runtime (a batch key): at most
/// [`BATCHES_IN_FLIGHT`] at once, across renewal rounds (a round that falls due while an
/// earlier one still runs waits behind it), served in order.
fn batch_turns(key: (usize, tokio::runtime::Id)) -> Arc<tokio::sync::Semaphore> {
    type Turns = HashMap<(usize, tokio::runtime::Id), Weak<tokio::sync::Semaphore>>;
    static TURNS: OnceLock<Mutex<Turns>> = OnceLock::new();
    let mut turns = TURNS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(live) = turns.get(&key).and_then(Weak::upgrade) {
        return live;
    }
    // Kept only while batches hold them: the next round starts afresh.
    turns.retain(|_, t| t.strong_count() > 0);
    let fresh = Arc::new(tokio::sync::Semaphore::new(BATCHES_IN_FLIGHT));
    turns.insert(key, Arc::downgrade(&fresh));
    fresh
}

/// One renewal of each of `holds` (all of one backend), in one
/// [`renew`](LockBackend::renew) request bounded so that a hung store cannot
/// hold up the next attempt. Each hold takes its own outcome: renewed, lost, or retried
/// soon; a hold released meanwhile takes none.
pub(crate) async fn renew_batch(schedule: &'static Schedule<Hold>, holds: Vec<Arc<Hold>>) {
    let Some(backend) = holds.first().map(|h| h.backend.clone()) else {
        return;
    };
    let attempt_timeout =
        crate::lease::renewal_allowance(holds.iter().map(|h| h.ttl).min().unwrap_or_default());
    let batch_span = tracing::debug_span!(
        "distlock.renew_batch",
        backend = backend.name(),
        holds = holds.len(),
    );
    let spans: Vec<tracing::Span> = holds
        .iter()
        .map(|hold| {
            tracing::debug_span!(
                parent: &batch_span,
                "distlock.renew",
                key = %hold.key,
                backend = hold.backend.name(),
                token = hold.token.get(),
                outcome = tracing::field::Empty,
            )
        })
        .collect();
    let started = holds.first().map_or_else(Instant::now, |h| h.now());
    let answer = {
        let renewals: Vec<Renewal<'_>> = holds
            .iter()
            .map(|h| Renewal::new(&h.key, &h.owner, h.ttl))
            .collect();
        tokio::time::timeout(attempt_timeout, backend.renew(&renewals))
            .instrument(batch_span.clone())
            .await
    };
    let outcomes: Vec<Result<ExtendOutcome, LockError>> = match answer {
        Ok(Ok(outcomes)) if outcomes.len() == holds.len() => outcomes,
        Ok(Ok(outcomes)) => {
            let wrong = outcomes.len();
            holds
                .iter()
                .map(|_| {
                    Err(LockError::backend(
                        backend.name(),
                        format!(
                            "the store answered {wrong} outcomes to {} renewals",
                            holds.len()
                        ),
                    ))
                })
                .collect()
        }
        Ok(Err(e)) => {
            let error = ErrorChain(&e).to_string();
            let retryable = e.is_retryable();
            holds
                .iter()
                .map(|_| {
                    Err(if retryable {
                        LockError::unavailable(backend.name(), error.clone())
                    } else {
                        LockError::backend(backend.name(), error.clone())
                    })
                })
                .collect()
        }
        Err(_) => {
            for (hold, span) in holds.iter().zip(&spans) {
                renewal_timed_out(schedule, hold, attempt_timeout, span);
            }
            return;
        }
    };
    for ((hold, span), outcome) in holds.iter().zip(&spans).zip(outcomes) {
        renewed(schedule, hold, started, outcome, span);
    }
}

/// Takes the answer to one hold's renewal sent at `started`.
fn renewed(
    schedule: &'static Schedule<Hold>,
    hold: &Arc<Hold>,
    started: Instant,
    outcome: Result<ExtendOutcome, LockError>,
    span: &tracing::Span,
) {
    if hold.is_stopped() {
        // Released while the renewal was in flight: its answer means nothing any more.
        return;
    }
    let recorded = match &outcome {
        Ok(ExtendOutcome::Extended(_)) => RenewalOutcome::Extended,
        Ok(ExtendOutcome::NotHeld) => RenewalOutcome::NotHeld,
        Err(_) => RenewalOutcome::Failed,
    };
    span.record("outcome", recorded.as_str());
    hold.meter.renewal(&hold.key, recorded);
    let interval = hold.ttl / 3;
    let next = match outcome {
        Ok(ExtendOutcome::Extended(grant)) => {
            hold.extended(started, &grant);
            if hold.batched {
                align(started + interval, interval)
            } else {
                started + interval
            }
        }
        Ok(ExtendOutcome::NotHeld) => {
            hold.mark_lost();
            schedule.stop(hold);
            return;
        }
        Err(e) => {
            hold.meter.store_error(&hold.key, Operation::Renew, &e);
            let e = e.during(Operation::Renew, &hold.key);
            let error = ErrorChain(&e).to_string();
            tracing::warn!(key = %hold.key, %error, "lock renewal failed; retrying");
            hold.renewal_failed(error);
            hold.now() + interval / 4
        }
    };
    schedule.renewal_done(hold, next);
}

/// One hold's renewal got no answer within `attempt_timeout`: retried soon.
fn renewal_timed_out(
    schedule: &'static Schedule<Hold>,
    hold: &Arc<Hold>,
    attempt_timeout: Duration,
    span: &tracing::Span,
) {
    if hold.is_stopped() {
        return;
    }
    span.record("outcome", RenewalOutcome::Failed.as_str());
    hold.meter.renewal(&hold.key, RenewalOutcome::Failed);
    let silent = LockError::unavailable(
        hold.backend.name(),
        format!("no answer within {attempt_timeout:?}"),
    );
    hold.meter.store_error(&hold.key, Operation::Renew, &silent);
    tracing::warn!(key = %hold.key, timeout = ?attempt_timeout, "lock renewal timed out; retrying");
    hold.renewal_failed(format!(
        "renewing {:?}: no answer from {} within {attempt_timeout:?}",
        hold.key.as_str(),
        hold.backend.name()
    ));
    schedule.renewal_done(hold, hold.now() + hold.ttl / 12);
}
