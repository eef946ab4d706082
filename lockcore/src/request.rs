//! A lock request: its options, their validation, and the calls that send it.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::Either;
use tokio::runtime::Handle;
use tracing::Instrument;

use crate::acquire::{self, no_runtime, Validated};
use crate::guard::{LockGuard, LockHandle};
use crate::inner::ClientInner;
use crate::metrics::WaitOutcome;
use crate::{Claim, LockError, LockKey, Owner, RetryPolicy};

/// Options of one lock request, as its [`LockRequest`] builder set them.
#[derive(Clone, Debug, Default)]
pub(crate) struct LockOptions {
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) owner: Option<Owner>,
    pub(crate) no_watchdog: bool,
    pub(crate) retry: Option<RetryPolicy>,
    pub(crate) shared: bool,
    semaphore: Option<u32>,
    permits: Option<u32>,
}

impl LockOptions {
    /// The options of a claim on a semaphore of `capacity` permits.
    pub(crate) fn semaphore(capacity: u32) -> Self {
        LockOptions {
            semaphore: Some(capacity),
            ..Self::default()
        }
    }

    /// What the request claims of its key.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a shared semaphore, permits without a semaphore, or a
    /// semaphore or permit count out of range.
    pub(crate) fn claim(&self) -> Result<Claim, LockError> {
        match (self.semaphore, self.shared, self.permits) {
            (Some(_), true, _) => Err(LockError::config(
                "a semaphore claim cannot also be shared: permits are already shared up to the semaphore's size",
            )),
            (Some(capacity), false, permits) => Claim::permits(permits.unwrap_or(1), capacity),
            (None, _, Some(_)) => Err(LockError::config(
                "permits() applies to a semaphore: use `semaphore(key, n).permits(k)`",
            )),
            (None, true, None) => Ok(Claim::shared()),
            (None, false, None) => Ok(Claim::exclusive()),
        }
    }
}

/// A request for one lock, built by [`LockClient::lock`](crate::LockClient::lock).
#[derive(Debug)]
#[must_use = "a lock request does nothing until `acquire()` or `try_acquire()` is awaited"]
pub struct LockRequest {
    client: Arc<ClientInner>,
    key: String,
    options: LockOptions,
}

impl LockRequest {
    pub(crate) fn new(client: Arc<ClientInner>, key: String, options: LockOptions) -> Self {
        LockRequest {
            client,
            key,
            options,
        }
    }

    /// The lease TTL (default 30 s, or the client's default). The watchdog renews it every
    /// `ttl / 3` while the guard lives. Rounded up to the backend's minimum; the effective
    /// value is on [`Lease::ttl`](crate::Lease::ttl).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options.ttl = Some(ttl);
        self
    }

    /// How long [`acquire`](Self::acquire) may wait for other holders before failing with
    /// [`LockError::Timeout`]. Without it, `acquire` waits until it holds the lock.
    ///
    /// The deadline bounds the wait, not the first attempt: that one is answered whatever
    /// the deadline, as [`try_acquire`](Self::try_acquire)'s is, so a free key is never
    /// refused because the store answered more slowly than the deadline, and
    /// `wait(Duration::ZERO)` is exactly one attempt. The answer may then come up to one
    /// round trip after the deadline (the backend's request timeout bounds it). After the
    /// first attempt, a deadline that passes gives the request 100 ms more to settle what
    /// is in flight (a grant then is the answer) and to leave the place the store keeps
    /// for it; what is still in flight after that is settled in the background.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options.wait = Some(wait);
        self
    }

    /// Acquires as `owner` instead of a fresh owner. If `owner` already holds the lock
    /// through this client, the request re-enters it at once: same token, same lease, one
    /// watchdog, and the store still sees a single hold, freed when the last guard goes.
    /// The TTL of a re-entering request is ignored (the lease is shared).
    pub fn owner(mut self, owner: Owner) -> Self {
        self.options.owner = Some(owner);
        self
    }

    /// Whether the watchdog renews the lease (default `true`). Without renewal the lock
    /// expires after its TTL and [`LockHandle::lost`](crate::LockHandle::lost) fires shortly before.
    pub fn watchdog(mut self, renew: bool) -> Self {
        self.options.no_watchdog = !renew;
        self
    }

    /// Lets [`acquire`](Self::acquire) retry failures that retrying may fix (the store
    /// unreachable, no Redlock quorum) following `policy`, also without a
    /// [`wait`](Self::wait) deadline: a leader loop that waits forever then survives a
    /// store restart instead of failing at the first refused connection. Without it, such
    /// failures are retried only inside a `wait` deadline (with [`RetryPolicy::new`]'s
    /// backoff), and returned at once otherwise. [`try_acquire`](Self::try_acquire) never
    /// retries.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use std::time::Duration;
    /// use distlock_core::{LockClient, RetryPolicy, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let policy = RetryPolicy::new().max_elapsed(Duration::from_secs(60));
    /// let leader = locks.lock("leader").retry(policy).acquire().await?;
    /// leader.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.options.retry = Some(policy);
        self
    }

    /// Makes this a read (shared) lock: it shares the key with other shared holders and
    /// excludes an exclusive one, like `flock -s` or [`tokio::sync::RwLock::read`]. A plain
    /// [`lock`](crate::LockClient::lock) on the same key is the writer. A writer waiting
    /// behind readers is not starved: readers that arrive after it wait for it (the store
    /// keeps a short-lived reservation for the oldest waiting claim that does not fit).
    ///
    /// Every grant takes the key's next fencing token, so a writer's token is above every
    /// earlier reader's: writers fence their writes; readers only read.
    ///
    /// # Errors
    ///
    /// At [`acquire`](Self::acquire): [`LockError::Config`] if the backend does not support
    /// shared claims ([`Capabilities::shared`](crate::Capabilities::shared)), if the key is
    /// held as a semaphore, or if this owner already holds the key exclusively through this
    /// client (re-entry keeps the mode: no silent upgrade or downgrade).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use distlock_core::{ClaimMode, LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let a = locks.lock("report").shared().acquire().await?;
    /// let b = locks.lock("report").shared().acquire().await?; // readers share
    /// assert_eq!(a.claim().mode(), ClaimMode::Shared);
    /// assert!(locks.lock("report").try_acquire().await?.is_none()); // the writer waits
    /// let last_reader = b.token();
    /// a.release().await?;
    /// b.release().await?;
    /// let writer = locks.lock("report").acquire().await?;
    /// assert!(writer.token() > last_reader);
    /// # Ok(()) }
    /// ```
    pub fn shared(mut self) -> Self {
        self.options.shared = true;
        self
    }

    /// How many permits of the semaphore this request takes (default 1): see
    /// [`LockClient::semaphore`](crate::LockClient::semaphore). A heavy claim waiting
    /// behind lighter ones is not starved: claims that arrive after it leave room for it.
    ///
    /// # Errors
    ///
    /// At [`acquire`](Self::acquire): [`LockError::Config`] unless `1 ≤ permits ≤` the
    /// semaphore's size, or on a request made with [`LockClient::lock`](crate::LockClient::lock).
    pub fn permits(mut self, permits: u32) -> Self {
        self.options.permits = Some(permits);
        self
    }

    /// Runs `work` under the lock and releases it afterwards, waiting for the lock as
    /// [`acquire`](Self::acquire) does.
    ///
    /// `work` gets a [`LockHandle`]: the fencing token to pass to the resource, the lease,
    /// [`extend`](LockHandle::extend), and the [`renewal_failing`](LockHandle::renewal_failing)
    /// early warning. If the lock is lost midway (see [`LockHandle::lost`]), `work` is dropped
    /// at its next `.await` and the call returns [`LockError::Lost`]. Stopping at an `.await`
    /// is not a rollback: whatever `work` already wrote stays written, which is why its
    /// writes must carry the fencing token.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), plus [`LockError::Lost`], plus the release's errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops `work` and releases the lock in the background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use std::time::Duration;
    /// use distlock_core::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let n = locks
    ///     .lock("nightly-report")
    ///     .ttl(Duration::from_secs(5))
    ///     .wait(Duration::from_secs(1))
    ///     .with_lock(|lock| async move {
    ///         lock.token().get() // generate the report, fenced by this token
    ///     })
    ///     .await?;
    /// assert!(n > 0);
    /// # Ok(()) }
    /// ```
    pub async fn with_lock<F, Fut, T>(self, work: F) -> Result<T, LockError>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire().await?;
        run_under(guard, work).await
    }

    /// Runs `work` under the lock if it is free now, and returns `Ok(None)` at once,
    /// without running `work`, if another owner holds it: a cron job's "skip if the last
    /// run is still going". Otherwise as [`with_lock`](Self::with_lock).
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire), plus [`LockError::Lost`], plus the release's
    /// errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, like [`with_lock`](Self::with_lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use distlock_core::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let running = locks.lock("nightly-report").acquire().await?;
    /// let skipped = locks.lock("nightly-report").try_with_lock(|_| async { "ran" }).await?;
    /// assert_eq!(skipped, None);
    /// running.release().await?;
    /// let ran = locks.lock("nightly-report").try_with_lock(|_| async { "ran" }).await?;
    /// assert_eq!(ran, Some("ran"));
    /// # Ok(()) }
    /// ```
    pub async fn try_with_lock<F, Fut, T>(self, work: F) -> Result<Option<T>, LockError>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        match self.try_acquire().await? {
            Some(guard) => run_under(guard, work).await.map(Some),
            None => Ok(None),
        }
    }

    pub(crate) fn validate(&self) -> Result<Validated, LockError> {
        let inner = &self.client;
        let started = inner.now();
        let key = LockKey::new(&self.key)?;
        let inner = &self.client;
        let claim = self.options.claim()?;
        if !inner.caps.supports(&claim) {
            return Err(LockError::claims_unsupported(inner.backend.name(), &claim));
        }
        let requested = self.options.ttl.unwrap_or(inner.default_ttl);
        let ttl = inner.caps.effective_ttl(requested)?;
        if started.checked_add(ttl * 2).is_none() {
            return Err(LockError::InvalidTtl {
                ttl: requested,
                reason: "the TTL overflows the clock".into(),
            });
        }
        if inner.closed.is_cancelled() {
            return Err(LockError::Shutdown);
        }
        Ok(Validated {
            key,
            owner: self
                .options
                .owner
                .clone()
                .unwrap_or_else(|| Owner::with_shared_label(&inner.label)),
            ttl,
            deadline: self.options.wait.and_then(|w| started.checked_add(w)),
            renew: !self.options.no_watchdog,
            started,
            retry: self.options.retry.map(Box::new),
            claim,
            fresh: self.options.owner.is_none(),
        })
    }

    /// Waits until the lock is held and returns its guard.
    ///
    /// While another owner holds the lock, the request sleeps until the backend signals a
    /// release (pub/sub, NOTIFY, watch, or polling where the store has no signal) or the
    /// holder's remaining TTL runs out, plus jitter; it never busy-polls.
    ///
    /// A client's requests for one key are served in arrival order, as
    /// `tokio::sync::Mutex` serves its waiters: only the first of them waits for the store
    /// and tries, and a new request joins the back of the line instead of racing it (so a
    /// task that releases and asks again at once cannot starve the others). Requests of
    /// different clients or processes race for each release unless the backend orders
    /// them itself ([`Capabilities::fairness`](crate::Capabilities::fairness) is [`Fairness::Fifo`](crate::Fairness::Fifo)).
    ///
    /// # Errors
    ///
    /// * [`LockError::InvalidKey`], [`LockError::InvalidTtl`]: before any request is sent.
    /// * [`LockError::Timeout`]: the [`wait`](Self::wait) deadline passed while others held
    ///   the lock; nothing is held.
    /// * [`LockError::Unavailable`], [`LockError::QuorumNotReached`]: the store could not be
    ///   reached (or too few Redlock instances answered). With a [`wait`](Self::wait)
    ///   deadline such failures are retried with jittered backoff until the deadline, and the
    ///   last one is returned then; without a deadline the first is returned at once, unless
    ///   a [`retry`](Self::retry) policy says to go on. A grant whose answer came after its
    ///   lease had ended counts as such a failure: it is released again, never handed out
    ///   as a guard whose lease is already over.
    /// * [`LockError::Backend`]: the store failed in a way retrying will not fix.
    ///
    /// Whatever an answered attempt may have applied is released.
    /// * [`LockError::Shutdown`]: the client was shut down.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. If this future is dropped (a `select!`, a timeout) while an attempt is
    /// in flight, that attempt is handed to a background task that still sees its outcome
    /// and releases whatever it acquired; an attempt answered with an error that may have
    /// been applied is undone by a release by owner. Only an attempt the store never
    /// answered falls back to the TTL. [`LockClient::shutdown`](crate::LockClient::shutdown) waits for that clean-up.
    ///
    /// The request runs in the caller's task, so an attempt in flight advances only while
    /// the future is polled, and it keeps what the store gave it for the attempt (a
    /// connection, a transaction; on SQLite the process's turn to write the file) until
    /// then. Poll it or drop it: a task that leaves it pending in a `select!` and meanwhile
    /// waits for another lock operation on the same store (a release, say) may wait for
    /// itself.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use std::time::Duration;
    /// use distlock_core::{LockClient, LockError, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let held = locks.lock("k").acquire().await?;
    /// let err = locks.lock("k").wait(Duration::from_millis(20)).acquire().await.unwrap_err();
    /// assert!(matches!(err, LockError::Timeout { .. }));
    /// drop(held);
    /// # Ok(()) }
    /// ```
    pub fn acquire(self) -> impl Future<Output = Result<LockGuard, LockError>> + Send + 'static {
        // Checked here (it sends nothing) and handed over boxed: an async fn keeps its
        // arguments for as long as it runs, and with thousands waiting every byte of the
        // request counts.
        match self.validate() {
            Ok(req) => Either::Left(acquire_waiting(self.client, Box::new(req))),
            Err(e) => Either::Right(std::future::ready(Err(e))),
        }
    }

    /// Makes one attempt: `Ok(Some(guard))` if the lock was free (or already held by this
    /// owner through this client), `Ok(None)` if another owner holds it.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), except that contention is `Ok(None)`, never an error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, like [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use distlock_core::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let first = locks.lock("k").try_acquire().await?;
    /// assert!(first.is_some());
    /// assert!(locks.lock("k").try_acquire().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, LockError> {
        let req = self.validate()?;
        let runtime = Handle::try_current().map_err(|_| no_runtime())?;
        let call = Call::start(&self.client, &req, "try");
        let answer = acquire::run(&self.client, req, false, runtime, None)
            .instrument(call.span.clone())
            .await;
        call.answered(answer.as_ref().map(Option::as_ref));
        answer
    }
}

/// [`LockRequest::acquire`] once the request was checked.
async fn acquire_waiting(
    client: Arc<ClientInner>,
    req: Box<Validated>,
) -> Result<LockGuard, LockError> {
    let runtime = Handle::try_current().map_err(|_| no_runtime())?;
    let call = Call::start(&client, &req, "wait");
    let (deadline, started) = (req.deadline, req.started);
    // Only a wait deadline reads what the request shares with it.
    let retrying = deadline.map(|_| acquire::Retrying::default());
    // Boxed: the attempt lives on through the deadline's `Timeout` and the span's
    // `Instrumented`, and a future moved into another keeps its place in the one it
    // came from, so inline it would be paid for several times by every waiter.
    let attempt = Box::pin(acquire::run(&client, *req, true, runtime, retrying.clone()));
    let answer = async {
        let answer = match deadline.zip(retrying) {
            // The loop answers at the deadline itself while idle; this bound covers the
            // rest. The first attempt is answered whatever the deadline, as
            // `try_acquire`'s one attempt is: a free key is never refused because the store
            // answered more slowly than the deadline (`wait(Duration::ZERO)` is one
            // attempt). Past the deadline the request gets a moment more: a later attempt
            // in flight may still answer (a grant is the answer), and a request idle at the
            // deadline leaves the place or mark it keeps in the store. Then dropping the
            // request hands an attempt still in flight to a task that releases whatever it
            // acquires; if that attempt was a retry after a store failure, the failure is
            // the answer, not a timeout.
            // Boxed: its timers are large, and a request without a deadline (most
            // waiters, when thousands wait) would keep room for them.
            Some((deadline, retrying)) => {
                Box::pin(async move {
                    let mut attempt = attempt;
                    let answer = match tokio::time::timeout_at(deadline.into(), attempt.as_mut())
                        .await
                    {
                        Ok(answer) => Some(answer),
                        Err(_) if retrying.first_in_flight() => Some(attempt.as_mut().await),
                        Err(_) => tokio::time::timeout(acquire::LEAVING_GRACE, attempt.as_mut())
                            .await
                            .ok(),
                    };
                    match answer {
                        Some(answer) => answer,
                        None => match retrying
                            .failure
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .take()
                        {
                            Some(failure) => Err(failure),
                            None => Ok(None),
                        },
                    }
                })
                .await
            }
            None => attempt.await,
        };
        answer?.ok_or_else(|| LockError::Timeout {
            key: call.key.clone(),
            waited: client.elapsed(started),
        })
    }
    .instrument(call.span.clone())
    .await;
    call.answered(match &answer {
        Ok(guard) => Ok(Some(guard)),
        Err(e) => Err(e),
    });
    answer
}

/// One call to [`LockRequest::acquire`] or [`try_acquire`](LockRequest::try_acquire) as the
/// outside sees it: its span (key, backend, mode, then outcome and token) and its wait in the
/// client's metrics. A call dropped before its answer counts as cancelled.
struct Call<'a> {
    client: &'a ClientInner,
    key: LockKey,
    started: Instant,
    span: tracing::Span,
    answered: bool,
}

impl<'a> Call<'a> {
    fn start(client: &'a ClientInner, req: &Validated, kind: &'static str) -> Self {
        // Made only when a subscriber may want INFO spans: a disabled span still costs its
        // enters, exits and records (with `tracing`'s `log` feature, this span and
        // `distlock.release` are a visible share of a cycle in lockbench `memory --case
        // uncontended`). Without a subscriber, `log` sees no span lines for them either.
        let span = if crate::info_spans_enabled() {
            tracing::info_span!(
                "distlock.acquire",
                key = %req.key,
                backend = client.backend.name(),
                mode = %req.claim.mode(),
                kind,
                outcome = tracing::field::Empty,
                token = tracing::field::Empty,
            )
        } else {
            tracing::Span::none()
        };
        Call {
            client,
            key: req.key.clone(),
            started: req.started,
            span,
            answered: false,
        }
    }

    fn answered(mut self, answer: Result<Option<&LockGuard>, &LockError>) {
        self.answered = true;
        let outcome = match answer {
            Ok(Some(guard)) => {
                self.span.record("token", guard.token().get());
                WaitOutcome::Acquired
            }
            Ok(None) => WaitOutcome::Contended,
            Err(LockError::Timeout { .. }) => WaitOutcome::Timeout,
            Err(_) => WaitOutcome::Error,
        };
        self.record(outcome);
    }

    fn record(&self, outcome: WaitOutcome) {
        self.span.record("outcome", outcome.as_str());
        let waited = self.client.elapsed(self.started);
        self.client.meter.waited(&self.key, outcome, waited);
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.record(WaitOutcome::Cancelled);
        }
    }
}

/// Runs `work` under `guard`: stops it if the lock is lost, releases afterwards.
async fn run_under<F, Fut, T>(guard: LockGuard, work: F) -> Result<T, LockError>
where
    F: FnOnce(LockHandle) -> Fut,
    Fut: Future<Output = T>,
{
    let lost = guard.lost();
    let out = tokio::select! {
        biased;
        _ = lost => None,
        v = work(guard.handle()) => Some(v),
    };
    match out {
        Some(v) => {
            guard.release().await?;
            Ok(v)
        }
        None => {
            let key = guard.key().clone();
            drop(guard);
            Err(LockError::Lost { key })
        }
    }
}
