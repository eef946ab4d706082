//! [`RedlockBackend`]: the Redlock algorithm over N independent Redis masters, each run
//! with driver-redis's scripts and connections.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use driver_redis::__redlock as support;
use driver_redis::redis::{Cmd, FromRedisValue, Script, ScriptInvocation, Value};
use driver_redis::RedisBackend;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lockcore::store_url::StoreUrl;
use lockcore::{
    clock_drift, AcquireOutcome, Capabilities, Contention, ExtendOutcome, FencingToken, Grant,
    LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseNotifier, ReleaseOutcome, WaitHint,
};
use tokio::sync::OnceCell;

use crate::CAPABILITIES;

/// The backend name used in errors and logs.
pub const NAME: &str = "redlock";

/// The key prefix used unless the builder sets another (the same as driver-redis's).
pub const DEFAULT_PREFIX: &str = driver_redis::DEFAULT_PREFIX;

/// How long connecting to one instance may take unless the builder sets another bound.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The per-instance timeout of operations that carry no TTL (release, inspect, waiting,
/// force-release) unless the builder sets one.
pub const DEFAULT_UNTIMED_INSTANCE_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a release nonce is remembered to count its messages from the instances.
const NONCE_MEMORY: Duration = Duration::from_secs(10);

/// The per-instance timeout derived from a lock's TTL when the builder sets none: a tenth
/// of the TTL, at least 25 ms and at most 1 s, and never above a third of the TTL — far
/// below the TTL, so an unresponsive instance costs little of the lease's validity.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use driver_redlock::default_instance_timeout;
///
/// assert_eq!(default_instance_timeout(Duration::from_secs(30)), Duration::from_secs(1));
/// assert_eq!(default_instance_timeout(Duration::from_secs(2)), Duration::from_millis(200));
/// assert_eq!(default_instance_timeout(Duration::from_millis(30)), Duration::from_millis(10));
/// ```
pub fn default_instance_timeout(ttl: Duration) -> Duration {
    (ttl / 10)
        .clamp(Duration::from_millis(25), Duration::from_secs(1))
        .min(ttl / 3)
        .max(Duration::from_millis(1))
}

/// Redlock over N independent Redis masters (not replicas of each other).
///
/// Every operation goes to all instances **in parallel**, each bounded by a per-instance
/// timeout far below the TTL, and runs there the same Lua script as driver-redis's
/// single-instance lock. An acquisition succeeds only when a majority (N/2+1) granted it
/// within `ttl − elapsed − drift` (drift = 1% of the TTL + 2 ms); the lease's validity is
/// exactly that. When it fails, it is released on every instance, including those that did
/// not answer in time, so a late grant cannot linger.
///
/// * Contention (another owner holds a majority) is [`AcquireOutcome::Held`] with the time
///   until enough instances free up; [`LockError::QuorumNotReached`] is only for too few
///   instances *answering*. A split vote (no owner has a majority) is `Held` with a short
///   random back-off, after which the client tries again.
/// * Fencing (on by default, [`RedlockBackendBuilder::fencing`]): each grant bumps that
///   instance's fence to `max(c + 1, now_us)`; the client takes T = max over the grants,
///   writes `max(c, T)` back to every granting instance (and T into the lock value there),
///   and hands out the lease only when a majority acknowledged and validity is still
///   positive. Tokens are *clock-assisted*: see `docs/redlock.md` for the assumption.
///   Without fencing, a round and the fence key are saved and every token is 0.
/// * Release and extend go to all instances; extend succeeds only with a majority within
///   the new validity. [`release_counted`](Self::release_counted) and
///   [`extend_counted`](Self::extend_counted) report how many instances agreed.
/// * Waiting: one pub/sub connection per instance (driver-redis's waiters); a waiter's
///   re-check marks the copies it finds held, and a release announces itself on the
///   instances where its copy was marked; this backend wakes one waiter at the first
///   announcement of a release — the one that has waited longest, counting from its first
///   failed attempt. A release nobody marked wakes the releasing backend's own waiters
///   in-process.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), lockcore::LockError> {
/// use std::time::Duration;
/// use lockcore::LockClient;
///
/// let backend = driver_redlock::RedlockBackend::builder([
///     "redis://10.0.0.1:6379/",
///     "redis://10.0.0.2:6379/",
///     "rediss://10.0.0.3:6380/",
/// ])
/// .prefix("billing:")
/// .build()
/// .await?;
/// let locks = LockClient::new(backend);
/// let guard = locks.lock("invoice:42").ttl(Duration::from_secs(30)).acquire().await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

struct Inner {
    instances: Vec<Instance>,
    quorum: usize,
    prefix: String,
    fencing: bool,
    time_floor: bool,
    instance_timeout: Option<Duration>,
    connect_timeout: Duration,
    tls: Option<TlsFiles>,
    notifier: Arc<ReleaseNotifier>,
    filter: support::MessageFilter,
    announcements: Arc<Announcements>,
    nonce_base: u64,
    nonces: AtomicU64,
}

#[derive(Clone)]
struct TlsFiles {
    root: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

struct Instance {
    /// `host:port`, for logs and Debug (never the credentials).
    label: String,
    url: StoreUrl,
    backend: OnceCell<Arc<RedisBackend>>,
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<&str> = self
            .inner
            .instances
            .iter()
            .map(|i| i.label.as_str())
            .collect();
        f.debug_struct("RedlockBackend")
            .field("instances", &labels)
            .field("quorum", &self.inner.quorum)
            .field("prefix", &self.inner.prefix)
            .field("fencing", &self.inner.fencing)
            .finish_non_exhaustive()
    }
}

/// The instances that did not answer in a round, and how each failed.
#[derive(Default)]
struct Failures {
    /// The first error: returned as it is when retrying cannot fix it (see
    /// [`Inner::too_few`]).
    first: Option<LockError>,
    /// `host:port: cause` of each failure, for [`LockError::QuorumNotReached`].
    each: Vec<String>,
}

impl Failures {
    fn add(&mut self, instance: &str, e: LockError) {
        self.each.push(format!("{instance}: {}", cause(&e)));
        self.first.get_or_insert(e);
    }
}

/// What the Redis client said, without the driver's "redis is unavailable" wrapper (the
/// instance is named instead) and without a level that only repeats the one below.
fn cause(e: &LockError) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        match parts.last_mut() {
            Some(last) if last.contains(&text) => {}
            // A level whose text ends with the one below it ("…: Connection refused"):
            // keep the longer one.
            Some(last) if text.contains(last.as_str()) => *last = text,
            _ => parts.push(text),
        }
        source = s.source();
    }
    if parts.is_empty() {
        e.to_string()
    } else {
        parts.join(": ")
    }
}

/// How many instances agreed to a release or an extension, out of how many answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Agreement {
    /// Instances that released (or extended) the owner's lock.
    pub agreed: usize,
    /// Instances that answered at all (the rest failed or timed out).
    pub answered: usize,
    /// Instances configured.
    pub instances: usize,
    /// The majority needed: N/2+1.
    pub quorum: usize,
}

/// Builds a [`RedlockBackend`]; see [`RedlockBackend::builder`].
#[must_use]
pub struct RedlockBackendBuilder {
    /// One parsed `redis://` URL per instance (passwords kept as secrets), or why one
    /// does not parse, reported by `build`.
    urls: Vec<Result<StoreUrl, LockError>>,
    prefix: String,
    instance_timeout: Option<Duration>,
    connect_timeout: Duration,
    fencing: bool,
    time_floor: bool,
    tls: Option<TlsFiles>,
}

impl std::fmt::Debug for RedlockBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<String> = self
            .urls
            .iter()
            .map(|u| u.as_ref().map_or("<malformed URL>".to_owned(), label))
            .collect();
        f.debug_struct("RedlockBackendBuilder")
            .field("instances", &labels)
            .field("prefix", &self.prefix)
            .field("instance_timeout", &self.instance_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("fencing", &self.fencing)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// `host:port` of an instance URL, without scheme or credentials.
fn label(url: &StoreUrl) -> String {
    match url.endpoints() {
        [one] => one.host_port(6379),
        _ => url.path().to_owned(),
    }
}

impl RedlockBackend {
    /// A builder for a backend on the given instances, one `redis://` or `rediss://` URL
    /// each (driver-redis's URL syntax: credentials, TLS and database per instance).
    ///
    /// Use an odd number of instances, at least 3: a majority of N is N/2+1, so 4 instances
    /// survive the loss of one, like 3, and 2 survive none. One instance works (it is then
    /// the single-instance lock, without Redlock's fault tolerance).
    pub fn builder<I, S>(instances: I) -> RedlockBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder_for(
            instances
                .into_iter()
                .map(|u| StoreUrl::parse(&u.into()))
                .collect(),
        )
    }

    fn builder_for(urls: Vec<Result<StoreUrl, LockError>>) -> RedlockBackendBuilder {
        RedlockBackendBuilder {
            urls,
            prefix: DEFAULT_PREFIX.to_owned(),
            instance_timeout: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            fencing: true,
            time_floor: true,
            tls: None,
        }
    }

    /// A builder from a `redlock://` URL (see [`connect`](crate::connect) for the syntax);
    /// the URL's options are applied, and the builder can override them.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a malformed URL (the message never shows a password).
    pub fn builder_from_url(url: &str) -> Result<RedlockBackendBuilder, LockError> {
        let parsed = crate::url::parse(url)?;
        let mut builder =
            RedlockBackend::builder_for(parsed.instances.into_iter().map(Ok).collect());
        if let Some(prefix) = parsed.prefix {
            builder = builder.prefix(prefix);
        }
        if let Some(t) = parsed.instance_timeout {
            builder = builder.instance_timeout(t);
        }
        if let Some(t) = parsed.connect_timeout {
            builder = builder.connect_timeout(t);
        }
        if let Some(f) = parsed.fencing {
            builder = builder.fencing(f);
        }
        Ok(builder)
    }

    /// The number of instances.
    pub fn instances(&self) -> usize {
        self.inner.instances.len()
    }

    /// The majority needed: N/2+1.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// The key prefix this backend stores locks under.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// Whether acquisitions run the fencing write-back round.
    pub fn fencing(&self) -> bool {
        self.inner.fencing
    }

    /// Releases `owner`'s lock on every instance and says how many released it:
    /// [`ReleaseOutcome::Released`] when a majority did.
    ///
    /// # Errors
    ///
    /// [`LockError::QuorumNotReached`] when too few instances answered to tell (those that
    /// answered did release; the rest free it at its TTL).
    pub async fn release_counted(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<(ReleaseOutcome, Agreement), LockError> {
        let inner = &self.inner;
        let names = support::names(&inner.prefix, key);
        let nonce = inner.nonce();
        let results = inner
            .release_on(
                &names,
                &owner.token().to_hex(),
                &nonce,
                inner.untimed(),
                |_| true,
                |results, pending| {
                    let released = results
                        .iter()
                        .filter(|(_, r)| matches!(r, Ok(1 | 2)))
                        .count();
                    released >= inner.quorum || released + pending < inner.quorum
                },
            )
            .await;
        let mut agreement = inner.agreement();
        let mut failures = Failures::default();
        let mut announced = 0;
        for (i, r) in results {
            match r {
                Ok(n) => {
                    agreement.answered += 1;
                    if n >= 1 {
                        agreement.agreed += 1;
                    }
                    if n == 2 {
                        announced += 1;
                    }
                }
                Err(e) => {
                    failures.add(&inner.instances[i].label, e);
                }
            }
        }
        tracing::debug!(key = %key, released = agreement.agreed, announced, answered = agreement.answered, "redlock release");
        if agreement.agreed > 0 && announced == 0 && inner.notifier.has_subscribers() {
            // No copy was marked (as far as the answers so far tell): no waiter of another
            // client watches this lock, but one of ours may sleep on it since an earlier
            // holder. Counted as this release's wake-up, so that an announcement from a
            // straggler does not wake a second waiter of ours.
            inner.announcements.wake_once(key, nonce.as_bytes());
        }
        let unanswered = agreement.instances - agreement.answered;
        if agreement.agreed >= inner.quorum {
            Ok((ReleaseOutcome::Released, agreement))
        } else if agreement.agreed + unanswered >= inner.quorum {
            Err(inner.too_few(agreement.answered, failures))
        } else {
            Ok((ReleaseOutcome::NotHeld, agreement))
        }
    }

    /// Renews `owner`'s lease on every instance and says how many renewed it:
    /// [`ExtendOutcome::Extended`] when a majority did within the new validity
    /// (`ttl − elapsed − drift`, which is the grant's `valid_until`).
    ///
    /// # Errors
    ///
    /// [`LockError::QuorumNotReached`] when too few instances answered to tell;
    /// [`LockError::Unavailable`] when a majority renewed but only after the new validity
    /// had run out.
    pub async fn extend_counted(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<(ExtendOutcome, Agreement), LockError> {
        let inner = &self.inner;
        let ttl_ms = support::ttl_millis(ttl)?;
        let applied = Duration::from_millis(ttl_ms);
        let timeout = inner.timeout_for(applied);
        let names = support::names(&inner.prefix, key);
        let owner_hex = owner.token().to_hex();
        let started = Instant::now();
        let valid_until = started + applied.saturating_sub(clock_drift(applied));
        let mut inv = support::EXTEND.key(&names.lock);
        inv.arg(&owner_hex).arg(ttl_ms);
        let inv = Arc::new(inv);
        let n = inner.instances.len();
        let mut pending = Round::new(
            "extend",
            timeout,
            n,
            (0..n).map(|i| inner.op(i, timeout, "extend", inv.clone())),
        );
        let q = inner.quorum;
        let mut agreement = inner.agreement();
        let mut tokens = Vec::new();
        let mut failures = Failures::default();
        while let Some((i, r)) = pending.next().await {
            match r.and_then(|reply: Vec<Value>| parse_extend(&reply)) {
                Ok(Some(token)) => {
                    agreement.answered += 1;
                    agreement.agreed += 1;
                    tokens.push(token);
                }
                Ok(None) => agreement.answered += 1,
                Err(e) => {
                    tracing::debug!(instance = %inner.instances[i].label, error = %lockcore::ErrorChain(&e), "redlock extend failed on an instance");
                    failures.add(&inner.instances[i].label, e);
                }
            }
            if decided(agreement.agreed, agreement.answered, pending.len(), q) {
                break;
            }
        }
        pending.detach();
        tracing::debug!(key = %key, extended = agreement.agreed, answered = agreement.answered, "redlock extend");
        if agreement.agreed < q {
            if agreement.answered < q {
                return Err(inner.too_few(agreement.answered, failures));
            }
            return Ok((ExtendOutcome::NotHeld, agreement));
        }
        if Instant::now() >= valid_until {
            return Err(LockError::unavailable(
                NAME,
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "a majority renewed the lock only after its new validity had run out",
                ),
            ));
        }
        let token = common_token(&tokens).ok_or_else(|| support::unexpected("extend tokens"))?;
        Ok((
            ExtendOutcome::Extended(Grant::new(token, applied).with_valid_until(valid_until)),
            agreement,
        ))
    }
}

/// The grant script when fencing is off: the owner-checked `SET NX PX` with the same-owner
/// re-grant of driver-redis's acquire (same value layout, so release, extend and inspect are
/// shared), without its fence key and `TIME` read. Its token is always 0.
///
/// `KEYS[1]` lock key; `ARGV[1]` owner token (32 hex digits), `ARGV[2]` TTL in ms,
/// `ARGV[3]` holder label. Returns `{1, token}` when granted, `{0, pttl}` when another
/// owner holds it.
static ACQUIRE_UNFENCED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('SET', KEYS[1], ARGV[1] .. ' 0 ' .. ARGV[3], 'NX', 'PX', ARGV[2]) then
  return {1, '0'}
end
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then
  local ttl = tonumber(ARGV[2])
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return {1, string.match(v, '^%x+[ +](%d+)')}
end
return {0, redis.call('PTTL', KEYS[1])}
",
    )
});

/// What round 1 of an acquisition sends to each instance.
enum GrantRequest {
    /// Fencing on: the grant script with its fence bump.
    Fenced(ScriptInvocation<'static>),
    /// Fencing off: a plain `SET NX PX`, and [`ACQUIRE_UNFENCED`] where it is refused,
    /// built at the first refusal (most grants never need it).
    Unfenced {
        set: Cmd,
        lock: String,
        owner: Owner,
        ttl_ms: u64,
        fallback: OnceLock<ScriptInvocation<'static>>,
    },
}

impl GrantRequest {
    /// The script to run where the `SET NX PX` was refused (fencing off).
    fn fallback(&self) -> &ScriptInvocation<'static> {
        match self {
            GrantRequest::Fenced(script) => script,
            GrantRequest::Unfenced {
                lock,
                owner,
                ttl_ms,
                fallback,
                ..
            } => fallback.get_or_init(|| {
                let mut inv = ACQUIRE_UNFENCED.key(lock);
                inv.arg(owner.token().to_hex())
                    .arg(*ttl_ms)
                    .arg(owner.label());
                inv
            }),
        }
    }
}

/// The fencing write-back of `token` for `owner_hex`'s lock (round 2).
fn write_back(
    names: &support::Names,
    owner_hex: &str,
    token: FencingToken,
) -> ScriptInvocation<'static> {
    let mut inv = support::WRITE_BACK.key(&names.lock);
    inv.key(names.fence())
        .arg(owner_hex)
        .arg(token.0.to_string())
        .arg(support::fence_ttl_millis());
    inv
}

/// Whether a round can stop waiting: a majority agreed, nothing is pending, or a majority
/// can no longer agree and enough instances answered to say so (otherwise the pending ones
/// decide between "refused" and "too few answered").
fn decided(agreed: usize, answered: usize, pending: usize, quorum: usize) -> bool {
    agreed >= quorum || pending == 0 || (agreed + pending < quorum && answered >= quorum)
}

/// The token most instances reported (the written-back T), the highest among equals.
fn common_token(tokens: &[FencingToken]) -> Option<FencingToken> {
    let mut counts: HashMap<FencingToken, usize> = HashMap::new();
    for t in tokens {
        *counts.entry(*t).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|(t, n)| (*n, *t))
        .map(|(t, _)| t)
}

/// The answers of one round: a request to each of `n` instances (or some of them), all
/// sent at once and therefore sharing one deadline, the per-instance timeout. One timer per
/// round instead of one per request. An instance that has not answered by the deadline
/// answers `Unavailable` (timed out), and its request is dropped.
struct Round<F> {
    pending: FuturesUnordered<F>,
    /// Instances asked and not answered yet.
    outstanding: Vec<bool>,
    left: usize,
    what: &'static str,
    timeout: Duration,
    deadline: Instant,
    /// Armed at the first poll that has to wait.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    expired: bool,
}

impl<F, T> Round<F>
where
    F: Future<Output = (usize, Result<T, LockError>)> + Send + 'static,
    T: Send + 'static,
{
    /// A round of `requests` (each answering with its instance's index) among `n` instances.
    fn new(
        what: &'static str,
        timeout: Duration,
        n: usize,
        requests: impl IntoIterator<Item = (usize, F)>,
    ) -> Self {
        let mut outstanding = vec![false; n];
        let pending: FuturesUnordered<F> = requests
            .into_iter()
            .map(|(i, request)| {
                outstanding[i] = true;
                request
            })
            .collect();
        Round {
            left: pending.len(),
            pending,
            outstanding,
            what,
            timeout,
            deadline: Instant::now() + timeout,
            timer: None,
            expired: false,
        }
    }

    /// How many instances have not answered yet.
    fn len(&self) -> usize {
        self.left
    }

    fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// The next answer, or `None` when every instance asked has answered.
    async fn next(&mut self) -> Option<(usize, Result<T, LockError>)> {
        std::future::poll_fn(|cx| self.poll_answer(cx)).await
    }

    fn poll_answer(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<(usize, Result<T, LockError>)>> {
        if !self.expired {
            match self.pending.poll_next_unpin(cx) {
                Poll::Ready(Some((i, r))) => return Poll::Ready(Some(self.answered(i, r))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => {}
            }
            let deadline = self.deadline;
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline.into())));
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.expired = true;
            self.pending = FuturesUnordered::new();
        }
        match self.outstanding.iter().position(|o| *o) {
            Some(i) => {
                let timed_out = support::timed_out(self.what, self.timeout);
                Poll::Ready(Some(self.answered(i, Err(timed_out))))
            }
            None => Poll::Ready(None),
        }
    }

    fn answered(&mut self, i: usize, r: Result<T, LockError>) -> (usize, Result<T, LockError>) {
        self.outstanding[i] = false;
        self.left -= 1;
        (i, r)
    }

    /// Lets the requests still unanswered finish in the background, bounded by their
    /// connection's response timeout: a request dropped before its connection wrote it is
    /// never sent (a release must reach every instance).
    ///
    /// Each request is first handed to its connection here, before the caller goes on: a
    /// request polled first by the background task could queue behind the caller's next
    /// one on the same connection (a release undoing a failed attempt behind the same
    /// owner's next grant, which it would then delete).
    fn detach(mut self) {
        let mut cx = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
        // Polls every request not yet polled, until all are waiting for their answers.
        while let Poll::Ready(Some(_)) = self.pending.poll_next_unpin(&mut cx) {}
        if !self.pending.is_empty() {
            tokio::spawn(self.pending.for_each(|_| async {}));
        }
    }

    /// The requests still unanswered, for a task that waits for them itself.
    fn into_pending(self) -> FuturesUnordered<F> {
        self.pending
    }
}

/// Appends `v` in lowercase hex, at least `width` digits.
fn push_hex(out: &mut String, v: u64, width: usize) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let digits = (16 - (v.leading_zeros() as usize) / 4).max(width.min(16));
    for shift in (0..digits).rev() {
        let nibble = (v >> (shift * 4)) & 0xf;
        out.push(char::from(DIGITS[nibble as usize]));
    }
}

enum Acquired {
    Granted(FencingToken),
    Held(Option<Duration>),
}

fn parse_acquire(reply: &[Value]) -> Result<Acquired, LockError> {
    match reply {
        [flag, token] if support::as_int(flag) == Some(1) => support::as_token(token)
            .map(Acquired::Granted)
            .ok_or_else(|| support::unexpected("acquire token")),
        [flag, pttl] if support::as_int(flag) == Some(0) => Ok(Acquired::Held(
            support::as_int(pttl).and_then(support::remaining),
        )),
        _ => Err(support::unexpected("acquire reply")),
    }
}

fn parse_extend(reply: &[Value]) -> Result<Option<FencingToken>, LockError> {
    match reply {
        [flag, token] if support::as_int(flag) == Some(1) => support::as_token(token)
            .map(Some)
            .ok_or_else(|| support::unexpected("extend token")),
        [flag] if support::as_int(flag) == Some(0) => Ok(None),
        _ => Err(support::unexpected("extend reply")),
    }
}

/// One instance's view of a key: `None` when free, else (owner hex, token, label, PTTL).
type Seen = Option<(String, FencingToken, String, Option<Duration>)>;

fn parse_inspect(reply: &[Value]) -> Result<Seen, LockError> {
    match reply {
        [] => Ok(None),
        [Value::BulkString(value), pttl] => {
            let (token, label) =
                support::parse_value(value).ok_or_else(|| support::unexpected("lock value"))?;
            let owner = value
                .get(..32)
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            Ok(Some((
                owner.into_owned(),
                token,
                label,
                support::as_int(pttl).and_then(support::remaining),
            )))
        }
        _ => Err(support::unexpected("inspect reply")),
    }
}

/// The time until at most `free_after` of these holds remain: the holds sorted longest
/// first, the one at index `free_after` (`None`, no expiry, counts as longest).
fn time_until_at_most(mut holds: Vec<Option<Duration>>, free_after: usize) -> Option<Duration> {
    holds.sort_by(|a, b| match (a, b) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, _) => std::cmp::Ordering::Less,
        (_, None) => std::cmp::Ordering::Greater,
        (Some(a), Some(b)) => b.cmp(a),
    });
    holds.get(free_after).copied().flatten()
}

/// How long after the first announcement of a release a waiter is woken even though fewer
/// than a majority of instances announced it (see [`release_filter`]).
const PARTIAL_ANNOUNCEMENT_WAKE: Duration = Duration::from_millis(2);

/// The filter shared by every instance's pub/sub reader. A release announces itself with
/// one nonce on each instance where it freed a copy a waiter had marked; this backend wakes
/// one of its waiters per release: at the `quorum`-th announcement, when the lock is free on
/// a majority and the woken waiter can win, or [`PARTIAL_ANNOUNCEMENT_WAKE`] after the first
/// if no majority announced by then (through `notifier`).
///
/// The first announcement always comes: a waiter sleeps only after its re-check found (and
/// marked) more than N − q copies held, and a majority holder has q copies, so they share
/// an instance. A majority of announcements does not always come: the holder may have only
/// some of its copies marked (its other copies were not yet held when the waiter looked).
/// Waiting for the quorum-th alone then slept until the TTL (caught by
/// `contended_handoff_keeps_waking`); waking at the first alone woke waiters before the
/// release had reached a majority (more lost races: failed tries per acquisition in
/// lockbench's hand-off rose from 2.0 to 2.6 unfenced and from 3.0 to 4.0 fenced; 2.2 and
/// 3.7 with this filter).
fn release_filter(announcements: Arc<Announcements>) -> support::MessageFilter {
    Arc::new(move |key: &LockKey, payload: &[u8]| announcements.heard(key, payload))
}

/// The announcements of releases heard by this backend, counted per (key, nonce), and
/// whether each release woke a waiter yet: once per release, whichever comes first of the
/// quorum-th announcement, the partial-announcement timer, or this backend's own release
/// that nobody announced.
struct Announcements {
    quorum: usize,
    notifier: Arc<ReleaseNotifier>,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    /// Per (key, nonce): announcements heard, since when, and whether a waiter was woken.
    map: HashMap<(LockKey, Vec<u8>), (usize, Instant, bool)>,
    sweep_at: usize,
}

impl Announcements {
    fn new(quorum: usize, notifier: Arc<ReleaseNotifier>) -> Arc<Self> {
        Arc::new(Announcements {
            quorum,
            notifier,
            counts: Mutex::default(),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The entry of (key, nonce), sweeping old entries now and then.
    fn entry<'a>(
        counts: &'a mut Counts,
        key: &LockKey,
        nonce: &[u8],
    ) -> &'a mut (usize, Instant, bool) {
        let now = Instant::now();
        if counts.map.len() >= counts.sweep_at {
            counts
                .map
                .retain(|_, (_, at, _)| now.duration_since(*at) < NONCE_MEMORY);
            counts.sweep_at = (counts.map.len() * 2).max(256);
        }
        counts
            .map
            .entry((key.clone(), nonce.to_vec()))
            .or_insert((0, now, false))
    }

    /// A message from an instance's pub/sub reader: whether to wake a waiter now.
    fn heard(self: &Arc<Self>, key: &LockKey, payload: &[u8]) -> bool {
        // `1` is the single-instance driver's message (no nonce to count by).
        if payload == b"1" {
            return true;
        }
        let mut counts = self.counts();
        let entry = Self::entry(&mut counts, key, payload);
        entry.0 += 1;
        if entry.2 {
            return false;
        }
        if entry.0 >= self.quorum {
            entry.2 = true;
            return true;
        }
        if entry.0 == 1 {
            // The reader runs on a runtime; without one (never), the TTL is the fallback.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let (this, key, nonce) = (self.clone(), key.clone(), payload.to_vec());
                runtime.spawn(async move {
                    tokio::time::sleep(PARTIAL_ANNOUNCEMENT_WAKE).await;
                    this.wake_once(&key, &nonce);
                });
            }
        }
        false
    }

    /// Wakes one waiter for the release (key, nonce) unless one was woken for it already.
    fn wake_once(&self, key: &LockKey, nonce: &[u8]) {
        let wake = {
            let mut counts = self.counts();
            let entry = Self::entry(&mut counts, key, nonce);
            !std::mem::replace(&mut entry.2, true)
        };
        if wake {
            self.notifier.notify_one(key);
        }
    }
}

impl Inner {
    fn agreement(&self) -> Agreement {
        Agreement {
            agreed: 0,
            answered: 0,
            instances: self.instances.len(),
            quorum: self.quorum,
        }
    }

    /// The per-instance timeout for a lock of `ttl`.
    fn timeout_for(&self, ttl: Duration) -> Duration {
        self.instance_timeout
            .unwrap_or_else(|| default_instance_timeout(ttl))
    }

    /// The per-instance timeout of operations without a TTL.
    fn untimed(&self) -> Duration {
        self.instance_timeout
            .unwrap_or(DEFAULT_UNTIMED_INSTANCE_TIMEOUT)
    }

    /// A release's nonce: this backend's random base and a counter, in hex (built by hand,
    /// as it is made for every release).
    fn nonce(&self) -> String {
        let mut nonce = String::with_capacity(32);
        push_hex(&mut nonce, self.nonce_base, 16);
        push_hex(&mut nonce, self.nonces.fetch_add(1, Ordering::Relaxed), 1);
        nonce
    }

    /// The error for a round that too few instances answered: the first error that
    /// retrying cannot fix (a wrong password, a script error) if there was one, else
    /// [`LockError::QuorumNotReached`] naming each instance that failed and how.
    fn too_few(&self, answered: usize, failures: Failures) -> LockError {
        match failures.first {
            Some(e @ (LockError::Backend { .. } | LockError::Config { .. })) => e,
            _ => LockError::QuorumNotReached {
                got: answered,
                needed: self.quorum,
                failures: failures.each,
                context: None,
            },
        }
    }

    fn redis_builder(&self, url: &StoreUrl) -> driver_redis::RedisBackendBuilder {
        // A round bounds its requests by the per-instance timeout; the connection's own
        // response timeout bounds the stragglers a round leaves to finish in the
        // background, and must not cut a longer per-instance timeout short.
        let response_timeout = self
            .instance_timeout
            .map_or(driver_redis::DEFAULT_RESPONSE_TIMEOUT, |t| {
                t.max(driver_redis::DEFAULT_RESPONSE_TIMEOUT)
            });
        let mut builder = RedisBackend::builder_for(url.clone())
            .prefix(&self.prefix)
            .connect_timeout(self.connect_timeout)
            .response_timeout(response_timeout)
            .shared_release_notifier(self.notifier.clone(), Some(self.filter.clone()));
        if let Some(tls) = &self.tls {
            if let Some(root) = &tls.root {
                builder = builder.tls_root_certificate(root.clone());
            }
            if let Some((cert, key)) = &tls.client {
                builder = builder.tls_client_certificate(cert.clone(), key.clone());
            }
        }
        builder
    }

    /// Instance `i`'s connection, connecting first if it was unreachable so far.
    async fn instance(&self, i: usize, timeout: Duration) -> Result<Arc<RedisBackend>, LockError> {
        if let Some(b) = self.instances[i].backend.get() {
            return Ok(b.clone());
        }
        // Boxed: the connecting future is large, and every request of every round would
        // otherwise carry (and move) its space, though it is almost never used.
        Box::pin(self.connect(i, timeout)).await
    }

    /// Connects instance `i` (or waits for a connection attempt already under way).
    async fn connect(&self, i: usize, timeout: Duration) -> Result<Arc<RedisBackend>, LockError> {
        let slot = &self.instances[i];
        let connect = slot
            .backend
            .get_or_try_init(|| self.redis_builder(&slot.url).build());
        match tokio::time::timeout(timeout, connect).await {
            Ok(Ok(b)) => Ok(b.clone()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(support::timed_out("connecting", timeout)),
        }
    }

    /// One script on instance `i` (connecting first, within `timeout`, if it was unreachable
    /// so far), as a future that owns everything, so a round's stragglers can finish in the
    /// background. A round builds its invocation once and shares it among its instances,
    /// and bounds them all with one deadline ([`Round`]).
    fn op<T>(
        self: &Arc<Self>,
        i: usize,
        timeout: Duration,
        what: &'static str,
        invocation: Arc<ScriptInvocation<'static>>,
    ) -> (
        usize,
        impl Future<Output = (usize, Result<T, LockError>)> + Send + 'static,
    )
    where
        T: FromRedisValue + Send + 'static,
    {
        let inner = self.clone();
        let request = async move {
            let result = match inner.instance(i, timeout).await {
                Ok(backend) => backend.run_script::<T>(what, &invocation).await,
                Err(e) => Err(e),
            };
            (i, result)
        };
        (i, request)
    }

    /// Round 1 of an acquisition on instance `i`: the grant script; or, with fencing off,
    /// a plain `SET NX PX` first — one command, no script — and the light script only when
    /// it is refused, to re-grant to the same owner or report the holder's remaining TTL.
    fn grant(
        self: &Arc<Self>,
        i: usize,
        timeout: Duration,
        request: Arc<GrantRequest>,
    ) -> (
        usize,
        impl Future<Output = (usize, Result<Acquired, LockError>)> + Send + 'static,
    ) {
        let inner = self.clone();
        let answer = async move {
            let result = async {
                let backend = inner.instance(i, timeout).await?;
                let script = match &*request {
                    GrantRequest::Fenced(script) => script,
                    GrantRequest::Unfenced { set, .. } => {
                        let reply: Value = backend.run_command("acquire", set).await?;
                        if reply != Value::Nil {
                            return Ok(Acquired::Granted(FencingToken(0)));
                        }
                        request.fallback()
                    }
                };
                let reply: Vec<Value> = backend.run_script("acquire", script).await?;
                parse_acquire(&reply)
            }
            .await;
            (i, result)
        };
        (i, answer)
    }

    /// Sends the owner-checked release to the instances `on` picks (one nonce for all, so
    /// waiters count its announcements) and collects answers until `enough` (given the
    /// answers so far and the number still pending) says so; the rest finish in the
    /// background. A release queued behind a grant on the same connection runs after it, so
    /// a grant that arrives late is still undone.
    async fn release_on(
        self: &Arc<Self>,
        names: &support::Names,
        owner_hex: &str,
        nonce: &str,
        timeout: Duration,
        on: impl Fn(usize) -> bool,
        enough: impl Fn(&[(usize, Result<i64, LockError>)], usize) -> bool,
    ) -> Vec<(usize, Result<i64, LockError>)> {
        let mut inv = support::RELEASE.key(&names.lock);
        inv.arg(owner_hex).arg(nonce);
        let inv = Arc::new(inv);
        let n = self.instances.len();
        let mut round = Round::new(
            "release",
            timeout,
            n,
            (0..n)
                .filter(|i| on(*i))
                .map(|i| self.op(i, timeout, "release", inv.clone())),
        );
        let mut results = Vec::with_capacity(n);
        while !enough(&results, round.len()) {
            let Some(answer) = round.next().await else {
                break;
            };
            results.push(answer);
        }
        round.detach();
        results
    }

    /// Undoes a failed attempt: releases where it was granted, waiting for those answers,
    /// and where it went unanswered, in the background (a grant sent but not yet answered
    /// runs before the release queued behind it on the same connection). An instance that
    /// answered "held by another" granted nothing and is left alone: under contention a
    /// failed attempt costs no release round.
    async fn abandon(
        self: &Arc<Self>,
        names: &support::Names,
        owner_hex: &str,
        timeout: Duration,
        answered: &[bool],
        granted: &[(usize, FencingToken)],
    ) {
        let granted_on = |i: usize| granted.iter().any(|(g, _)| *g == i);
        if granted.is_empty() && answered.iter().all(|a| *a) {
            return;
        }
        self.release_on(
            names,
            owner_hex,
            &self.nonce(),
            timeout,
            |i| granted_on(i) || !answered[i],
            |results, _| results.iter().filter(|(i, _)| granted_on(*i)).count() >= granted.len(),
        )
        .await;
    }

    /// A short random back-off after a split vote or a grant that came too late, so that
    /// contenders do not collide again at once.
    fn retry_soon(&self, attempt: Duration) -> AcquireOutcome {
        let backoff =
            Duration::from_millis(1) + lockcore::jitter(attempt * 2 + Duration::from_millis(2));
        AcquireOutcome::Held(
            Contention::new(Some(backoff)).with_hint(WaitHint::retry_after(backoff)),
        )
    }

    async fn try_acquire(
        self: &Arc<Self>,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let ttl_ms = support::ttl_millis(ttl)?;
        let applied = Duration::from_millis(ttl_ms);
        let timeout = self.timeout_for(applied);
        let names = support::names(&self.prefix, key);
        let owner_hex = owner.token().to_hex();
        let n = self.instances.len();
        let q = self.quorum;
        let started = Instant::now();
        let valid_until = started + applied.saturating_sub(clock_drift(applied));

        // Round 1: the grant on every instance at once — the script with the fence bump
        // when fencing is on, else a plain `SET NX PX` with the light script (no fence key,
        // no `TIME`) as its fallback.
        let request = Arc::new(if self.fencing {
            let mut inv = support::ACQUIRE.key(&names.lock);
            inv.key(names.fence())
                .arg(&owner_hex)
                .arg(ttl_ms)
                .arg(owner.label())
                .arg(support::fence_ttl_millis());
            if !self.time_floor {
                inv.arg("nofloor");
            }
            GrantRequest::Fenced(inv)
        } else {
            // The value the scripts write: owner, mark, token 0, label.
            let label = owner.label();
            let mut value = String::with_capacity(owner_hex.len() + 3 + label.len());
            value.push_str(&owner_hex);
            value.push_str(" 0 ");
            value.push_str(label);
            let mut set = driver_redis::redis::cmd("SET");
            set.arg(&names.lock)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms);
            GrantRequest::Unfenced {
                set,
                lock: names.lock.clone(),
                owner: owner.clone(),
                ttl_ms,
                fallback: OnceLock::new(),
            }
        });
        let mut round = Round::new(
            "acquire",
            timeout,
            n,
            (0..n).map(|i| self.grant(i, timeout, request.clone())),
        );
        let mut granted: Vec<(usize, FencingToken)> = Vec::with_capacity(n);
        let mut held: Vec<Option<Duration>> = Vec::new();
        let mut answered = vec![false; n];
        let mut failures = Failures::default();
        while let Some((i, r)) = round.next().await {
            match r {
                Ok(Acquired::Granted(t)) => {
                    answered[i] = true;
                    granted.push((i, t));
                }
                Ok(Acquired::Held(pttl)) => {
                    answered[i] = true;
                    held.push(pttl);
                }
                Err(e) => {
                    tracing::debug!(instance = %self.instances[i].label, error = %lockcore::ErrorChain(&e), "redlock acquire failed on an instance");
                    failures.add(&self.instances[i].label, e);
                }
            }
            if decided(granted.len(), granted.len() + held.len(), round.len(), q) {
                break;
            }
        }

        if granted.len() < q {
            // Released everywhere, stragglers included. Their requests are dropped, not left
            // to finish: whatever of them was sent queues before the release on the same
            // connection, and nothing is sent after it (an unfenced grant's fallback script
            // or a retry on a broken connection would otherwise land after the release and
            // stay until its TTL).
            drop(round);
            self.abandon(&names, &owner_hex, timeout, &answered, &granted)
                .await;
            let got = granted.len() + held.len();
            if got < q {
                return Err(self.too_few(got, failures));
            }
            if held.len() > n - q {
                // Another owner (or several) keeps a majority from us until enough of its
                // holds expire or are released.
                let remaining = time_until_at_most(held, n - q);
                return Ok(AcquireOutcome::Held(Contention::new(remaining)));
            }
            return Ok(self.retry_soon(started.elapsed()));
        }

        let token = granted
            .iter()
            .map(|(_, t)| *t)
            .max()
            .ok_or_else(|| support::unexpected("no grants"))?;
        if self.fencing {
            // Round 2: T = max over the grants, written back to every granter, so that any
            // later majority shares an instance whose fence is at least T.
            let write_back = Arc::new(write_back(&names, &owner_hex, token));
            let mut round2 = Round::new(
                "fence write-back",
                timeout,
                n,
                granted
                    .iter()
                    .map(|(i, _)| self.op(*i, timeout, "fence write-back", write_back.clone())),
            );
            let (mut acks, mut answers) = (0, 0);
            let mut failures = Failures::default();
            while let Some((i, r)) = round2.next().await {
                match r as Result<i64, LockError> {
                    Ok(1) => {
                        acks += 1;
                        answers += 1;
                    }
                    Ok(_) => answers += 1,
                    Err(e) => {
                        tracing::debug!(instance = %self.instances[i].label, error = %lockcore::ErrorChain(&e), "redlock fence write-back failed on an instance");
                        failures.add(&self.instances[i].label, e);
                    }
                }
                if acks >= q || acks + round2.len() < q {
                    break;
                }
            }
            round2.detach();
            if acks < q {
                drop(round);
                self.abandon(&names, &owner_hex, timeout, &answered, &granted)
                    .await;
                if answers < q {
                    return Err(self.too_few(answers, failures));
                }
                // The lock vanished from instances between the rounds (expired or broken):
                // start over.
                return Ok(self.retry_soon(started.elapsed()));
            }
        }
        if Instant::now() >= valid_until {
            drop(round);
            self.abandon(&names, &owner_hex, timeout, &answered, &granted)
                .await;
            tracing::debug!(key = %key, elapsed = ?started.elapsed(), "redlock grant came too late to be valid");
            return Ok(self.retry_soon(started.elapsed()));
        }
        if self.fencing && !round.is_empty() {
            // Instances that grant after the majority did get T written back too, so that
            // every copy of the lock carries the token the holder has.
            let inner = self.clone();
            let write_back = Arc::new(write_back(&names, &owner_hex, token));
            let mut late = round.into_pending();
            tokio::spawn(async move {
                while let Some((i, r)) = late.next().await {
                    if matches!(r, Ok(Acquired::Granted(_))) {
                        let _ = inner
                            .op::<i64>(i, timeout, "fence write-back", write_back.clone())
                            .1
                            .await;
                    }
                }
            });
        }
        // Without fencing, the requests still unanswered are dropped: each was either sent
        // (its grant is ours, undone by our release or its TTL) or never will be.
        Ok(AcquireOutcome::Acquired(
            Grant::new(token, applied).with_valid_until(valid_until),
        ))
    }

    /// Every instance's view of `key` by `script` (read by `parse`), stopping once `enough`
    /// says the rest cannot change the answer. With `marks` (the script marks the copies it
    /// finds), the requests not awaited finish in the background; otherwise they are
    /// dropped.
    async fn survey<T, S>(
        self: &Arc<Self>,
        key: &LockKey,
        (what, script, marks): (&'static str, &'static Script, bool),
        parse: impl Fn(T) -> Result<S, LockError>,
        enough: impl Fn(&[S], usize) -> bool,
    ) -> (Vec<S>, Failures)
    where
        T: FromRedisValue + Send + 'static,
    {
        let names = support::names(&self.prefix, key);
        let timeout = self.untimed();
        let inv = Arc::new(script.key(&names.lock));
        let n = self.instances.len();
        let mut pending = Round::new(
            what,
            timeout,
            n,
            (0..n).map(|i| self.op(i, timeout, what, inv.clone())),
        );
        let mut seen = Vec::with_capacity(self.instances.len());
        let mut failures = Failures::default();
        while let Some((i, r)) = pending.next().await {
            match r.and_then(&parse) {
                Ok(s) => seen.push(s),
                Err(e) => {
                    tracing::debug!(instance = %self.instances[i].label, error = %lockcore::ErrorChain(&e), "redlock {what} failed on an instance");
                    failures.add(&self.instances[i].label, e);
                }
            }
            if enough(&seen, pending.len()) {
                break;
            }
        }
        if marks {
            // The rest mark their copies too, in the background: the more of the holder's
            // copies are marked, the likelier its release reaches a majority of
            // announcements (see `release_filter`).
            pending.detach();
        }
        // Reads only otherwise: the unanswered ones can simply be dropped.
        (seen, failures)
    }
}

impl RedlockBackendBuilder {
    /// The prefix of every Redis key and channel (default `distlock:`), as in driver-redis.
    /// Must not contain `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The per-instance timeout of every request (default: derived from each lock's TTL by
    /// [`default_instance_timeout`], and [`DEFAULT_UNTIMED_INSTANCE_TIMEOUT`] for requests
    /// without a TTL). Keep it far below the TTLs you use: an acquisition spends up to one
    /// timeout per round of its validity.
    pub fn instance_timeout(mut self, timeout: Duration) -> Self {
        self.instance_timeout = Some(timeout);
        self
    }

    /// The bound on connecting to one instance (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Whether acquisitions hand out fencing tokens (default `true`). Without fencing an
    /// acquisition is one round fewer and its grant script is the plain owner-checked
    /// `SET NX PX` (no fence key, no `TIME` read): every token is then 0, the same for
    /// every holder, so a [`FencedResource`](lockcore::FencedResource) rejects nothing —
    /// switch it off only when nothing uses the tokens (see `docs/redlock.md`).
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }

    /// For `rediss://` instances: trust this CA certificate (PEM) instead of the
    /// platform's root certificates.
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls
            .get_or_insert(TlsFiles {
                root: None,
                client: None,
            })
            .root = Some(pem.into());
        self
    }

    /// For `rediss://` instances: authenticate with this client certificate and key (PEM).
    pub fn tls_client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls
            .get_or_insert(TlsFiles {
                root: None,
                client: None,
            })
            .client = Some((certificate_pem.into(), key_pem.into()));
        self
    }

    /// Test-only: bump fences without the `TIME` floor, so a test can prove that the
    /// write-back alone keeps tokens rising. Never use it in production.
    #[doc(hidden)]
    pub fn time_floor(mut self, floor: bool) -> Self {
        self.time_floor = floor;
        self
    }

    /// Connects to every instance in parallel.
    ///
    /// Instances that cannot be reached now are connected later, at their next use; the
    /// build fails only when fewer than a majority can be reached.
    ///
    /// # Errors
    ///
    /// * [`LockError::Config`] for no instances, a malformed instance URL, a bad prefix or
    ///   a zero timeout;
    /// * [`LockError::Backend`] when an instance refuses the credentials;
    /// * [`LockError::QuorumNotReached`] when fewer than a majority of the instances can be
    ///   reached.
    pub async fn build(self) -> Result<Arc<RedlockBackend>, LockError> {
        if self.urls.is_empty() {
            return Err(LockError::config("redlock needs at least one instance"));
        }
        support::check_prefix(&self.prefix)?;
        if self.connect_timeout.is_zero() || self.instance_timeout.is_some_and(|t| t.is_zero()) {
            return Err(LockError::config("redlock timeouts must be above zero"));
        }
        let quorum = self.urls.len() / 2 + 1;
        let urls = self.urls.into_iter().collect::<Result<Vec<_>, _>>()?;
        let nonce_base = getrandom::u64()
            .map_err(|e| LockError::backend(NAME, format!("no random numbers: {e}")))?;
        let notifier = Arc::new(ReleaseNotifier::new());
        let announcements = Announcements::new(quorum, notifier.clone());
        let inner = Arc::new(Inner {
            instances: urls
                .into_iter()
                .map(|url| Instance {
                    label: label(&url),
                    url,
                    backend: OnceCell::new(),
                })
                .collect(),
            quorum,
            prefix: self.prefix,
            fencing: self.fencing,
            time_floor: self.time_floor,
            instance_timeout: self.instance_timeout,
            connect_timeout: self.connect_timeout,
            tls: self.tls,
            notifier,
            filter: release_filter(announcements.clone()),
            announcements,
            nonce_base,
            nonces: AtomicU64::new(0),
        });
        let connects = (0..inner.instances.len()).map(|i| {
            let inner = inner.clone();
            async move {
                let slot = &inner.instances[i];
                let r = slot
                    .backend
                    .get_or_try_init(|| inner.redis_builder(&slot.url).build())
                    .await
                    .map(|_| ());
                (i, r)
            }
        });
        let mut connected = 0;
        let mut failures = Failures::default();
        for (i, r) in futures_util::future::join_all(connects).await {
            match r {
                Ok(()) => connected += 1,
                Err(e @ (LockError::Config { .. } | LockError::Backend { .. })) => return Err(e),
                Err(e) => {
                    tracing::warn!(instance = %inner.instances[i].label, error = %lockcore::ErrorChain(&e), "redlock instance unreachable; will connect at its next use");
                    failures.add(&inner.instances[i].label, e);
                }
            }
        }
        if connected < quorum {
            return Err(inner.too_few(connected, failures));
        }
        Ok(Arc::new(RedlockBackend { inner }))
    }
}

#[async_trait]
impl LockBackend for RedlockBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        if self.fencing() {
            CAPABILITIES
        } else {
            crate::UNFENCED_CAPABILITIES
        }
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        self.inner.try_acquire(key, owner, ttl).await
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.release_counted(key, owner).await.map(|(o, _)| o)
    }

    async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        self.extend_counted(key, owner, ttl).await.map(|(o, _)| o)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let inner = &self.inner;
        let (q, n) = (inner.quorum, inner.instances.len());
        let largest_group = |seen: &[Seen]| -> usize {
            let mut groups: HashMap<&str, usize> = HashMap::new();
            for (owner, ..) in seen.iter().flatten() {
                *groups.entry(owner.as_str()).or_default() += 1;
            }
            groups.into_values().max().unwrap_or(0)
        };
        // A majority agreeing on owner *and* token settles it. Agreeing on the owner alone
        // does not: an instance that granted after the majority keeps its own token until
        // the holder's write-back of T reaches it, so two answers of one owner can differ.
        let agreeing = |seen: &[Seen]| -> usize {
            let mut copies: HashMap<(&str, FencingToken), usize> = HashMap::new();
            for (owner, token, ..) in seen.iter().flatten() {
                *copies.entry((owner.as_str(), *token)).or_default() += 1;
            }
            copies.into_values().max().unwrap_or(0)
        };
        let (seen, failures) = inner
            .survey(
                key,
                ("inspect", &support::INSPECT, false),
                |reply: Vec<Value>| parse_inspect(&reply),
                |seen, pending| {
                    let largest = largest_group(seen);
                    agreeing(seen) >= q || (largest + pending < q && seen.len() >= q)
                },
            )
            .await;
        let mut groups: HashMap<&str, Vec<&(String, FencingToken, String, Option<Duration>)>> =
            HashMap::new();
        for s in seen.iter().flatten() {
            groups.entry(s.0.as_str()).or_default().push(s);
        }
        if let Some(group) = groups.into_values().find(|g| g.len() >= q) {
            // The token a majority of copies carry (the holder's T once its write-back
            // landed); failing that, the commonest.
            let tokens: Vec<FencingToken> = group.iter().map(|s| s.1).collect();
            let token =
                common_token(&tokens).ok_or_else(|| support::unexpected("inspect tokens"))?;
            let label = group
                .iter()
                .find(|s| s.1 == token)
                .map(|s| s.2.clone())
                .unwrap_or_default();
            // Held while a majority holds it: until all but q−1 of its copies expired.
            let remaining = time_until_at_most(group.iter().map(|s| s.3).collect(), q - 1);
            return Ok(Some(LockInfo::new(label, token, remaining)));
        }
        // "Free" only when no majority could hold it even if every instance that did not
        // answer held it; otherwise the answer is unknown, not "free".
        let unanswered = n - seen.len();
        if seen.len() < q || largest_group(&seen) + unanswered >= q {
            return Err(inner.too_few(seen.len(), failures));
        }
        Ok(None)
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let inner = &self.inner;
        if let Some(backoff) = hint.retry_delay() {
            // A split vote or a late grant: back off briefly, then try again. LockClient
            // sleeps such a pause itself; a direct caller (lockbench's hand-off loop) lands
            // here.
            tokio::time::sleep(backoff.min(max_wait)).await;
            return Ok(());
        }
        let (q, n) = (inner.quorum, inner.instances.len());
        // In-process interest first, then the servers' subscriptions, then the re-check:
        // a release at any point after the failed attempt wakes us.
        let subscription = inner.notifier.subscribe(key);
        let timeout = inner.untimed();
        let registrations = futures_util::future::join_all((0..n).map(|i| async move {
            let backend = inner.instance(i, timeout).await?;
            match tokio::time::timeout(timeout, backend.watch_releases(key)).await {
                Ok(r) => r,
                Err(_) => Err(support::timed_out("SUBSCRIBE", timeout)),
            }
        }))
        .await;
        let listening = registrations.iter().filter(|r| r.is_ok()).count();
        // The re-check marks every copy it finds held, so that its release publishes: more
        // than n − q copies when the lock is out of reach, at least one of them the
        // majority holder's (see `release_filter`).
        let (seen, failures) = inner
            .survey(
                key,
                ("watch", &support::WATCH, true),
                |pttl: i64| Ok((pttl != -2).then(|| support::remaining(pttl))),
                |seen, pending| {
                    let free = seen.iter().filter(|s| s.is_none()).count();
                    let held = seen.len() - free;
                    free >= q || held > n - q || pending == 0
                },
            )
            .await;
        if listening == 0 && seen.is_empty() {
            return Err(inner.too_few(0, failures));
        }
        let held: Vec<Option<Duration>> = seen.into_iter().flatten().collect();
        if held.len() <= n - q {
            return Ok(());
        }
        let wait = time_until_at_most(held, n - q).map_or(max_wait, |d| d.min(max_wait));
        let _ = tokio::time::timeout(wait, subscription.released()).await;
        drop(registrations);
        Ok(())
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        let inner = &self.inner;
        let names = support::names(&inner.prefix, key);
        let mut inv = support::FORCE_RELEASE.key(&names.lock);
        inv.arg(names.channel()).arg(inner.nonce());
        let inv = Arc::new(inv);
        let (n, timeout) = (inner.instances.len(), inner.untimed());
        let mut round = Round::new(
            "force release",
            timeout,
            n,
            (0..n).map(|i| inner.op::<i64>(i, timeout, "force release", inv.clone())),
        );
        let mut results = Vec::with_capacity(n);
        while let Some(answer) = round.next().await {
            results.push(answer);
        }
        let (mut answered, mut deleted) = (0, 0);
        let mut failures = Failures::default();
        for (i, r) in results {
            match r {
                Ok(d) => {
                    answered += 1;
                    if d == 1i64 {
                        deleted += 1;
                    }
                }
                Err(e) => {
                    failures.add(&inner.instances[i].label, e);
                }
            }
        }
        if answered < inner.quorum {
            return Err(inner.too_few(answered, failures));
        }
        Ok(if deleted > 0 {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    async fn shutdown(&self) {
        for instance in &self.inner.instances {
            if let Some(b) = instance.backend.get() {
                b.shutdown().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_timeouts_stay_far_below_the_ttl() {
        for ms in [1u64, 10, 30, 100, 400, 1000, 30_000, 3_600_000] {
            let ttl = Duration::from_millis(ms);
            let t = default_instance_timeout(ttl);
            assert!(
                t <= ttl / 3 || t == Duration::from_millis(1),
                "{ttl:?}: {t:?}"
            );
            assert!(t <= Duration::from_secs(1));
        }
    }

    #[test]
    fn waiting_time_counts_down_to_a_free_majority() {
        let ms = |v: u64| Some(Duration::from_millis(v));
        // 5 instances, quorum 3: free once at most 2 hold it.
        assert_eq!(time_until_at_most(vec![ms(10), ms(30), ms(20)], 2), ms(10));
        assert_eq!(
            time_until_at_most(vec![ms(10), ms(30), ms(20), ms(5)], 2),
            ms(10)
        );
        assert_eq!(time_until_at_most(vec![None, ms(30), ms(20)], 1), ms(30));
        assert_eq!(time_until_at_most(vec![None, ms(30), ms(20)], 0), None);
    }

    #[test]
    fn decisions() {
        // 5 instances, quorum 3.
        assert!(decided(3, 3, 2, 3));
        assert!(!decided(2, 2, 3, 3));
        // Cannot win, and three answered: contention, decided.
        assert!(decided(0, 3, 2, 3));
        // Cannot win, but too few answered yet to say whether it is contention.
        assert!(!decided(0, 1, 2, 3));
        assert!(decided(0, 1, 0, 3));
    }

    #[test]
    fn hex_digits() {
        for (v, width) in [
            (0, 1),
            (0, 16),
            (9, 1),
            (0xabc, 1),
            (0xabc, 16),
            (u64::MAX, 1),
            (u64::MAX, 16),
        ] {
            let mut s = String::new();
            push_hex(&mut s, v, width);
            assert_eq!(s, format!("{v:0width$x}"), "{v} {width}");
        }
    }

    #[tokio::test]
    async fn one_wake_per_release_at_the_quorum_th_announcement_or_soon_after_the_first() {
        let notifier = Arc::new(ReleaseNotifier::new());
        let announcements = Announcements::new(3, notifier.clone());
        let f = release_filter(announcements.clone());
        let k = LockKey::new("k").unwrap();
        let wakes: Vec<bool> = (0..5).map(|_| f(&k, b"abc")).collect();
        assert_eq!(wakes, [false, false, true, false, false]);
        assert!(
            f(&k, b"1") && f(&k, b"1"),
            "driver-redis's messages carry no nonce"
        );
        // A release announced by fewer than a majority still wakes one waiter, a little
        // later, through the notifier; and only one.
        let first = notifier.subscribe(&k);
        let second = notifier.subscribe(&k);
        assert!(!f(&k, b"partial"));
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), first.released())
            .await
            .expect("the partial announcement woke nobody");
        assert!(started.elapsed() >= PARTIAL_ANNOUNCEMENT_WAKE);
        assert!(
            !f(&k, b"partial") && !f(&k, b"partial"),
            "woken once per release"
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(50), second.released())
                .await
                .is_err()
        );
        // A release of this backend that no instance announced wakes one of its waiters at
        // once, and counts as that release's wake-up: a late announcement wakes no second.
        let local = notifier.subscribe(&k);
        announcements.wake_once(&k, b"local");
        tokio::time::timeout(Duration::from_secs(5), local.released())
            .await
            .expect("the unannounced release woke nobody");
        let third = notifier.subscribe(&k);
        assert!(!f(&k, b"local") && !f(&k, b"local") && !f(&k, b"local"));
        assert!(
            tokio::time::timeout(Duration::from_millis(50), third.released())
                .await
                .is_err()
        );
    }

    #[test]
    fn common_token_prefers_the_written_back_one() {
        let t = |v| FencingToken(v);
        assert_eq!(common_token(&[t(5), t(7), t(5)]), Some(t(5)));
        assert_eq!(common_token(&[t(5), t(7)]), Some(t(7)));
        assert_eq!(common_token(&[]), None);
    }

    #[test]
    fn labels_hide_credentials() {
        let l = |u: &str| label(&StoreUrl::parse(u).unwrap());
        assert_eq!(l("redis://u:s3cret@h:1/2"), "h:1");
        assert_eq!(l("rediss://h:1"), "h:1");
        assert_eq!(l("redis://h/?password=s3cret"), "h:6379");
        for urls in [
            &["redis://u:s3cret@h:1/"][..],
            &[
                "redis://h:1/?password=s3cret",
                "redis://u:s3cret@h:notaport",
            ],
        ] {
            let shown = format!("{:?}", RedlockBackend::builder(urls.iter().copied()));
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        let shown = format!(
            "{:?}",
            RedlockBackend::builder_from_url("redlock://u:s3cret@h1,h2?password=x").err()
        );
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
