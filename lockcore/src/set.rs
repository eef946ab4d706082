//! A set of keys taken in one request of the store ([`LockBackend::claim_all`]): the turn
//! in the client's line of each key, in the set's order; one attempt for every key; a wait
//! for the key that was refused; and what a caller that goes away leaves to the background.
//! The keys-one-by-one path, for a store that cannot take the set in one step, is
//! [`MultiLockRequest`](crate::MultiLockRequest)'s.
//!
//! [`LockBackend::claim_all`]: crate::LockBackend::claim_all

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::OwnedMutexGuard;
use tracing::Instrument;

use crate::acquire::{ended, maybe_applied, wait_for_release, Validated, Waiting, LEAVING_GRACE};
use crate::guard::{release_with_retry, LockGuard};
use crate::hold::{Hold, Holder};
use crate::inner::ClientInner;
use crate::metrics::AttemptOutcome;
use crate::notify::next_place;
use crate::retry::Backoff;
use crate::{
    Claim, ClaimRequest, ErrorChain, Grant, LockError, LockKey, Operation, Owner, RetryPolicy,
    SetOutcome,
};

/// One [`claim_all`](crate::LockBackend::claim_all) sent to the store, boxed so that it can
/// outlive its caller.
type SetAttempt = Pin<Box<dyn Future<Output = Result<Option<SetOutcome>, LockError>> + Send>>;

/// How a set request ended without an error.
pub(crate) enum SetAnswer {
    /// Every key is held: a guard per key, in the set's order.
    Acquired(Vec<LockGuard>),
    /// This key was held by others when the request gave up (no wait, or the deadline);
    /// nothing of the set is held.
    Held(LockKey),
    /// The store cannot take this set in one step: take the keys one by one.
    OneByOne,
}

/// A set request in progress. Its `Drop` gives back the turns it holds in the client's
/// lines and hands an attempt still in flight (or one that failed in a way that may have
/// applied it) to a background task that releases every key of the set.
pub(crate) struct SetRequest {
    client: Arc<ClientInner>,
    /// The keys in the set's order: their bytes, ascending.
    keys: Vec<LockKey>,
    /// A fresh owner, the same for every key.
    owner: Owner,
    ttl: Duration,
    claim: Claim,
    renew: bool,
    deadline: Option<Instant>,
    retry: Option<RetryPolicy>,
    runtime: Handle,
    /// The turns taken in the client's lines, one per key of a prefix of `keys`.
    turns: Vec<OwnedMutexGuard<()>>,
    /// How many of the keys' lines this request joined.
    joined: usize,
    in_flight: Option<SetAttempt>,
    /// The last attempt failed in a way that may have applied it.
    maybe_applied: bool,
}

impl SetRequest {
    /// A request for `keys` (sorted, checked) with the options of `req`, made for its
    /// first key. Only a fresh owner takes this path: it holds nothing, so no key of the
    /// set is a re-entry.
    pub(crate) fn new(
        client: Arc<ClientInner>,
        keys: Vec<LockKey>,
        req: Validated,
        runtime: Handle,
    ) -> Self {
        SetRequest {
            client,
            keys,
            owner: req.owner,
            ttl: req.ttl,
            claim: req.claim,
            renew: req.renew,
            deadline: req.deadline,
            retry: req.retry.map(|r| *r),
            runtime,
            turns: Vec::new(),
            joined: 0,
            in_flight: None,
            maybe_applied: false,
        }
    }

    /// Takes the set: waits for it if `wait`, else makes one attempt.
    pub(crate) async fn run(mut self, wait: bool) -> Result<SetAnswer, LockError> {
        if wait {
            self.take_turns().await?;
        }
        let mut backoff: Option<Backoff> = None;
        // The failure being retried: what a deadline that passes during the next attempt
        // reports, rather than a timeout that would hide it.
        let mut failure: Option<LockError> = None;
        let mut place = None;
        let mut quick_wakes = 0u32;
        let mut first = true;
        loop {
            let started = self.client.now();
            let Some(outcome) = self.send_attempt(first).await else {
                // The deadline passed with an attempt in flight: `Drop` settles it.
                return match failure {
                    Some(e) => Err(e),
                    None => Ok(SetAnswer::Held(self.keys[0].clone())),
                };
            };
            first = false;
            let answered = self.record(&outcome, started);
            let e = match outcome {
                Ok(None) => return Ok(SetAnswer::OneByOne),
                Ok(Some(SetOutcome::Acquired(grants))) => {
                    self.maybe_applied = false;
                    match self.granted(grants, started, answered).await {
                        Ok(guards) => return Ok(SetAnswer::Acquired(guards)),
                        Err(e) => e,
                    }
                }
                Ok(Some(SetOutcome::Held { index, contention })) => {
                    self.maybe_applied = false;
                    failure = None;
                    if let Some(backoff) = backoff.as_mut() {
                        backoff.reset();
                    }
                    let key = self.keys.get(index).unwrap_or(&self.keys[0]).clone();
                    if !wait {
                        return Ok(SetAnswer::Held(key));
                    }
                    let waiting = Waiting {
                        key: &key,
                        ttl: self.ttl,
                        deadline: self.deadline,
                        place: *place.get_or_insert_with(next_place),
                        cap: None,
                    };
                    let woke =
                        wait_for_release(&self.client, waiting, &contention, &mut quick_wakes);
                    if !Box::pin(woke).await? {
                        return Ok(SetAnswer::Held(key));
                    }
                    continue;
                }
                Err(e) => {
                    self.maybe_applied |= maybe_applied(&e);
                    e
                }
            };
            // Inside a wait deadline (or under a retry policy) a transient failure is
            // retried with jittered backoff, as for one key.
            let e = e.during(Operation::Acquire, &self.keys[0]);
            let now = self.client.now();
            let retrying =
                wait && e.is_retryable() && (self.deadline.is_some() || self.retry.is_some());
            let pause = backoff
                .get_or_insert_with(|| self.retry.unwrap_or_default().backoff())
                .next_pause(now)
                .filter(|p| self.deadline.is_none_or(|d| now + *p < d));
            let Some(pause) = pause.filter(|_| retrying) else {
                return Err(e);
            };
            tracing::debug!(key = %self.keys[0], error = %ErrorChain(&e), "set attempt failed; retrying");
            failure = Some(e);
            tokio::select! {
                biased;
                _ = self.client.closed.cancelled() => return Err(LockError::Shutdown),
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Takes the turn of each key in this client's line for it, in the set's order (so two
    /// sets of this client that share keys cannot each hold a turn the other waits for).
    async fn take_turns(&mut self) -> Result<(), LockError> {
        for key in &self.keys {
            let line = self.client.lines.join(key);
            self.joined += 1;
            let turn = match line.clone().try_lock_owned() {
                Ok(turn) => turn,
                Err(_) => line.lock_owned().await,
            };
            if self.client.closed.is_cancelled() {
                return Err(LockError::Shutdown);
            }
            self.turns.push(turn);
        }
        Ok(())
    }

    /// Sends one attempt for the whole set and waits for its answer in place; `None` when
    /// the deadline passed first (the first attempt is always answered: a free set is never
    /// refused because the store answered slowly). If the caller goes away meanwhile, the
    /// attempt stays in `self.in_flight` for `Drop` to finish.
    async fn send_attempt(&mut self, first: bool) -> Option<Result<Option<SetOutcome>, LockError>> {
        let backend = self.client.backend.clone();
        let (keys, owner, ttl, claim) =
            (self.keys.clone(), self.owner.clone(), self.ttl, self.claim);
        let attempt = self.in_flight.insert(Box::pin(async move {
            let requests: Vec<ClaimRequest<'_>> = keys
                .iter()
                .map(|key| ClaimRequest::new(key, &owner, ttl, claim))
                .collect();
            backend.claim_all(&requests).await
        }));
        let outcome = match self.deadline.filter(|_| !first) {
            Some(deadline) => {
                let until = deadline + LEAVING_GRACE;
                tokio::time::timeout_at(until.into(), attempt).await.ok()?
            }
            None => attempt.await,
        };
        self.in_flight = None;
        Some(outcome)
    }

    /// Records an attempt sent at `started` for each key: when it was answered.
    fn record(&self, outcome: &Result<Option<SetOutcome>, LockError>, started: Instant) -> Instant {
        let meter = &self.client.meter;
        let answered = self.client.now();
        for (i, key) in self.keys.iter().enumerate() {
            let recorded = match outcome {
                Ok(None) => return answered,
                Ok(Some(SetOutcome::Acquired(_))) => AttemptOutcome::Acquired,
                Ok(Some(SetOutcome::Held { .. })) => AttemptOutcome::Held,
                Err(e) => {
                    if i == 0 {
                        meter.store_error(key, Operation::Acquire, e);
                    }
                    AttemptOutcome::Error
                }
            };
            meter.attempt(key, recorded, answered - started);
        }
        answered
    }

    /// Makes a hold and a guard of each grant of an attempt sent at `started` and answered
    /// at `answered`; a set whose leases had ended by then is released again and reported
    /// as a store too slow for the TTL (retryable).
    async fn granted(
        &mut self,
        grants: Vec<Grant>,
        started: Instant,
        answered: Instant,
    ) -> Result<Vec<LockGuard>, LockError> {
        let name = self.client.backend.name();
        if grants.len() != self.keys.len() {
            self.maybe_applied = true;
            return Err(LockError::backend(
                name,
                format!(
                    "the store answered {} grants for a set of {} keys",
                    grants.len(),
                    self.keys.len()
                ),
            ));
        }
        if let Some(late) = grants.iter().find(|g| ended(started, g, answered)) {
            let took = self.client.elapsed(started);
            let ttl = late.ttl;
            self.maybe_applied = true;
            self.release_all().await;
            return Err(LockError::unavailable(
                name,
                format!(
                    "the grants arrived {took:?} after the request, when a {ttl:?} lease had \
                     ended: the store is too slow for this TTL (the set was released again)"
                ),
            ));
        }
        let notify = (self.client.backend.notifier()).filter(|_| !self.claim.is_exclusive());
        let mut guards = Vec::with_capacity(grants.len());
        for (key, grant) in self.keys.iter().zip(grants) {
            tracing::debug!(key = %key, token = %grant.token, "lock of a set acquired");
            if let Some(notifier) = notify {
                // A shared grant may leave room for a waiter of this process.
                notifier.notify_one(key);
            }
            let holder = Holder {
                key: key.clone(),
                owner: self.owner.clone(),
                claim: self.claim,
            };
            let client = &self.client;
            let hold = Hold::start(
                client.backend.clone(),
                client.meter.clone(),
                holder,
                self.renew,
                (started, answered),
                grant,
                &self.runtime,
            );
            let hold = match hold {
                Ok(hold) => hold,
                Err(e) => {
                    // Unwatched, the hold could not be kept or known lost: `Drop` releases
                    // every key (the guards made so far release theirs as they drop).
                    self.maybe_applied = true;
                    return Err(e.during(Operation::Acquire, key));
                }
            };
            let slot = client.slots.held(key, &self.owner, hold.clone());
            guards.push(LockGuard::new(client.clone(), slot, hold));
        }
        Ok(guards)
    }

    /// Releases every key of the set by owner now; `maybe_applied` stays set for `Drop` if
    /// any release failed.
    async fn release_all(&mut self) {
        let backend = self.client.backend.clone();
        let releases = self
            .keys
            .iter()
            .map(|key| backend.release(key, &self.owner));
        let answers = futures_util::future::join_all(releases).await;
        self.maybe_applied = answers.iter().any(Result::is_err);
    }
}

impl Drop for SetRequest {
    fn drop(&mut self) {
        self.turns.clear();
        for key in &self.keys[..self.joined] {
            self.client.lines.leave(key);
        }
        let attempt = self.in_flight.take();
        if attempt.is_none() && !self.maybe_applied {
            return;
        }
        let client = self.client.clone();
        let (keys, owner) = (std::mem::take(&mut self.keys), self.owner.clone());
        let mut release = self.maybe_applied;
        let until = client.now() + self.ttl;
        let Some(first) = keys.first() else { return };
        let pending = client.meter.background_release(first);
        let span = tracing::info_span!(
            "distlock.clean_up",
            key = %first,
            keys = keys.len(),
            backend = client.backend.name(),
            in_flight = attempt.is_some(),
        );
        let finish = async move {
            let _pending = pending;
            if let Some(attempt) = attempt {
                // Not raced against anything: once sent, its outcome must be seen.
                match attempt.await {
                    Ok(Some(SetOutcome::Acquired(_))) => release = true,
                    Ok(_) => release = false,
                    Err(e) => release |= maybe_applied(&e),
                }
            }
            if !release {
                return;
            }
            let backend = &*client.backend;
            let releases = keys
                .iter()
                .map(|key| release_with_retry(backend, &client.meter, key, &owner, until));
            let answers = futures_util::future::join_all(releases).await;
            for (key, answer) in keys.iter().zip(answers) {
                if let Err(e) = answer {
                    tracing::warn!(key = %key, error = %ErrorChain(&e), "could not release what a set request left behind; it expires after its TTL");
                }
            }
        };
        self.client
            .tasks
            .spawn_on(finish.instrument(span), &self.runtime);
    }
}
