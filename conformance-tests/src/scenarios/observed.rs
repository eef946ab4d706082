//! A pass-through backend that tells scenarios what their client sent and heard: how many
//! renewals it sent, how many claims the store answered, and when a claim of it was first
//! refused; it can also hold back every attempt after the first refusal (a slow waiter, or
//! one that always hears of a release after another client), and hold back the watchdog's
//! renewal batches at a gate.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lockcore::driver::{
    AcquireOutcome, Capabilities, ClaimRequest, ExtendOutcome, ReleaseNotifier, Renewal, WaitHint,
};
use lockcore::{LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseOutcome};
use tokio::sync::watch;

use crate::{check, Outcome};

/// Wraps a client's backend; build a `LockClient` over it to observe that client.
#[derive(Debug)]
pub(crate) struct Observed {
    inner: Arc<dyn LockBackend>,
    extends: watch::Sender<u64>,
    first_refusal: OnceLock<Instant>,
    refused: watch::Sender<bool>,
    slow_retries: Duration,
    /// Claims of this client the store answered.
    claims: watch::Sender<u64>,
    /// Another client's `Observed` whose next answered claim each attempt after a refusal
    /// waits for (at most the duration).
    behind: Option<(Arc<Observed>, Duration)>,
    /// How many claims of `behind` were answered when this client was last refused.
    behind_seen: Mutex<u64>,
    /// Renewal batches wait here while it is closed (`true`).
    gate: watch::Sender<bool>,
    /// Batches that reached the closed gate.
    gated: watch::Sender<u64>,
    /// Batches the store answered.
    answered: watch::Sender<u64>,
    /// The keys of the latest batch of more than one renewal.
    last_batch: std::sync::Mutex<Vec<String>>,
}

impl Observed {
    pub(crate) fn new(inner: Arc<dyn LockBackend>) -> Self {
        Observed {
            inner,
            extends: watch::Sender::new(0),
            first_refusal: OnceLock::new(),
            refused: watch::Sender::new(false),
            slow_retries: Duration::ZERO,
            claims: watch::Sender::new(0),
            behind: None,
            behind_seen: Mutex::new(0),
            gate: watch::Sender::new(false),
            gated: watch::Sender::new(0),
            answered: watch::Sender::new(0),
            last_batch: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Holds back every attempt after the first refusal by `delay` before it is sent: a
    /// waiter slower to come back than everyone else.
    pub(crate) fn with_slow_retries(mut self, delay: Duration) -> Self {
        self.slow_retries = delay;
        self
    }

    /// Holds back every attempt after a refusal until the store has answered a claim of
    /// `other` made since that refusal (at most `limit`): a waiter in another process that
    /// always hears of a release after the releasing process has asked again.
    pub(crate) fn behind(mut self, other: Arc<Observed>, limit: Duration) -> Self {
        self.behind = Some((other, limit));
        self
    }

    /// Waits (at most `limit`) for the store's first refusal of a claim of this client.
    pub(crate) async fn refused_within(&self, limit: Duration) -> Outcome {
        let mut rx = self.refused.subscribe();
        let refused = tokio::time::timeout(limit, rx.wait_for(|r| *r))
            .await
            .is_ok_and(|r| r.is_ok());
        check!(
            refused,
            "no attempt of the client was refused within {limit:?}"
        );
        Ok(())
    }

    /// Before an attempt: the hold-back of a slow waiter, once it has been refused.
    async fn before_attempt(&self) {
        if self.first_refusal.get().is_none() {
            return;
        }
        if !self.slow_retries.is_zero() {
            tokio::time::sleep(self.slow_retries).await;
        }
        if let Some((other, limit)) = &self.behind {
            let seen = *self.behind_seen.lock().unwrap_or_else(|e| e.into_inner());
            let mut rx = other.claims.subscribe();
            let _ = tokio::time::timeout(*limit, rx.wait_for(|n| *n > seen)).await;
        }
    }

    /// Closes (`true`) or opens the gate renewal batches wait at.
    pub(crate) fn gate_renewals(&self, closed: bool) {
        self.gate.send_replace(closed);
    }

    /// Batches that reached the closed gate so far.
    pub(crate) fn gated(&self) -> u64 {
        *self.gated.borrow()
    }

    /// Waits (at most `limit`) for a batch to reach the closed gate after the first `seen`.
    pub(crate) async fn gated_since(&self, seen: u64, limit: Duration) -> bool {
        let mut rx = self.gated.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|n| *n > seen))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Batches the store answered so far.
    pub(crate) fn answered(&self) -> u64 {
        *self.answered.borrow()
    }

    /// Waits (at most `limit`) for the store to answer a batch after the first `seen`.
    pub(crate) async fn answered_since(&self, seen: u64, limit: Duration) -> bool {
        let mut rx = self.answered.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|n| *n > seen))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The keys of the latest renewal batch of more than one hold.
    pub(crate) fn last_batch(&self) -> Vec<String> {
        self.last_batch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The renewals sent so far.
    pub(crate) fn extends(&self) -> u64 {
        *self.extends.borrow()
    }

    /// Waits (at most `limit`) for a renewal after the first `seen`.
    pub(crate) async fn renewed_since(&self, seen: u64, limit: Duration) -> Outcome {
        let mut rx = self.extends.subscribe();
        let renewed = tokio::time::timeout(limit, rx.wait_for(|n| *n > seen))
            .await
            .is_ok_and(|r| r.is_ok());
        check!(renewed, "the watchdog sent no renewal within {limit:?}");
        Ok(())
    }

    /// When the store's first refusal of a claim (exclusive or shared) reached the client:
    /// whatever the refused attempt wrote (a reservation, a place in a queue) was written
    /// by then.
    pub(crate) fn first_refusal(&self) -> Option<Instant> {
        self.first_refusal.get().copied()
    }

    fn saw(&self, outcome: Result<AcquireOutcome, LockError>) -> Result<AcquireOutcome, LockError> {
        self.claims.send_modify(|n| *n += 1);
        if let Ok(AcquireOutcome::Held(_)) = outcome {
            if let Some((other, _)) = &self.behind {
                *self.behind_seen.lock().unwrap_or_else(|e| e.into_inner()) =
                    *other.claims.borrow();
            }
            let _ = self.first_refusal.set(Instant::now());
            self.refused.send_replace(true);
        }
        outcome
    }
}

#[async_trait]
impl LockBackend for Observed {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        self.before_attempt().await;
        self.saw(self.inner.claim(request).await)
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(key, owner).await
    }

    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        self.extends.send_modify(|n| *n += renewals.len() as u64);
        if renewals.len() > 1 {
            *self.last_batch.lock().unwrap_or_else(|e| e.into_inner()) =
                renewals.iter().map(|r| r.key.as_str().to_owned()).collect();
        }
        if *self.gate.borrow() {
            self.gated.send_modify(|n| *n += 1);
            let mut open = self.gate.subscribe();
            let _ = open.wait_for(|closed| !*closed).await;
        }
        let answer = self.inner.renew(renewals).await;
        self.answered.send_modify(|n| *n += 1);
        answer
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        self.inner.holders(key).await
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        self.inner.wait_released(key, hint, place, max_wait).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.inner.force_release(key).await
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.inner.abandon(key, owner).await
    }

    fn notifier(&self) -> Option<&ReleaseNotifier> {
        self.inner.notifier()
    }
}
