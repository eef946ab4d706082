//! [`RedisBackend`]: one Redis server, its command connection and its shared pub/sub
//! connection, and how every request is bounded and sent again after a broken connection.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{LockError, LockKey};
use redis::{FromRedisValue, RedisError, ScriptInvocation};

use crate::connection::Connection;
use crate::error;
use crate::lua::Lua;
use crate::names::{self, Names};
use crate::waiters::{Registration, Waiters};

/// A lock store on one Redis server (or a Redis-compatible one such as Valkey).
///
/// Each operation is one Lua script, atomic in the server: acquire (`SET`-with-`PX`
/// semantics plus the fencing counter), owner-checked release (which `PUBLISH`es on the
/// lock's channel), owner-checked extend, inspect and force-release. Commands share one
/// multiplexed connection that reconnects by itself; waiters share one pub/sub connection,
/// opened at the first wait, so a backend holds at most two connections to the server
/// however many tasks use it.
///
/// Fencing tokens are *clock-assisted*: each acquisition sets the fence key beside the lock
/// to `max(last + 1, now_us)` from the server's `TIME`, so tokens keep rising even after
/// the fence key expired or a restart lost it, as long as the server's clock does not step
/// back. See `docs/redis-safety.md` for what persistence, eviction and failover do to the
/// guarantees.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), lockcore::LockError> {
/// use std::time::Duration;
/// use lockcore::LockClient;
///
/// let backend = driver_redis::RedisBackend::builder("redis://127.0.0.1:6379/")
///     .prefix("billing:")
///     .response_timeout(Duration::from_millis(500))
///     .build()
///     .await?;
/// let locks = LockClient::new(backend);
/// let guard = locks.lock("invoice:42").ttl(Duration::from_secs(30)).acquire().await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct RedisBackend {
    /// The URL, redacted: all that `Debug` shows of the connection.
    pub(crate) url: String,
    pub(crate) conn: Connection,
    pub(crate) prefix: String,
    pub(crate) waiters: Arc<Waiters>,
    /// The bound on one operation: connecting plus answering (a script sent again after
    /// `NOSCRIPT` included).
    pub(crate) op_timeout: Duration,
    /// Whether grants take fencing tokens (see
    /// [`RedisBackendBuilder::fencing`](crate::RedisBackendBuilder::fencing)).
    pub(crate) fencing: bool,
}

/// One line, without secrets: the connection manager's own `Debug` shows its whole state.
impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &format_args!("{}", self.url))
            .field("prefix", &self.prefix)
            .field("fencing", &self.fencing)
            .finish()
    }
}

impl RedisBackend {
    /// The key prefix this backend stores locks under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn names(&self, key: &LockKey) -> Names {
        names::names(&self.prefix, key)
    }

    /// `script` as this backend runs it: on a Redis Cluster, its variant that announces
    /// releases on sharded channels.
    pub(crate) fn lua<'s>(&self, script: &'s Lua) -> &'s Lua {
        script.for_cluster(self.conn.is_cluster())
    }

    /// Runs one request within the operation bound, mapping its errors.
    ///
    /// A request that fails at once on a broken connection is sent once more: the first
    /// failure makes the connection manager reconnect, and the retry waits for that new
    /// connection (after a restart, the first command would otherwise always fail with
    /// the stale error of the dead connection). Every operation is idempotent per owner, so
    /// a retry can only repeat its effect; the one visible difference is a release whose
    /// first attempt was applied but whose answer was lost, which reports `NotHeld`
    /// ("already released"). Timeouts are not retried. Ours, not lockcore's retry policy:
    /// the redis crate's `ConnectionManager` reconnects but never sends again, and lockcore
    /// retries only waiting requests, so without it a `try_acquire` after a restart fails
    /// (`tests/redis.rs`: `restart_empty_…` and `refused_attempts_leave_nothing_for_shutdown`).
    async fn bounded<T, F, Fut>(&self, what: &str, request: F) -> Result<T, LockError>
    where
        F: FnMut(Connection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        self.bounded_for(what, Some(self.op_timeout), request).await
    }

    /// Runs one of the [`scripts`](crate::__redlock::scripts) within the operation bound, as
    /// [`bounded`](Self::bounded).
    pub(crate) async fn bounded_script<T: FromRedisValue>(
        &self,
        what: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        self.bounded(what, |mut conn| async move {
            invocation.invoke_async(&mut conn).await
        })
        .await
    }

    /// Runs `evalsha`, an `EVALSHA` of `script` built by hand (all of a request's keys and
    /// arguments written into one buffer, where a `ScriptInvocation` allocates each),
    /// within the operation bound as [`bounded`](Self::bounded), loading the script and
    /// sending it again on a `NOSCRIPT` answer (after a restart or `SCRIPT FLUSH`).
    pub(crate) async fn bounded_evalsha<T: FromRedisValue>(
        &self,
        what: &str,
        script: &Lua,
        evalsha: &redis::Cmd,
    ) -> Result<T, LockError> {
        self.bounded(what, |mut conn| async move {
            match evalsha.query_async(&mut conn).await {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    let _: String = script.load_cmd().query_async(&mut conn).await?;
                    evalsha.query_async(&mut conn).await
                }
                other => other,
            }
        })
        .await
    }

    /// Runs one plain command within the operation bound, as [`bounded`](Self::bounded).
    pub(crate) async fn bounded_command<T: FromRedisValue>(
        &self,
        what: &str,
        command: &redis::Cmd,
    ) -> Result<T, LockError> {
        self.bounded(what, |mut conn| async move {
            command.query_async(&mut conn).await
        })
        .await
    }

    /// [`bounded`](Self::bounded) with a bound of the caller's (`None`: only the
    /// connection's response timeout, for a caller that bounds a whole round of requests
    /// with one timer).
    async fn bounded_for<T, F, Fut>(
        &self,
        what: &str,
        timeout: Option<Duration>,
        mut request: F,
    ) -> Result<T, LockError>
    where
        F: FnMut(Connection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let attempts = async {
            match request(self.conn.clone()).await {
                Err(e) if error::is_unavailable(&e) && !e.is_timeout() => {
                    tracing::debug!(error = %lockcore::ErrorChain(&e), "redis {what} failed on a broken connection; sending it once more");
                    request(self.conn.clone()).await
                }
                other => other,
            }
        };
        let Some(timeout) = timeout else {
            return attempts.await.map_err(error::map);
        };
        match tokio::time::timeout(timeout, attempts).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(error::map(e)),
            Err(_) => Err(error::timed_out(what, timeout)),
        }
    }

    /// Runs one of the [`scripts`](crate::__redlock::scripts), sent once more if it fails at
    /// once on a broken connection (as every operation of this backend), bounded only by
    /// the connection's response timeout. For driver-redlock, which runs the scripts on each
    /// of its instances in rounds and bounds each round with one timer; not a stable API.
    ///
    /// # Errors
    ///
    /// [`LockError::Unavailable`] when the server does not answer within the response
    /// timeout or cannot be reached, [`LockError::Backend`] for an error answer.
    #[doc(hidden)]
    pub async fn run_script<T: FromRedisValue>(
        &self,
        what: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        self.bounded_for(what, None, |mut conn| async move {
            invocation.invoke_async(&mut conn).await
        })
        .await
    }

    /// Runs one plain command like [`run_script`](Self::run_script). For driver-redlock,
    /// whose unfenced grant is a plain `SET NX PX`; not a stable API.
    ///
    /// # Errors
    ///
    /// [`LockError::Unavailable`] when the server does not answer within the response
    /// timeout or cannot be reached, [`LockError::Backend`] for an error answer.
    #[doc(hidden)]
    pub async fn run_command<T: FromRedisValue>(
        &self,
        what: &str,
        command: &redis::Cmd,
    ) -> Result<T, LockError> {
        self.bounded_for(what, None, |mut conn| async move {
            command.query_async(&mut conn).await
        })
        .await
    }

    /// Subscribes this backend's shared pub/sub connection to `key`'s release channel while
    /// the returned registration lives. Release messages go to the notifier given to
    /// [`RedisBackendBuilder::shared_release_notifier`](crate::RedisBackendBuilder::shared_release_notifier).
    /// For driver-redlock; not a stable API.
    ///
    /// # Errors
    ///
    /// [`LockError::Unavailable`] when the pub/sub connection cannot be (re)established or
    /// the server does not confirm in time.
    #[doc(hidden)]
    pub async fn watch_releases(&self, key: &LockKey) -> Result<Registration, LockError> {
        self.waiters.register(key, &self.names(key).channel()).await
    }
}
