//! The acquisition, one request from its way in to its answer: the (key, owner) gate and
//! re-entry, the turn in the client's line for the key, attempts, waits for a release,
//! retries, the state shared with a wait deadline, and what a request hands to the
//! background when its caller goes away. One concept, so one file (docs/layout.md, "Long
//! files"), read top to bottom in the order a request lives.

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::OwnedMutexGuard;
use tracing::Instrument;

use crate::guard::{release_with_retry, LockGuard};
use crate::hold::{Hold, Holder};
use crate::inner::ClientInner;
use crate::metrics::AttemptOutcome;
use crate::notify::next_place;
use crate::retry::{jitter, Backoff};
use crate::slots::{Slot, SlotState};
use crate::starving::{self, STARVING_AFTER};
use crate::{
    AcquireOutcome, Claim, ClaimRequest, Contention, ErrorChain, Fairness, Grant, LockError,
    LockKey, Operation, Owner, RetryPolicy,
};

/// Consecutive wake-ups under a millisecond after which a waiter starts pausing.
const QUICK_WAKES_BEFORE_PAUSE: u32 = 16;

/// How long a waiter sleeps at most between attempts when the store told it nothing about
/// the holder (no remaining TTL): the backend's own wake-ups usually come much sooner.
const MAX_BLIND_WAIT: Duration = Duration::from_secs(1);

/// A request, validated: what the acquisition works with.
pub(crate) struct Validated {
    pub(crate) key: LockKey,
    pub(crate) owner: Owner,
    pub(crate) ttl: Duration,
    pub(crate) deadline: Option<Instant>,
    pub(crate) renew: bool,
    pub(crate) started: Instant,
    /// How to retry failures retrying may fix; `None`: only inside a wait deadline.
    /// Boxed: rarely given, and every waiter carries its request.
    pub(crate) retry: Option<Box<RetryPolicy>>,
    /// What the request takes of the key.
    pub(crate) claim: Claim,
    /// The owner was made for this request: no other request can use it, and it holds
    /// nothing, until the request's guard shows it.
    pub(crate) fresh: bool,
}

type Answer = Result<Option<LockGuard>, LockError>;

/// One [`claim`](crate::LockBackend::claim) sent to the store, boxed so that it can outlive
/// its caller.
type Attempt = Pin<Box<dyn Future<Output = Result<AcquireOutcome, LockError>> + Send>>;

pub(crate) fn no_runtime() -> LockError {
    LockError::config("locks must be acquired inside a tokio runtime")
}

/// Whether a grant to a request sent at `started` and answered at `answered` arrived after
/// its lease had ended: after the request's start plus the TTL the store applied, or after a
/// validity the backend computed itself. (The drift allowance is left out: with a TTL of a few milliseconds it
/// is the whole lease, and such a lease is the caller's choice.)
pub(crate) fn ended(started: Instant, grant: &Grant, answered: Instant) -> bool {
    let end = started + grant.ttl;
    let end = grant.valid_until.map_or(end, |cap| cap.min(end));
    end <= answered
}

/// An error after which the attempt may have been applied in the store with its answer lost:
/// a release by owner undoes it. A request that provably never reached the store (its
/// connection was refused) applied nothing and needs no release: with the store down, a
/// shutdown must not wait out a retried release for every failed attempt.
pub(crate) fn maybe_applied(e: &LockError) -> bool {
    matches!(
        e,
        LockError::Unavailable { .. }
            | LockError::Backend { .. }
            | LockError::QuorumNotReached { .. }
    ) && !e.never_sent()
}

/// Every acquisition. It runs in the caller's task (no spawn, no channel on the hot path);
/// whatever a caller that goes away would strand lives in a [`Request`] whose `Drop`
/// finishes it in the background.
pub(crate) fn run(
    client: &Arc<ClientInner>,
    req: Validated,
    wait: bool,
    runtime: Handle,
    retrying: Option<Retrying>,
) -> impl Future<Output = Answer> + Send + 'static {
    // Built before the future, not inside it: an async fn keeps its arguments beside the
    // request made of them, and every waiter pays for the future's whole size.
    let mut request = Request::new(client, req, runtime, retrying);
    async move { request.run(wait).await }
}

/// What a waiting request shares with the wait deadline around it
/// ([`LockRequest::acquire`](crate::LockRequest::acquire)).
#[derive(Debug, Default)]
pub(crate) struct Watched {
    /// The store failure it is retrying, if its last attempt failed: a wait deadline that
    /// passes during the next attempt reports it rather than a `Timeout` that would hide it
    /// (a deadline that passes during the pause before it already does).
    pub(crate) failure: Mutex<Option<LockError>>,
    /// An attempt is in flight.
    pub(crate) attempting: AtomicBool,
    /// An attempt was answered. Until then, a deadline that passes while the first attempt
    /// is in flight waits for its answer: a free key is never refused because the store
    /// answered more slowly than the deadline.
    pub(crate) answered: AtomicBool,
}

impl Watched {
    /// The first attempt is in flight: a deadline that passes now waits for its answer.
    pub(crate) fn first_in_flight(&self) -> bool {
        self.attempting.load(Ordering::SeqCst) && !self.answered.load(Ordering::SeqCst)
    }
}

pub(crate) type Retrying = Arc<Watched>;

/// How long a wait deadline that passed lets the request go on before it answers anyway:
/// an attempt in flight (after the first) may still answer, with the lock or a refusal, and
/// a request idle at the deadline leaves the place or mark it keeps in the store
/// ([`LockBackend::abandon`]). Whatever is left then goes to the background: an attempt
/// still in flight is settled there, and a place or mark left behind keeps the next request
/// out until that clean-up comes.
///
/// [`LockBackend::abandon`]: crate::LockBackend::abandon
pub(crate) const LEAVING_GRACE: Duration = Duration::from_millis(100);

/// One acquisition in progress: the request, what it holds in this client, and what the
/// store may keep of it.
///
/// Its `Drop` runs on every exit — an answer, an error, or the caller dropping the future
/// midway. It gives back at once what the request holds in this client ([`Here`]) and hands
/// what must not be stranded in the store ([`There`]) to a background task: an attempt still
/// in flight is awaited there and whatever it acquired is released; an attempt answered
/// with an error that may have been applied is undone by a release by owner; a request the
/// store may have queued is abandoned ([`LockBackend::abandon`]). That task keeps the
/// slot's gate until it is done, so a later request of the same owner cannot be granted the
/// hold that a compensating release is about to free (a fresh owner has no later request).
///
/// [`LockBackend::abandon`]: crate::LockBackend::abandon
struct Request {
    client: Arc<ClientInner>,
    req: Validated,
    runtime: Handle,
    here: Here,
    there: There,
    /// Where a waiting request leaves the store failure it is retrying (see [`Retrying`]).
    retrying: Option<Retrying>,
}

/// What a request holds in its client: its owner's slot and gate, its place in the
/// client's line for the key, and its place among the process's waiters.
#[derive(Default)]
struct Here {
    /// The (key, owner) slot of an owner the caller gave. A fresh owner has none while it
    /// acquires (nothing can re-enter or race it): its slot is made with its hold, which
    /// spares the gate and two of the slot map's lookups on every uncontended cycle
    /// (lockbench `memory --case uncontended` shows it).
    slot: Option<Arc<Slot>>,
    /// Requests for the same (key, owner) queue on this gate, so re-entry and release of one
    /// hold are serialised and the store only ever sees one hold per owner.
    gate: Option<OwnedMutexGuard<SlotState>>,
    /// In this client's line for the key ([`Lines`](crate::line::Lines)).
    joined: bool,
    /// The head of that line: the one request of this client that waits for the store.
    turn: Option<OwnedMutexGuard<()>>,
    /// When this request first found the lock held: its place among this process's waiters
    /// (see [`crate::ReleaseNotifier`]).
    place: Option<u64>,
}

/// What the store may keep of a request, for its `Drop` to undo.
#[derive(Default)]
struct There {
    /// The attempt in flight, polled in place while the caller waits.
    in_flight: Option<Attempt>,
    /// The last attempt failed in a way that may have applied it; a later answered attempt
    /// settles the question (same owner: the same hold, or someone else's).
    maybe_applied: bool,
    /// Told "held": the store may keep a place for this owner in its queue.
    queued: bool,
    /// What the last refusal said of a reservation of this owner's in the store
    /// ([`WaitHint::reservation`](crate::WaitHint::reservation)), if anything.
    reserved: Option<bool>,
    /// An attempt told a [`Fairness::Bounded`] store how long this request has waited
    /// ([`ClaimRequest::waited`]): the store may keep a mark for it.
    marked: bool,
}

impl Request {
    /// A request of `client` for its (key, owner) slot, before anything was tried.
    fn new(
        client: &Arc<ClientInner>,
        req: Validated,
        runtime: Handle,
        retrying: Option<Retrying>,
    ) -> Self {
        let here = Here {
            slot: (!req.fresh).then(|| client.slots.slot(&req.key, &req.owner)),
            ..Here::default()
        };
        Request {
            client: client.clone(),
            req,
            runtime,
            here,
            there: There::default(),
            retrying,
        }
    }

    async fn run(&mut self, wait: bool) -> Answer {
        // Until it is the head of its line, a request keeps only what waiting for its turn
        // needs: the attempts, waits and retries (most of a request's state) are made, boxed,
        // once it is the one that tries. The boxes here and below keep a waiter small, which
        // matters when thousands wait on one key (lockbench `redis --case scale_waiters`),
        // for a few percent of CPU per uncontended cycle.
        let waited_in_line = match self.enter(wait).await {
            ControlFlow::Break(answer) => return answer,
            ControlFlow::Continue(waited) => waited,
        };
        Box::pin(self.try_until_answered(wait, waited_in_line)).await
    }

    /// Takes the (key, owner) gate, answers a re-entry, and takes this request's turn in
    /// the client's line for the key: `Continue(true)` if it had to wait for it.
    async fn enter(&mut self, wait: bool) -> ControlFlow<Answer, bool> {
        if self.client.closed.is_cancelled() {
            return ControlFlow::Break(Err(LockError::Shutdown));
        }
        // A fresh owner holds nothing and no other request can use it: it has no gate to
        // take (its slot is made with its hold).
        if let Some(slot) = self.here.slot.clone() {
            if let Some(answer) = self.take_gate(slot).await {
                return ControlFlow::Break(answer);
            }
        }
        // This client's requests for a key queue in a line of their own: only its head
        // waits for the store and tries; a new request joins the line at the back instead
        // of racing the head (as `tokio::sync::Mutex` serves its waiters in order) — also
        // while the head is still on its first attempt, so that a burst of requests for one
        // key sends one attempt, not one each (10,000 waiters arriving together sent 6,473
        // attempts to PostgreSQL, and etcd stopped answering). Across processes the heads
        // race, or queue in the store where it orders its waiters ([`Fairness::Fifo`]):
        // there each waiting client keeps one place per key, not one per request.
        if wait {
            // The turn is almost always free.
            if let Err(line) = self.take_free_turn() {
                if let Err(e) = self.wait_turn(line).await {
                    return ControlFlow::Break(Err(e));
                }
                return ControlFlow::Continue(true);
            }
        }
        ControlFlow::Continue(false)
    }

    /// Takes the gate of an owner's `slot`, and answers a re-entry under it: the answer,
    /// or `None` to go on.
    async fn take_gate(&mut self, slot: Arc<Slot>) -> Option<Answer> {
        let client = self.client.clone();
        let inner = &*client;
        // The gate is almost always free: take it without registering for the shutdown
        // signal.
        let gate = match slot.clone().try_lock_owned() {
            Ok(gate) => gate,
            // Boxed: every waiter's future would keep room for this rare wait.
            Err(_) => {
                let slot = slot.clone();
                let gate = Box::pin(async move {
                    tokio::select! {
                        biased;
                        _ = inner.closed.cancelled() => None,
                        gate = slot.lock_owned() => Some(gate),
                    }
                });
                match gate.await {
                    Some(gate) => gate,
                    None => return Some(Err(LockError::Shutdown)),
                }
            }
        };
        let state = self.here.gate.insert(gate);
        let hold = state.hold.clone()?;
        if hold.claim != self.req.claim {
            return Some(Err(LockError::config(format!(
                "this owner holds {:?} as {} and asked for {}: re-entry keeps the mode and weight (no upgrade or downgrade); release first, or use another owner",
                hold.key.as_str(), hold.claim, self.req.claim
            ))));
        }
        state.count += 1;
        tracing::debug!(key = %hold.key, holds = state.count, "lock re-entered");
        Some(Ok(Some(LockGuard::new(client.clone(), slot, hold))))
    }

    /// Joins this client's line for the key and takes its turn if nobody is ahead; else
    /// the line, to [`wait_turn`](Self::wait_turn) in.
    fn take_free_turn(&mut self) -> Result<(), Arc<tokio::sync::Mutex<()>>> {
        let line = self.client.lines.join(&self.req.key);
        self.here.joined = true;
        match line.clone().try_lock_owned() {
            Ok(turn) => {
                self.here.turn = Some(turn);
                Ok(())
            }
            Err(_) => Err(line),
        }
    }

    /// Waits for the turn of a line this request joined.
    async fn wait_turn(&mut self, line: Arc<tokio::sync::Mutex<()>>) -> Result<(), LockError> {
        // No shutdown signal here: the head of the line answers a shutdown and leaves,
        // and so each request after it in turn (a select over both would double the
        // room every waiter behind the head keeps).
        let turn = line.lock_owned().await;
        if self.client.closed.is_cancelled() {
            return Err(LockError::Shutdown);
        }
        self.here.turn = Some(turn);
        Ok(())
    }

    /// Attempts until the request has its answer: the lock, contention for a request that
    /// does not wait, or an error. `waited_in_line`: the request waited for its turn behind
    /// another of this client's, so the key was held a moment ago.
    async fn try_until_answered(&mut self, wait: bool, waited_in_line: bool) -> Answer {
        // A backend whose signal says "free" while its attempt says "held" (a holder that
        // just expired on one clock but not the other) must not make us spin.
        let mut quick_wakes = 0u32;
        // Made at the first failure: most requests never fail, and every waiter's future
        // would keep room for it.
        let mut backoff: Option<Box<Backoff>> = None;
        // Behind another request of ours the key was held a moment ago: wait for its
        // release first. (A shared claim behind a shared claim that was just granted may fit
        // at once; a store that queues its waiters is waited on from the place the first
        // attempt takes in its queue.)
        let queues = self.client.caps.fairness == Fairness::Fifo;
        let mut contention = (waited_in_line && self.req.claim.is_exclusive() && !queues)
            .then(|| Contention::new(None));
        loop {
            if let Some(contention) = contention.take() {
                let woke = Box::pin(self.wait_for_release(&contention, &mut quick_wakes)).await?;
                let now = self.client.now();
                if !woke || self.req.deadline.is_some_and(|d| now >= d) {
                    // The deadline passed (perhaps just as the wait ended): out of the
                    // store's queue before the caller hears of it, and no attempt that
                    // could only leave another mark behind.
                    self.leave_fifo_queue().await;
                    return Ok(None);
                }
            }
            let attempt_started = self.client.now();
            let (outcome, answered) = self.send_attempt(attempt_started).await;
            // Matched as it comes, and the error turned into a pause before the pause is
            // awaited: what an arm binds is not kept in the future across the wait.
            let pause = match outcome {
                Ok(AcquireOutcome::Acquired(grant)) if ended(attempt_started, &grant, answered) => {
                    // Boxed: rare, and every waiter's future would keep room for it.
                    let e = Box::pin(self.undo_late_grant(&grant, attempt_started)).await;
                    self.after_failure(e, wait, true, &mut backoff)?
                }
                Ok(AcquireOutcome::Acquired(grant)) => {
                    self.there.queued = false;
                    self.there.maybe_applied = false;
                    let req = &self.req;
                    tracing::debug!(key = %req.key, token = %grant.token, "lock acquired");
                    let holder = Holder {
                        key: req.key.clone(),
                        owner: req.owner.clone(),
                        claim: req.claim,
                    };
                    if let Some(notifier) = self.client.backend.notifier() {
                        if !req.claim.is_exclusive() && self.here.place.is_some() {
                            // Woken by a release that may have freed room for more than us.
                            notifier.notify_one(&req.key);
                        }
                    }
                    let hold = Hold::start(
                        self.client.backend.clone(),
                        self.client.meter.clone(),
                        holder,
                        req.renew,
                        (attempt_started, answered),
                        grant,
                        &self.runtime,
                    );
                    let hold = match hold {
                        Ok(hold) => hold,
                        Err(e) => {
                            // Unwatched, the hold could not be kept or known lost.
                            self.there.maybe_applied = true;
                            return Err(e.during(Operation::Acquire, &req.key));
                        }
                    };
                    let slot = match &self.here.slot {
                        Some(slot) => {
                            if let Some(state) = self.here.gate.as_mut() {
                                state.hold = Some(hold.clone());
                                state.count = 1;
                            }
                            slot.clone()
                        }
                        None => self.client.slots.held(&req.key, &req.owner, hold.clone()),
                    };
                    return Ok(Some(LockGuard::new(self.client.clone(), slot, hold)));
                }
                Ok(AcquireOutcome::Held(held)) => {
                    self.there.queued = true;
                    self.there.reserved = held.hint.reservation();
                    self.there.maybe_applied = false;
                    if let Some(last) = &self.retrying {
                        // Contention again: a deadline now is a plain timeout.
                        *last.failure.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    }
                    if let Some(backoff) = backoff.as_mut() {
                        backoff.reset();
                    }
                    if !wait {
                        self.leave_fifo_queue().await;
                        return Ok(None);
                    }
                    if let (Some(place), Some(notifier)) = (
                        self.here
                            .place
                            .filter(|_| held.hint.is_behind_reservation()),
                        self.client.backend.notifier(),
                    ) {
                        // The room is kept for another waiter: if the wake-up that led here
                        // was meant for it, a waiter of this process behind us gets it.
                        notifier.notify_behind(&self.req.key, place);
                    }
                    // In line, this request has its turn: it waits for the store.
                    contention = Some(held);
                    continue;
                }
                Err(e) => self.after_failure(e, wait, false, &mut backoff)?,
            };
            // Boxed: a timer is large, and every waiter's future would keep room for it.
            let closed = Box::pin(async {
                tokio::select! {
                    biased;
                    _ = self.client.closed.cancelled() => true,
                    _ = tokio::time::sleep(pause) => false,
                }
            });
            if closed.await {
                return Err(LockError::Shutdown);
            }
        }
    }

    /// After an attempt failed with `e`: the pause before the next attempt, or the error to
    /// answer.
    fn after_failure(
        &mut self,
        e: LockError,
        wait: bool,
        late: bool,
        backoff: &mut Option<Box<Backoff>>,
    ) -> Result<Duration, LockError> {
        // The store answered, so the attempt is no longer in flight. If it may have been
        // applied, the next answered attempt tells (same owner: the same hold); if none
        // comes, `Drop` releases by owner. A late grant was released already
        // (`maybe_applied` says whether that went through).
        if !late {
            self.there.maybe_applied |= maybe_applied(&e);
        }
        // Inside a wait deadline a transient failure (store unreachable, no quorum) is
        // retried with jittered backoff; at the deadline the caller sees the store's error,
        // not a Timeout that would hide it. A `retry` policy extends that to requests
        // without a deadline.
        let e = e.during(Operation::Acquire, &self.req.key);
        let now = self.client.now();
        let retrying =
            wait && e.is_retryable() && (self.req.deadline.is_some() || self.req.retry.is_some());
        let retry = self.req.retry.as_deref().copied();
        let pause = backoff
            .get_or_insert_with(|| Box::new(retry.unwrap_or_default().backoff()))
            .next_pause(now)
            .filter(|p| self.req.deadline.is_none_or(|d| now + *p < d));
        match pause {
            Some(pause) if retrying => {
                tracing::debug!(key = %self.req.key, error = %ErrorChain(&e), "acquire attempt failed; retrying");
                if let Some(last) = &self.retrying {
                    *last.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                }
                Ok(pause)
            }
            _ => Err(e),
        }
    }

    /// Waits for a release of the key after an attempt saw `contention` (see
    /// [`wait_for_release`]): `false` when the deadline passed.
    async fn wait_for_release(
        &mut self,
        contention: &Contention,
        quick_wakes: &mut u32,
    ) -> Result<bool, LockError> {
        let client = self.client.clone();
        let inner = &*client;
        // Our place in line among this process's waiters: kept across
        // wake-ups lost to other processes.
        let place = *self.here.place.get_or_insert_with(next_place);
        let req = &self.req;
        let cap = if self.there.marked {
            // A mark for a long wait lives a short while: renew it before it lapses, as
            // often as the client's budget of renewals allows (spread a little, so marks
            // made together are not renewed together).
            let every = starving::renew_marks_every(inner.marked.load(Ordering::Relaxed));
            Some(every - jitter(every / 8))
        } else if inner.caps.fairness == Fairness::Bounded && !inner.caps.notifications {
            // Ask again as soon as the wait is long, to leave a mark while the key is held:
            // a store that polls would otherwise not look until the key is free, when the
            // releasing client has already taken it back. (A store that signals releases
            // wakes us at each one, and the next refusal marks; a wake-up that never comes
            // is then not hidden by this timer.)
            let starving_in = STARVING_AFTER.saturating_sub(inner.elapsed(req.started));
            Some(starving_in + Duration::from_millis(1))
        } else {
            None
        };
        let waiting = Waiting {
            key: &req.key,
            ttl: req.ttl,
            deadline: req.deadline,
            place,
            cap,
        };
        wait_for_release(inner, waiting, contention, quick_wakes).await
    }

    /// A store that queues its waiters ([`Fairness::Fifo`]) gave this request a place
    /// when it refused it, one that marks long waits ([`Fairness::Bounded`]) may have
    /// kept a mark for it, and a refused shared claim or claim of permits nearly always
    /// leaves a reservation ([`Claim::fits`](crate::Claim::fits)): a request that gives up
    /// without the lock (a `try_acquire`, a deadline) leaves it before answering, or the
    /// caller's next request (or another client's) could find it still ahead, the clean-up
    /// on drop being a background task (which a process that exits at once never runs).
    /// If leaving fails, that clean-up tries again. A backend whose refusals say whether it
    /// keeps a reservation for the owner ([`WaitHint::with_reservation`](crate::WaitHint::with_reservation))
    /// is taken at its word, both ways: a refused exclusive request behind shared leases
    /// leaves its writer's reservation, and a claim refused by another's reservation spares
    /// the round trip. Without that word, a refused exclusive request (which keeps a
    /// reservation only behind shared leases) leaves it in the background, so that a
    /// refused `try_acquire` of an exclusive lock stays one round trip.
    async fn leave_fifo_queue(&mut self) {
        // A backend that says whether it keeps a reservation for this owner is taken at its
        // word; otherwise a refused claim that is not exclusive is assumed to hold one.
        let kept = match self.client.caps.fairness {
            Fairness::Fifo => true,
            Fairness::Bounded => self.there.marked,
            _ => false,
        } || self
            .there
            .reserved
            .unwrap_or(!self.req.claim.is_exclusive());
        if !self.there.queued || !kept {
            return;
        }
        let backend = self.client.backend.clone();
        match backend.abandon(&self.req.key, &self.req.owner).await {
            Ok(()) => self.there.queued = false,
            Err(e) => {
                tracing::debug!(key = %self.req.key, error = %ErrorChain(&e), "leaving the queue failed; retried in the background");
            }
        }
    }

    /// A grant that arrived when its lease had ended: released again at once,
    /// and the error to report (retryable: a store too slow for the TTL may answer in time
    /// on the next attempt). No guard is handed out whose lease is already over.
    async fn undo_late_grant(&mut self, grant: &Grant, started: Instant) -> LockError {
        let took = self.client.elapsed(started);
        let backend = self.client.backend.clone();
        // Until the release is answered, `Drop` would have to undo the grant.
        self.there.maybe_applied = true;
        let released = backend.release(&self.req.key, &self.req.owner).await;
        self.there.maybe_applied = released.is_err();
        tracing::debug!(key = %self.req.key, took = ?took, ttl = ?grant.ttl, "lock granted too late to be valid; released it");
        LockError::unavailable(
            backend.name(),
            format!(
                "the grant arrived {took:?} after the request, when its {:?} lease had ended: \
                 the store is too slow for this TTL (the grant was released again)",
                grant.ttl
            ),
        )
    }

    /// Sends one attempt (at `started`) and waits for its answer in place: the answer, and
    /// when it came. If the caller goes away meanwhile, the attempt stays in `self.there.in_flight`
    /// for `Drop` to finish.
    async fn send_attempt(
        &mut self,
        started: Instant,
    ) -> (Result<AcquireOutcome, LockError>, Instant) {
        let backend = self.client.backend.clone();
        let (key, owner, ttl) = (self.req.key.clone(), self.req.owner.clone(), self.req.ttl);
        let claim = self.req.claim;
        // A request that has waited long on a store that marks long waits says so on
        // every attempt (a single `try_acquire`, which never waits, has no place). The
        // clock is read only for such a request: every acquisition reads it few times.
        let marking = self.client.caps.fairness == Fairness::Bounded && self.here.place.is_some();
        let waited = if marking {
            started.saturating_duration_since(self.req.started)
        } else {
            Duration::ZERO
        };
        let starving = marking && waited >= STARVING_AFTER;
        if starving && !self.there.marked {
            self.there.marked = true;
            self.client.marked.fetch_add(1, Ordering::Relaxed);
        }
        let attempt = self.there.in_flight.insert(Box::pin(async move {
            let request = ClaimRequest::new(&key, &owner, ttl, claim);
            let request = if starving {
                request.waited(waited)
            } else {
                request
            };
            backend.claim(&request).await
        }));
        let watched = self.retrying.clone();
        if let Some(w) = &watched {
            w.attempting.store(true, Ordering::SeqCst);
        }
        let outcome = attempt.await;
        if let Some(w) = &watched {
            w.answered.store(true, Ordering::SeqCst);
            w.attempting.store(false, Ordering::SeqCst);
        }
        self.there.in_flight = None;
        let answered = self.recorded(&outcome, started);
        (outcome, answered)
    }

    /// Records the outcome of an attempt sent at `started`: when it was answered.
    fn recorded(&self, outcome: &Result<AcquireOutcome, LockError>, started: Instant) -> Instant {
        let meter = &self.client.meter;
        let recorded = match outcome {
            Ok(AcquireOutcome::Acquired(_)) => AttemptOutcome::Acquired,
            Ok(AcquireOutcome::Held(_)) => AttemptOutcome::Held,
            Err(e) => {
                meter.store_error(&self.req.key, Operation::Acquire, e);
                AttemptOutcome::Error
            }
        };
        let answered = self.client.now();
        meter.attempt(&self.req.key, recorded, answered - started);
        answered
    }
}

/// What [`wait_for_release`] waits for: a key held by others, for a request of `ttl`
/// with its `deadline` and its `place` among this process's waiters, napping at most `cap`
/// between looks when the request needs to ask the store again sooner.
pub(crate) struct Waiting<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) ttl: Duration,
    pub(crate) deadline: Option<Instant>,
    pub(crate) place: u64,
    pub(crate) cap: Option<Duration>,
}

/// Waits for a release of the key after an attempt saw `contention`, or at most until the
/// holder's lease runs out (a blind nap when unknown), within the deadline: `false` when
/// the deadline passed.
pub(crate) async fn wait_for_release(
    inner: &ClientInner,
    waiting: Waiting<'_>,
    contention: &Contention,
    quick_wakes: &mut u32,
) -> Result<bool, LockError> {
    let Waiting {
        key,
        ttl,
        deadline,
        place,
        cap,
    } = waiting;
    let at = inner.now();
    let left = match deadline {
        Some(d) if d <= at => return Ok(false),
        Some(d) => d - at,
        None => Duration::MAX,
    };
    let base = contention.remaining_ttl.unwrap_or(MAX_BLIND_WAIT.min(ttl));
    let mut nap = (base + jitter(base / 8 + Duration::from_millis(2))).min(left);
    if inner.caps.shared || inner.caps.semaphores {
        // A refused claim may keep a reservation in the store that expires after our
        // TTL: try again before it does.
        nap = nap.min(ttl / 2);
    }
    if let Some(cap) = cap {
        nap = nap.min(cap);
    }
    // A woken waiter that loses the race to another client is legitimately
    // woken again within a millisecond; only a long run of instant wake-ups
    // is a spin.
    if *quick_wakes >= QUICK_WAKES_BEFORE_PAUSE {
        let shift = (*quick_wakes - QUICK_WAKES_BEFORE_PAUSE).min(4);
        let pause = Duration::from_millis(1 << shift).min(nap);
        tokio::time::sleep(pause).await;
    }
    let waiting = inner.now();
    if let Some(pause) = contention.hint.retry_delay() {
        // Nobody to wait for (a split vote): the store asked for a pause instead.
        tokio::select! {
            biased;
            _ = inner.closed.cancelled() => return Err(LockError::Shutdown),
            _ = tokio::time::sleep(pause.min(left)) => {}
        }
        *quick_wakes = 0;
        return Ok(true);
    }
    tokio::select! {
        biased;
        _ = inner.closed.cancelled() => return Err(LockError::Shutdown),
        woke = inner.backend.wait_released(key, &contention.hint, place, nap) => {
            if let Err(e) = woke {
                // The next attempt reports the store's state; don't spin on it.
                tracing::debug!(key = %key, error = %ErrorChain(&e), "waiting for a release failed");
                tokio::time::sleep(nap.min(Duration::from_millis(50))).await;
            }
        }
    }
    // Only a holder about to expire can make the signal and the attempt
    // disagree; a fresh holder that won the race is ordinary contention. Behind a
    // reservation, a store whose wait sees the key free (but reserved) at once would
    // have us spin until the reservation's owner takes it.
    let expiring = contention.hint.is_behind_reservation()
        || contention
            .remaining_ttl
            .is_none_or(|left| left < Duration::from_millis(5));
    *quick_wakes = if expiring && inner.elapsed(waiting) < Duration::from_millis(1) {
        *quick_wakes + 1
    } else {
        0
    };
    Ok(true)
}

impl Drop for Request {
    fn drop(&mut self) {
        if self.there.marked {
            // Its mark, if still in the store, is left to lapse or to the clean-up below.
            self.client.marked.fetch_sub(1, Ordering::Relaxed);
        }
        drop(self.here.turn.take());
        if self.here.joined {
            self.client.lines.leave(&self.req.key);
        }
        let attempt = self.there.in_flight.take();
        if attempt.is_none() && !self.there.maybe_applied && !self.there.queued {
            // The common case: an answer was delivered and nothing is left to undo.
            drop(self.here.gate.take());
            if let Some(slot) = &self.here.slot {
                self.client
                    .slots
                    .done_with(&self.req.key, &self.req.owner, slot);
            }
            return;
        }
        let (client, slot, gate) = (
            self.client.clone(),
            self.here.slot.clone(),
            self.here.gate.take(),
        );
        let (key, owner) = (self.req.key.clone(), self.req.owner.clone());
        let (mut release, mut abandon) = (self.there.maybe_applied, self.there.queued);
        let until = self.client.now() + self.req.ttl;
        let pending = self.client.meter.background_release(&self.req.key);
        let span = tracing::info_span!(
            "distlock.clean_up",
            key = %self.req.key,
            backend = self.client.backend.name(),
            in_flight = attempt.is_some(),
        );
        let finish = async move {
            let _pending = pending;
            if let Some(attempt) = attempt {
                // Not raced against anything: once sent, its outcome must be seen.
                match attempt.await {
                    Ok(AcquireOutcome::Acquired(_)) => (release, abandon) = (true, false),
                    Ok(AcquireOutcome::Held(_)) => (release, abandon) = (false, true),
                    Err(e) => release |= maybe_applied(&e),
                }
            }
            let backend = &*client.backend;
            if release {
                match release_with_retry(backend, &client.meter, &key, &owner, until).await {
                    Ok(outcome) => {
                        tracing::debug!(key = %key, ?outcome, "released what a request left behind")
                    }
                    Err(e) => {
                        tracing::warn!(key = %key, error = %ErrorChain(&e), "could not release what a request left behind; it expires after its TTL")
                    }
                }
            }
            if abandon {
                if let Err(e) = backend.abandon(&key, &owner).await {
                    tracing::debug!(key = %key, error = %ErrorChain(&e), "abandoning a wait failed");
                }
            }
            drop(gate);
            if let Some(slot) = slot {
                client.slots.done_with(&key, &owner, &slot);
            }
        };
        self.client
            .tasks
            .spawn_on(finish.instrument(span), &self.runtime);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;
    use crate::LockClient;

    /// A request waiting for its turn keeps only the request and the wait for the turn:
    /// the attempt loop's state is made (boxed) once it is the head. Inline, every one of
    /// thousands of waiters on a key would carry it (lockbench `redis --case
    /// scale_waiters`).
    #[tokio::test]
    async fn a_request_in_line_does_not_carry_the_attempt_loop() {
        let client = LockClient::new(MemoryBackend::new());
        let inner = &client.inner;
        let validated = || client.lock("k").validate().expect("a valid request");
        let waiting = run(inner, validated(), true, Handle::current(), None);
        let mut request = Request::new(inner, validated(), Handle::current(), None);
        let attempt_loop = std::mem::size_of_val(&request.try_until_answered(true, false));
        let whole = std::mem::size_of_val(&waiting);
        assert!(
            whole < std::mem::size_of::<Request>() + attempt_loop,
            "a waiting request takes {whole} B: the request ({} B) and room for the attempt loop ({attempt_loop} B)",
            std::mem::size_of::<Request>()
        );
        drop(waiting);
        drop(request);
        assert_eq!(client.in_line("k"), 0);
    }
}
