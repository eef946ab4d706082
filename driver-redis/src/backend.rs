//! [`RedisBackend`]: what it declares, connecting it (its command connection checked, the
//! scripts loaded, its waiters' pub/sub connection ready to open), and its [`LockBackend`]
//! operations, each one Lua script.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::driver::{
    AcquireOutcome, Capabilities, ClaimRequest, ExtendOutcome, Fairness, FencingGuarantee, Grant,
    ReleaseNotifier, Renewal, SetOutcome, WaitHint, STARVING_MARK_TTL,
};
use lockcore::store_url::StoreUrl;
use lockcore::{
    Claim, FencingToken, LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseOutcome,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, ScriptInvocation, Value};

use crate::config::{open, RedisBackendBuilder, Target};
use crate::connection::{within, Commands, Connection};
use crate::error::{self, NAME};
use crate::names::{self, Names};
use crate::sentinel::SentinelConnection;
use crate::store::{self, acquire_outcome, inspected, ttl_millis, Lua};
use crate::wait::{Registration, Source, Waiters};

/// What the redis backend declares: clock-assisted fencing (the fence counter has a floor
/// from the server's `TIME`), release notifications by pub/sub, bounded fairness (a long
/// wait marks the key as its next turn, see
/// [`ClaimRequest::waited`](lockcore::driver::ClaimRequest::waited)), TTLs from 1 ms
/// (Redis counts `PX` in milliseconds) to 24 hours, expiry judged by the server's clock,
/// shared claims: read-write locks and semaphores (see [`CLAIM`](crate::store::CLAIM)).
pub const CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::ClockAssisted)
    .with_notifications(true)
    .with_fairness(Fairness::Bounded)
    .with_claims(true, true)
    .with_batched_renewals(true)
    .with_min_ttl(Duration::from_millis(1))
    .with_max_ttl(store::MAX_TTL);

/// What the redis backend declares with fencing switched off
/// ([`RedisBackendBuilder::fencing`](crate::RedisBackendBuilder::fencing), `?fencing=false`):
/// [`CAPABILITIES`] without fencing tokens (every token is 0), without shared claims and
/// without fairness (the unfenced grant is a plain `SET NX PX`, which does not look at the
/// leases or marks beside the lock).
pub const UNFENCED_CAPABILITIES: Capabilities = CAPABILITIES
    .with_fencing(FencingGuarantee::None)
    .with_fairness(Fairness::None)
    .with_claims(false, false);

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
/// # extern crate lockcore as distlock_core; // the workspace's name for it
/// # async fn demo() -> Result<(), distlock_core::LockError> {
/// use std::time::Duration;
/// use distlock_core::LockClient;
///
/// let backend = distlock_redis::RedisBackend::builder("redis://127.0.0.1:6379/")
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
    url: String,
    pub(crate) commands: Commands,
    pub(crate) prefix: String,
    pub(crate) waiters: Arc<Waiters>,
    /// Whether grants take fencing tokens (see
    /// [`RedisBackendBuilder::fencing`](crate::RedisBackendBuilder::fencing)).
    pub(crate) fencing: bool,
}

impl RedisBackend {
    /// A builder for a backend on the server at `url`: see [`RedisBackendBuilder`] for the
    /// URLs and options it accepts.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        let url: String = url.into();
        RedisBackendBuilder::new(StoreUrl::parse(&url))
    }

    /// [`builder`](Self::builder) for a URL already parsed (e.g. one instance of a
    /// `redlock://` URL).
    pub fn builder_for(url: StoreUrl) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Ok(url))
    }
}

impl RedisBackendBuilder {
    /// Connects and checks the server answers (and accepts the credentials).
    ///
    /// # Errors
    ///
    /// * [`LockError::Config`] for a malformed or unsupported URL or a bad prefix;
    /// * [`LockError::Unavailable`] when the server cannot be reached within the connect
    ///   timeout (refused, unreachable, TLS handshake failed);
    /// * [`LockError::Backend`] when the server refuses the connection (wrong password,
    ///   unknown user, no permission).
    pub async fn build(self) -> Result<Arc<RedisBackend>, LockError> {
        names::check_prefix(&self.prefix)?;
        if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            return Err(LockError::config("redis timeouts must be above zero"));
        }
        let target = self.target?;
        let op_timeout = self.connect_timeout + self.response_timeout;
        let used: Vec<&Lua> = store::all().to_vec();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            // Reconnection is retried by the next command, not in a backoff loop a command
            // would wait behind: an unreachable server must fail calls promptly.
            .set_number_of_retries(0);
        // Every failure to connect names where (the URL's hosts, or its socket's path).
        let place = target.place(6379);
        let opened = async {
            let target = open(&target, self.tls)?;
            if self.connection.is_some() && !matches!(target, Target::Single(_)) {
                return Err(LockError::config(
                    "a connection given to the builder is one server's; a cluster or sentinel URL needs the backend to open its own",
                ));
            }
            Ok(match target {
                Target::Single(client) => {
                    let conn = match self.connection {
                        Some(conn) => conn,
                        None => {
                            let connect =
                                ConnectionManager::new_with_config(client.clone(), config);
                            within("connecting", op_timeout, connect).await?
                        }
                    };
                    let mut conn = Connection::Single(conn);
                    load_scripts(&mut conn, &used, op_timeout).await?;
                    (conn, Source::Single(client))
                }
                Target::Cluster(cluster) => {
                    let client =
                        cluster.client(self.connect_timeout, self.response_timeout, None)?;
                    let connect = async {
                        client.get_async_connection().await.map_err(|e| {
                            // The cluster client reports refused credentials as an I/O failure of
                            // its first connections; only the server's words tell them apart.
                            let text = e.to_string();
                            if text.contains("WRONGPASS") || text.contains("NOAUTH") {
                                redis::RedisError::from((
                                    redis::ErrorKind::AuthenticationFailed,
                                    "the cluster refused the credentials",
                                    text,
                                ))
                            } else {
                                e
                            }
                        })
                    };
                    let mut conn = Connection::Cluster(
                        within("connecting to the cluster", op_timeout, connect).await?,
                    );
                    // Releases are announced with SPUBLISH, which Redis 7 introduced.
                    let mut has_spublish = redis::cmd("COMMAND");
                    has_spublish.arg("INFO").arg("SPUBLISH");
                    let info: Vec<Value> = within(
                        "COMMAND INFO",
                        op_timeout,
                        has_spublish.query_async(&mut conn),
                    )
                    .await?;
                    if !matches!(info.first(), Some(Value::Array(_))) {
                        return Err(LockError::config(
                        "the redis cluster lacks sharded pub/sub (SPUBLISH): redis+cluster:// needs Redis 7 or later",
                    ));
                    }
                    let sharded: Vec<&Lua> =
                        used.iter().map(|script| script.for_cluster(true)).collect();
                    load_scripts(&mut conn, &sharded, op_timeout).await?;
                    (conn, Source::Cluster(cluster))
                }
                Target::Sentinel(sentinel) => {
                    let master = Arc::new(SentinelConnection::new(
                        sentinel.client,
                        config,
                        op_timeout,
                        sentinel.db,
                    ));
                    let monitored = master.monitors(&sentinel.master).await;
                    if !monitored.map_err(error::map)? {
                        return Err(LockError::config(format!(
                            "no sentinel monitors a master named {:?}",
                            sentinel.master
                        )));
                    }
                    let mut conn = Connection::Sentinel(master.clone());
                    load_scripts(&mut conn, &used, op_timeout).await?;
                    master.follow_switches(sentinel.master.clone());
                    (conn, Source::Sentinel(master))
                }
            })
        };
        let (conn, source) = opened.await.map_err(|e| e.at(place))?;
        let waiters = Arc::new(Waiters::new(
            source,
            self.connect_timeout,
            self.response_timeout,
            self.notifier,
        ));
        if let Connection::Sentinel(master) = &conn {
            // A new master: the waiters' subscriptions move there, and every waiter looks
            // again (a release on the old master may not have been announced).
            let waiters = Arc::downgrade(&waiters);
            master.on_switch(Box::new(move || {
                if let Some(waiters) = waiters.upgrade() {
                    waiters.reset();
                }
            }));
        }
        Ok(Arc::new(RedisBackend {
            url: target.redacted().to_owned(),
            commands: Commands { conn, op_timeout },
            prefix: self.prefix,
            waiters,
            fencing: self.fencing,
        }))
    }
}

/// Checks that the server answers (and accepts the credentials: a server that wants a
/// password accepts the connection and refuses the first command, so find out now, not at
/// the first lock) and loads `scripts`, so the first operations are single EVALSHAs (a
/// `NOSCRIPT` costs two more round trips). The loads are sent together: the connection
/// multiplexes them into one round trip; on a cluster, each goes to every node.
async fn load_scripts(
    conn: &mut Connection,
    scripts: &[&Lua],
    op_timeout: Duration,
) -> Result<(), LockError> {
    let answered = async {
        let _: String = redis::cmd("PING").query_async(conn).await?;
        let sent = scripts.iter().map(|script| {
            let mut conn = conn.clone();
            async move { script.load_cmd().query_async::<String>(&mut conn).await }
        });
        let hashes = futures_util::future::join_all(sent).await;
        hashes.into_iter().collect::<Result<Vec<String>, _>>()
    };
    let hashes = within("PING and SCRIPT LOAD", op_timeout, answered).await?;
    let expected: Vec<&str> = scripts.iter().map(|script| script.get_hash()).collect();
    if hashes.len() != expected.len() || hashes.iter().zip(&expected).any(|(h, e)| h != e) {
        return Err(error::unexpected(&format!(
            "SCRIPT LOAD answered the hashes {hashes:?}, expected {expected:?}"
        )));
    }
    Ok(())
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
        script.for_cluster(self.commands.is_cluster())
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
        self.commands.script(what, invocation, false).await
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
        self.commands.command(what, command, false).await
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

#[async_trait]
impl LockBackend for RedisBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        if self.fencing {
            CAPABILITIES
        } else {
            UNFENCED_CAPABILITIES
        }
    }

    /// An exclusive claim runs [`store::ACQUIRE`] (which a request that has waited long,
    /// `request.waited`, asks to mark the key as its next turn), or the unfenced `SET NX
    /// PX`; a shared one (read-write lock or semaphore) runs [`store::CLAIM`], with fencing
    /// only.
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let ClaimRequest {
            key,
            owner,
            ttl,
            claim,
            ..
        } = *request;
        let exclusive = claim.is_exclusive();
        if !self.fencing && !exclusive {
            return Err(LockError::claims_unsupported(
                "redis (fencing=false)",
                &claim,
            ));
        }
        let ttl_ms = ttl_millis(ttl)?;
        if !self.fencing {
            return self.acquire_unfenced(key, owner, ttl_ms).await;
        }
        let (script, shared, what) = if exclusive {
            (&store::ACQUIRE, None, "acquire")
        } else {
            (&store::CLAIM, Some(&claim), "claim")
        };
        let names = self.names(key);
        let mut invocation = store::grant_call(
            self.lua(script),
            &names,
            &owner.token().to_hex(),
            ttl_ms,
            owner.label(),
            shared,
        );
        if let Some(waited) = request.waited.filter(|_| exclusive) {
            // A long wait asks to be next (see `store::ACQUIRE`).
            let mark_ms = ttl_ms.min(ttl_millis(STARVING_MARK_TTL)?);
            let waited_us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
            invocation.arg("").arg(waited_us).arg(mark_ms);
        }
        let reply: Vec<Value> = self.commands.script(what, &invocation, true).await?;
        acquire_outcome(&reply, key, &claim, Duration::from_millis(ttl_ms))
    }

    /// An exclusive set in one script ([`store::ACQUIRE_ALL`]) when fencing is on and, in a
    /// Cluster, every key is in one slot (keys carry their own hash tags, so that is rare);
    /// otherwise key by key.
    async fn claim_all(
        &self,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Option<SetOutcome>, LockError> {
        let Some(first) = requests.first() else {
            return Ok(None);
        };
        if !self.fencing || requests.iter().any(|r| !r.claim.is_exclusive()) {
            return Ok(None);
        }
        let names: Vec<Names> = requests.iter().map(|r| self.names(r.key)).collect();
        let one_slot = |n: &Names| names::slot(&n.lock) == names::slot(&names[0].lock);
        if self.commands.is_cluster() && !names.iter().all(one_slot) {
            return Ok(None);
        }
        let ttl_ms = ttl_millis(first.ttl)?;
        let mut invocation = self.lua(&store::ACQUIRE_ALL).prepare_invoke();
        for n in &names {
            invocation
                .key(&n.lock)
                .key(n.fence())
                .key(n.leases())
                .key(n.claims());
        }
        invocation
            .arg(first.owner.token().to_hex())
            .arg(ttl_ms)
            .arg(first.owner.label())
            .arg(store::fence_ttl_millis());
        let reply: Vec<Value> = self
            .commands
            .script("acquire_all", &invocation, true)
            .await?;
        store::set_outcome(&reply, requests, Duration::from_millis(ttl_ms)).map(Some)
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        let names = self.names(key);
        let mut invocation = names.call(self.lua(&store::RELEASE));
        invocation.arg(owner.token().to_hex());
        let released: i64 = self.commands.script("release", &invocation, true).await?;
        Ok(match released {
            0 => ReleaseOutcome::NotHeld,
            announced => {
                // Unannounced: no waiter of another client watches this lock (each would
                // have marked it), but one of ours may sleep on it since an earlier holder.
                if announced == 1 {
                    self.waiters.wake_local(key);
                }
                ReleaseOutcome::Released
            }
        })
    }

    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        self.renew_batch(renewals).await
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        let names = self.names(key);
        let invocation = names.call(self.lua(&store::INSPECT_ALL));
        let reply: Vec<Vec<Value>> = self
            .commands
            .script("inspect all", &invocation, true)
            .await?;
        let mut leases = reply
            .iter()
            .map(|lease| inspected(lease).ok_or_else(|| error::unexpected("inspect lease")))
            .collect::<Result<Vec<_>, _>>()?;
        leases.sort_by_key(|lease| lease.token);
        Ok(leases)
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let names = self.names(key);
        // Order matters: in-process interest first, then the server subscription, then
        // the re-check, so a release at any point after the failed attempt wakes us.
        // The re-check marks the lock, so that its release publishes (a release of a lock
        // nobody watches does not).
        let subscription = self.waiters.subscribe_local(key, place);
        let _registration = self.waiters.register(key, &names.channel()).await?;
        // A claim refused by shared leases passes the change stamp its refusal saw: the
        // re-check answers "free" when anything was released since, and marks the leases
        // so that later releases publish.
        let mut watch = self.lua(&store::WATCH).key(&names.lock);
        if let Some(rev) = hint.revision() {
            watch.key(names.leases()).key(names.claims()).arg(rev);
        }
        let pttl: i64 = self.commands.script("watch", &watch, true).await?;
        let wait = match pttl {
            -2 => return Ok(()),
            // No expiry should never happen to a distlock key; wait the caller's bound.
            -1 => max_wait,
            ms => max_wait.min(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        };
        let _ = tokio::time::timeout(wait, subscription.released()).await;
        Ok(())
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        let names = self.names(key);
        let mut invocation = names.call(self.lua(&store::FORCE_RELEASE));
        invocation.arg(names.channel());
        let released: i64 = self
            .commands
            .script("force release", &invocation, true)
            .await?;
        Ok(if released == 1 {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        let names = self.names(key);
        let mut invocation = names.call(self.lua(&store::ABANDON));
        invocation.arg(owner.token().to_hex());
        let removed: i64 = self.commands.script("abandon", &invocation, true).await?;
        if removed == 1 {
            // Unannounced: no other client watches, but a waiter of ours may have been
            // held back by the reservation.
            self.waiters.wake_local(key);
        }
        Ok(())
    }

    fn notifier(&self) -> Option<&ReleaseNotifier> {
        Some(self.waiters.notifier())
    }

    async fn shutdown(&self) {
        self.waiters.shutdown().await;
    }
}

impl RedisBackend {
    /// An unfenced grant: the plain `SET NX PX`, and the light script only where it is
    /// refused (to re-grant to the same owner, or read the holder's remaining TTL).
    async fn acquire_unfenced(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl_ms: u64,
    ) -> Result<AcquireOutcome, LockError> {
        let names = self.names(key);
        let owner_hex = owner.token().to_hex();
        let set = store::unfenced_set(&names.lock, &owner_hex, ttl_ms, owner.label());
        let ttl = Duration::from_millis(ttl_ms);
        let reply: Value = self.commands.command("acquire", &set, true).await?;
        if reply != Value::Nil {
            return Ok(AcquireOutcome::Acquired(Grant::new(FencingToken(0), ttl)));
        }
        let fallback = store::unfenced_fallback(&names.lock, &owner_hex, ttl_ms, owner.label());
        let reply: Vec<Value> = self.commands.script("acquire", &fallback, true).await?;
        acquire_outcome(&reply, key, &Claim::exclusive(), ttl)
    }
}
