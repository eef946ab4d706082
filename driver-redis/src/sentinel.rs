//! [`SentinelConnection`]: commands to the master that Redis Sentinel names, and the master
//! found again after a failover.
//!
//! The sentinels are asked for the master's address when the backend connects, and again
//! after any request to the master failed in a way a failover explains: the connection
//! broke or was refused, the request timed out, or the server answered `READONLY` (a
//! demoted master, now a replica) or `MASTERDOWN`. Each such failure is
//! [`LockError::Unavailable`](lockcore::LockError::Unavailable), retryable; the request
//! after it goes to whichever master the sentinels name then. When that is a new address,
//! the waiters' pub/sub connection is moved there too, and every waiter looks again.
//!
//! A failover does not always make the old master fail: after `SENTINEL FAILOVER`, or a
//! partition that heals, the old master keeps answering as a master until a sentinel turns
//! it into a replica (it looks every 10 s), and whatever it accepted meanwhile is thrown
//! away. So the backend also listens to the sentinels' `+switch-master` announcements and
//! moves to the new master as soon as they name it.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use futures_util::StreamExt;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::SentinelClient;
use redis::{
    Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};

/// How often the switch listener checks that its backend still exists, and waits before
/// listening again after a failure.
const SWITCH_CHECK: Duration = Duration::from_millis(500);

/// The master of a Sentinel-managed set, as the backend's commands reach it. Ours, because
/// the redis crate's `SentinelClient` names the master only when asked for a connection:
/// nothing in it asks again after a failure or follows `+switch-master`.
pub(crate) struct SentinelConnection {
    /// Asks the sentinels (one discovery at a time).
    discovery: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Current>,
    config: ConnectionManagerConfig,
    /// The bound on one discovery (the sentinels' answer and the master's `ROLE`).
    connect_timeout: Duration,
    db: i64,
    /// Called when the sentinels name a new master.
    switched: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

#[derive(Default)]
struct Current {
    /// The master's connection (kept while in doubt: the sentinels may name it again).
    conn: Option<ConnectionManager>,
    /// The master's address when `conn` was made.
    addr: Option<String>,
    /// Whether a failure since put `conn` in doubt.
    doubted: bool,
    /// Bumped at each doubt, so a late failure of an old request doubts nothing new.
    epoch: u64,
}

impl SentinelConnection {
    pub(crate) fn new(
        sentinel: SentinelClient,
        config: ConnectionManagerConfig,
        connect_timeout: Duration,
        db: i64,
    ) -> Self {
        SentinelConnection {
            discovery: tokio::sync::Mutex::new(sentinel),
            current: Mutex::new(Current::default()),
            config,
            connect_timeout,
            db,
            switched: OnceLock::new(),
        }
    }

    fn current(&self) -> MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Listens to the sentinels' `+switch-master` announcements for `name` while this
    /// connection lives, and moves to the new master as soon as one is announced.
    pub(crate) fn follow_switches(self: &Arc<Self>, name: String) {
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(c) = this.upgrade() else { return };
                let listening = c.listen_for_switches().await;
                drop(c);
                match listening {
                    Ok(mut messages) => {
                        // Announcements missed while not listening: look again.
                        if let Some(c) = this.upgrade() {
                            c.doubt();
                        }
                        loop {
                            let message = tokio::select! {
                                m = messages.next() => m,
                                // Notice when the backend is gone, even if no message comes.
                                _ = tokio::time::sleep(SWITCH_CHECK) => {
                                    if this.strong_count() == 0 {
                                        return;
                                    }
                                    continue;
                                }
                            };
                            let Some(message) = message else { break };
                            let payload = message.get_payload::<String>().unwrap_or_default();
                            // "<name> <old ip> <old port> <new ip> <new port>"
                            if payload.split(' ').next() == Some(name.as_str()) {
                                let Some(c) = this.upgrade() else { return };
                                tracing::debug!(%payload, "redis sentinel announced a new master");
                                c.doubt();
                                if let Err(e) = c.connection().await {
                                    tracing::debug!(error = %lockcore::ErrorChain(&e), "redis sentinel: the new master is not reachable yet");
                                }
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %lockcore::ErrorChain(&e), "redis sentinel: cannot listen for master switches");
                    }
                }
                tokio::time::sleep(SWITCH_CHECK).await;
            }
        });
    }

    /// A pub/sub connection to a sentinel that answers, subscribed to `+switch-master`.
    async fn listen_for_switches(
        &self,
    ) -> RedisResult<futures_util::stream::BoxStream<'static, redis::Msg>> {
        let asked = async {
            let client = {
                let mut sentinel = self.discovery.lock().await;
                sentinel.async_get_sentinel_client().await?
            };
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            Ok(pubsub.into_on_message().boxed())
        };
        self.in_time("no sentinel answered in time", asked).await
    }

    /// `asked`'s answer within the connect timeout, or else an I/O error whose message is
    /// `late`.
    async fn in_time<T>(
        &self,
        late: &'static str,
        asked: impl std::future::Future<Output = RedisResult<T>>,
    ) -> RedisResult<T> {
        tokio::time::timeout(self.connect_timeout, asked)
            .await
            .unwrap_or_else(|_| Err(RedisError::from((ErrorKind::Io, late))))
    }

    /// Makes the next request ask the sentinels which master to use.
    fn doubt(&self) {
        let mut current = self.current();
        if !current.doubted {
            current.doubted = true;
            current.epoch += 1;
        }
    }

    /// Calls `hook` whenever the sentinels name a new master (set once).
    pub(crate) fn on_switch(&self, hook: Box<dyn Fn() + Send + Sync>) {
        let _ = self.switched.set(hook);
    }

    /// A client of the master the sentinels name now (checked with `ROLE`).
    pub(crate) async fn master_client(&self) -> RedisResult<redis::Client> {
        let mut sentinel = self.discovery.lock().await;
        self.ask(&mut sentinel).await
    }

    async fn ask(&self, sentinel: &mut SentinelClient) -> RedisResult<redis::Client> {
        let late = "no sentinel named a reachable master in time";
        match self.in_time(late, sentinel.async_get_client()).await {
            // The sentinels name no master that answers as one: it is down and not yet
            // replaced, or being failed over (an unknown name is caught when connecting).
            Err(e) if e.kind() == ErrorKind::MasterNameNotFoundBySentinel => {
                Err(RedisError::from((
                    ErrorKind::Io,
                    "the sentinels name no reachable master (down, or being failed over)",
                )))
            }
            Err(e) if e.kind() == ErrorKind::AuthenticationFailed => Err(RedisError::from((
                ErrorKind::AuthenticationFailed,
                "the master the sentinels named refused the credentials (the URL's user and password)",
                e.to_string(),
            ))),
            found => found,
        }
    }

    /// Whether a sentinel that answers monitors a master named `name`.
    pub(crate) async fn monitors(&self, name: &str) -> RedisResult<bool> {
        let mut sentinel = self.discovery.lock().await;
        let asked = async {
            let client = sentinel.async_get_sentinel_client().await.map_err(|e| {
                if e.kind() == ErrorKind::AuthenticationFailed {
                    RedisError::from((
                        ErrorKind::AuthenticationFailed,
                        "a sentinel refused the credentials (sentinel_user, sentinel_password)",
                        e.to_string(),
                    ))
                } else {
                    RedisError::from((ErrorKind::Io, "no sentinel answered", e.to_string()))
                }
            })?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            let addr: Option<Vec<String>> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(name)
                .query_async(&mut conn)
                .await?;
            Ok(addr.is_some())
        };
        self.in_time("no sentinel answered in time", asked).await
    }

    /// The master's connection, unless in doubt, and the epoch it belongs to.
    fn trusted(&self) -> Option<(u64, ConnectionManager)> {
        let current = self.current();
        match &current.conn {
            Some(conn) if !current.doubted => Some((current.epoch, conn.clone())),
            _ => None,
        }
    }

    /// The master's connection and the epoch it belongs to, asking the sentinels first
    /// if there is none or it is in doubt.
    ///
    /// The asking and connecting run in a task of their own: a request that gives up
    /// waiting (a renewal has a quarter of the TTL) leaves them running, and a later
    /// request finds the connection made. Run inside the request, a discovery slower than
    /// the request's bound (new connections to a sentinel and to the master, each with
    /// its handshake) was dropped with it and started over by the next one, and never
    /// finished.
    async fn connection(self: &Arc<Self>) -> RedisResult<(u64, ConnectionManager)> {
        if let Some(found) = self.trusted() {
            return Ok(found);
        }
        let this = self.clone();
        match tokio::spawn(async move { this.discover().await }).await {
            Ok(found) => found,
            Err(e) => Err(RedisError::from((
                ErrorKind::Io,
                "asking the sentinels for the master stopped",
                e.to_string(),
            ))),
        }
    }

    /// Asks the sentinels which master to use (one discovery at a time) and connects to it:
    /// see [`connection`](Self::connection).
    async fn discover(&self) -> RedisResult<(u64, ConnectionManager)> {
        let mut sentinel = self.discovery.lock().await;
        // Another request may have asked meanwhile.
        if let Some(found) = self.trusted() {
            return Ok(found);
        }
        let client = self.ask(&mut sentinel).await?;
        let addr = client.get_connection_info().addr().to_string();
        let (previous, kept) = {
            let current = self.current();
            let same = current.addr.as_deref() == Some(addr.as_str());
            (current.addr.clone(), current.conn.clone().filter(|_| same))
        };
        let conn = match kept {
            Some(conn) => conn,
            None => {
                let connect = ConnectionManager::new_with_config(client, self.config.clone());
                let late = "connecting to the master the sentinels named timed out";
                self.in_time(late, connect).await?
            }
        };
        let epoch = {
            let mut current = self.current();
            current.conn = Some(conn.clone());
            current.addr = Some(addr.clone());
            current.doubted = false;
            current.epoch
        };
        drop(sentinel);
        if previous.is_some_and(|previous| previous != addr) {
            tracing::info!(master = %addr, "redis sentinel named a new master");
            if let Some(hook) = self.switched.get() {
                hook();
            }
        }
        Ok((epoch, conn))
    }

    /// After `answer` to a request of `epoch`: if a failover explains its failure, or the
    /// answer holds a demoted master's error (`demoted`), the next request asks the
    /// sentinels again. A server's error is an answer, not a failed request: the caller's
    /// conversion turns it into an error later.
    fn judge<T>(&self, epoch: u64, answer: &RedisResult<T>, demoted_in: impl Fn(&T) -> bool) {
        let failover = match answer {
            Err(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || matches!(e.kind(), ErrorKind::Server(kind) if demoted(kind))
            }
            Ok(value) => demoted_in(value),
        };
        if failover {
            self.doubt_epoch(epoch);
        }
    }

    /// Makes the next request ask the sentinels again, unless a request already did since
    /// `epoch`.
    fn doubt_epoch(&self, epoch: u64) {
        if self.current().epoch == epoch {
            self.doubt();
        }
    }

    pub(crate) fn get_db(&self) -> i64 {
        self.db
    }

    pub(crate) fn req_packed_command<'a>(
        self: &'a Arc<Self>,
        cmd: &'a Cmd,
    ) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (epoch, mut conn) = self.connection().await?;
            let answer = conn.req_packed_command(cmd).await;
            self.judge(epoch, &answer, says_demoted);
            answer
        })
    }

    pub(crate) fn req_packed_commands<'a>(
        self: &'a Arc<Self>,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (epoch, mut conn) = self.connection().await?;
            let answer = conn.req_packed_commands(pipeline, offset, count).await;
            self.judge(epoch, &answer, |values| values.iter().any(says_demoted));
            answer
        })
    }
}

/// Whether a server's error says it is no master now: `READONLY` (a demoted master, now a
/// replica) or `MASTERDOWN` (a replica that lost its master).
fn demoted(kind: ServerErrorKind) -> bool {
    matches!(
        kind,
        ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown
    )
}

/// Whether `value` is such an error: the connection hands a server's error back as a
/// value (the script's or command's answer), which only its caller makes an error.
fn says_demoted(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.kind().is_some_and(demoted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(raw: &[u8]) -> Value {
        redis::parse_redis_value(raw).unwrap()
    }

    #[test]
    fn a_demoted_masters_errors_are_recognised_in_answers() {
        assert!(says_demoted(&answer(
            b"-READONLY You can't write against a read only replica. script: 65, on @user_script:216.\r\n"
        )));
        assert!(says_demoted(&answer(
            b"-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n"
        )));
        assert!(!says_demoted(&answer(b"-ERR unknown command\r\n")));
        assert!(!says_demoted(&answer(b"-NOSCRIPT No matching script\r\n")));
        assert!(!says_demoted(&answer(b":1\r\n")));
    }
}
