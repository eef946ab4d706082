//! [`RedisBackend`]: the lock operations as Lua scripts on one Redis server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::store_url::{ExposeSecret, StoreUrl};
use lockcore::{
    AcquireOutcome, Capabilities, Contention, ExtendOutcome, FencingToken, Grant, LockBackend,
    LockError, LockInfo, LockKey, Owner, ReleaseNotifier, ReleaseOutcome, WaitHint,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, IntoConnectionInfo, RedisError, ScriptInvocation, Value};

use crate::error::{self, NAME};
use crate::names::{self, Names};
use crate::scripts;
use crate::waiters::{MessageFilter, Registration, Waiters};
use crate::CAPABILITIES;

/// The key prefix used unless the builder sets another.
pub const DEFAULT_PREFIX: &str = "distlock:";
/// How long establishing a connection may take unless the builder sets another bound.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server may take to answer a command unless the builder sets another bound.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a fence key outlives the longest lock: long enough that an idle key's counter
/// is still there when a lock could still be held, short enough that fence keys of keys
/// no longer used do not pile up. After it expires, the `TIME` floor keeps tokens rising.
const FENCE_TTL: Duration = Duration::from_secs(3600);

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
#[derive(Debug)]
pub struct RedisBackend {
    conn: ConnectionManager,
    prefix: String,
    waiters: Arc<Waiters>,
    /// The bound on one operation: connecting plus answering (a script sent again after
    /// `NOSCRIPT` included).
    op_timeout: Duration,
}

/// Builds a [`RedisBackend`]; see [`RedisBackend::builder`].
#[must_use]
pub struct RedisBackendBuilder {
    /// The parsed URL (its password a secret), or why it does not parse, reported by
    /// [`build`](Self::build).
    target: Result<StoreUrl, LockError>,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    connection: Option<ConnectionManager>,
    tls: Option<redis::TlsCertificates>,
    notifier: Option<(Arc<ReleaseNotifier>, Option<MessageFilter>)>,
}

impl RedisBackend {
    /// A builder for a backend on the server at `url`.
    ///
    /// Accepted URLs: `redis://host[:port][/db]`, `redis://[user][:password]@host[:port][/db]`
    /// (percent-encode special characters in the password), `rediss://…` for TLS (rustls,
    /// verifying the server against the platform's root certificates, or the one given to
    /// [`RedisBackendBuilder::tls_root_certificate`]), and `redis+unix:///path/to/socket?db=N&pass=…` for a Unix socket.
    ///
    /// Options (the grammar of [`lockcore::store_url`]): `password=` (or `pass=`) and
    /// `user=` instead of the userinfo, `protocol=resp2|resp3`, `prefix=` (as
    /// [`prefix`](RedisBackendBuilder::prefix)), `connect_timeout=` and `timeout=` (as
    /// [`connect_timeout`](RedisBackendBuilder::connect_timeout) and
    /// [`response_timeout`](RedisBackendBuilder::response_timeout); durations with a unit,
    /// `500ms`, `2s`). The builder's methods override the URL's options. The URL is parsed
    /// here, once; its password is kept as a secret that is never printed, and a malformed
    /// URL is reported by [`build`](RedisBackendBuilder::build).
    ///
    /// The owner label shown by `inspect` is set on the client, not the backend:
    /// `LockClient::builder(backend).label("billing/node-2").build()`.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        let url: String = url.into();
        Self::builder_from(StoreUrl::parse(&url))
    }

    /// [`builder`](Self::builder) for a URL already parsed (e.g. one instance of a
    /// `redlock://` URL).
    pub fn builder_for(url: StoreUrl) -> RedisBackendBuilder {
        Self::builder_from(Ok(url))
    }

    fn builder_from(target: Result<StoreUrl, LockError>) -> RedisBackendBuilder {
        let mut builder = RedisBackendBuilder {
            target,
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            connection: None,
            tls: None,
            notifier: None,
        };
        if let Ok(url) = &builder.target {
            match url_options(url) {
                Ok((prefix, connect_timeout, response_timeout)) => {
                    if let Some(p) = prefix {
                        builder.prefix = p;
                    }
                    if let Some(t) = connect_timeout {
                        builder.connect_timeout = t;
                    }
                    if let Some(t) = response_timeout {
                        builder.response_timeout = t;
                    }
                }
                Err(e) => builder.target = Err(e),
            }
        }
        builder
    }

    /// The key prefix this backend stores locks under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn names(&self, key: &LockKey) -> Names {
        names::names(&self.prefix, key)
    }

    /// Runs one request within the operation bound, mapping its errors.
    ///
    /// A request that fails at once on a broken connection is sent once more: the first
    /// failure makes the connection manager reconnect, and the retry waits for that new
    /// connection (after a restart, the first command would otherwise always fail with
    /// the stale error of the dead connection). Every operation is idempotent per owner, so
    /// a retry can only repeat its effect; the one visible difference is a release whose
    /// first attempt was applied but whose answer was lost, which reports `NotHeld`
    /// ("already released"). Timeouts are not retried.
    async fn bounded<T, F, Fut>(&self, what: &str, request: F) -> Result<T, LockError>
    where
        F: FnMut(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        self.bounded_for(what, Some(self.op_timeout), request).await
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
        F: FnMut(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let attempts = async {
            match request(self.conn.clone()).await {
                Err(e) if error::is_unavailable(&e) && !e.is_timeout() => {
                    tracing::debug!(error = %lockcore::ErrorChain(&e), "redis {what} failed on a broken connection; retrying once");
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
    /// [`RedisBackendBuilder::shared_release_notifier`]. For driver-redlock; not a stable API.
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

impl std::fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field(
                "url",
                &self
                    .target
                    .as_ref()
                    .map_or("<malformed URL>", StoreUrl::redacted),
            )
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("connection", &self.connection.is_some())
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl RedisBackendBuilder {
    /// The prefix of every Redis key and channel this backend uses (default `distlock:`).
    /// Backends with different prefixes never see each other's locks. Must not contain
    /// `{` or `}`: the backend adds the hash tag itself.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The bound on establishing a connection, for the first connection and every
    /// reconnection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The bound on the server's answer to one command (default 2 s). An operation fails
    /// with [`LockError::Unavailable`] after at most the connect timeout plus this.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Sends commands over an existing connection instead of opening one. The URL is still
    /// used for the pub/sub connection that waiters share. The connection's own timeouts
    /// apply to its commands; each operation is still bounded by the builder's timeouts.
    pub fn connection(mut self, connection: ConnectionManager) -> Self {
        self.connection = Some(connection);
        self
    }

    /// For `rediss://` URLs: trust this CA certificate (PEM) instead of the platform's root
    /// certificates, e.g. for a server with a private or self-signed certificate.
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls
            .get_or_insert(redis::TlsCertificates {
                client_tls: None,
                root_cert: None,
            })
            .root_cert = Some(pem.into());
        self
    }

    /// For `rediss://` URLs: authenticate with this client certificate and key (PEM), for a
    /// server that requires mutual TLS (`tls-auth-clients yes`).
    pub fn tls_client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls
            .get_or_insert(redis::TlsCertificates {
                client_tls: None,
                root_cert: None,
            })
            .client_tls = Some(redis::ClientTlsConfig {
            client_cert: certificate_pem.into(),
            client_key: key_pem.into(),
        });
        self
    }

    /// Delivers this backend's release messages to `notifier` (waking one of its waiters
    /// per message that `filter` accepts) instead of a notifier of its own: driver-redlock
    /// shares one notifier among its instances. Not a stable API.
    #[doc(hidden)]
    pub fn shared_release_notifier(
        mut self,
        notifier: Arc<ReleaseNotifier>,
        filter: Option<MessageFilter>,
    ) -> Self {
        self.notifier = Some((notifier, filter));
        self
    }

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
        let client = open_client(&self.target?, self.tls)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            // Reconnection is retried by the next command, not in a backoff loop a command
            // would wait behind: an unreachable server must fail calls promptly.
            .set_number_of_retries(0);
        let op_timeout = self.connect_timeout + self.response_timeout;
        let mut conn = match self.connection {
            Some(conn) => conn,
            None => {
                let connect = ConnectionManager::new_with_config(client.clone(), config);
                match tokio::time::timeout(op_timeout, connect).await {
                    Ok(Ok(conn)) => conn,
                    Ok(Err(e)) => return Err(error::map(e)),
                    Err(_) => return Err(error::timed_out("connecting", op_timeout)),
                }
            }
        };
        // A server that wants a password accepts the connection and refuses the first
        // command: find out now, not at the first lock.
        let ping = redis::cmd("PING");
        match tokio::time::timeout(op_timeout, ping.query_async::<String>(&mut conn)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(error::map(e)),
            Err(_) => return Err(error::timed_out("PING", op_timeout)),
        }
        // Load the scripts now, so the first operations are single EVALSHAs (a `NOSCRIPT`
        // costs two more round trips, e.g. after a server restart).
        for script in scripts::all() {
            match tokio::time::timeout(op_timeout, script.load_async(&mut conn)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(error::map(e)),
                Err(_) => return Err(error::timed_out("SCRIPT LOAD", op_timeout)),
            }
        }
        let waiters = Arc::new(Waiters::new(
            client,
            self.connect_timeout,
            self.response_timeout,
            self.notifier,
        ));
        Ok(Arc::new(RedisBackend {
            conn,
            prefix: self.prefix,
            waiters,
            op_timeout,
        }))
    }
}

/// The options of a TCP `redis://` URL.
const TCP_OPTIONS: &[&str] = &[
    "user",
    "password",
    "pass",
    "protocol",
    "prefix",
    "timeout",
    "connect_timeout",
];

/// The options of a `redis+unix://` URL (the database is an option: the path is the socket).
const UNIX_OPTIONS: &[&str] = &[
    "db",
    "user",
    "password",
    "pass",
    "protocol",
    "prefix",
    "timeout",
    "connect_timeout",
];

/// The options only distlock reads, never passed to the redis crate.
const OWN_OPTIONS: &[&str] = &[
    "user",
    "password",
    "pass",
    "prefix",
    "timeout",
    "connect_timeout",
];

fn is_unix(url: &StoreUrl) -> bool {
    matches!(url.scheme(), "redis+unix" | "valkey+unix" | "unix")
}

/// The URL's `prefix`, `connect_timeout` and `timeout` options, after checking that it
/// has no others.
#[allow(clippy::type_complexity)]
fn url_options(
    url: &StoreUrl,
) -> Result<(Option<String>, Option<Duration>, Option<Duration>), LockError> {
    let known = if is_unix(url) {
        UNIX_OPTIONS
    } else {
        TCP_OPTIONS
    };
    url.check_options(known, &[])?;
    Ok((
        url.str_option("prefix")?.map(str::to_owned),
        url.duration_option("connect_timeout")?,
        url.duration_option("timeout")?,
    ))
}

/// Makes a client from the parsed URL: the redis crate gets the URL without its secrets
/// (so nothing it reports can quote them) and the password separately, at the last moment.
fn open_client(
    url: &StoreUrl,
    tls: Option<redis::TlsCertificates>,
) -> Result<redis::Client, LockError> {
    match url.scheme() {
        "redis" | "valkey" | "redis+unix" | "valkey+unix" | "unix" => {}
        "rediss" | "valkeys" => install_crypto_provider(),
        other => {
            return Err(LockError::config(format!(
                "unsupported URL scheme {other:?} for the redis backend; use redis://, rediss:// or redis+unix://"
            )))
        }
    }
    if !is_unix(url) {
        url.single_endpoint().map_err(|e| {
            LockError::config(format!(
                "{e}; expected redis://[user:password@]host[:port][/db] or rediss://…"
            ))
        })?;
    }
    url_options(url)?;
    let public = url.without_secrets(OWN_OPTIONS);
    let info = public
        .as_str()
        .into_connection_info()
        .map_err(|e| url.error(format_args!("invalid redis URL: {e}")))?;
    let mut settings = info.redis_settings().clone();
    if let Some(user) = url.user()? {
        settings = settings.set_username(user);
    }
    if let Some(password) = url.password()? {
        settings = settings.set_password(password.expose_secret());
    }
    let info = info.set_redis_settings(settings);
    let client = match tls {
        Some(certificates) => redis::Client::build_with_tls(info, certificates),
        None => redis::Client::open(info),
    };
    client.map_err(|e| url.error(format_args!("invalid redis URL: {e}")))
}

/// rustls needs a process-wide crypto provider when more than one (or none) is compiled
/// in; install ring's unless the application installed one already.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A TTL in whole milliseconds, rounded up (Redis `PX` counts milliseconds).
#[doc(hidden)]
pub fn ttl_millis(ttl: Duration) -> Result<u64, LockError> {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms)
        .ok()
        .filter(|ms| *ms > 0 && *ms <= CAPABILITIES.max_ttl.as_millis() as u64)
        .ok_or_else(|| LockError::InvalidTtl {
            ttl,
            reason: format!(
                "the redis backend accepts TTLs from 1 ms to {:?}",
                CAPABILITIES.max_ttl
            ),
        })
}

/// The fence key's TTL in ms: the longest lock TTL plus an hour.
#[doc(hidden)]
pub fn fence_ttl_millis() -> u64 {
    (CAPABILITIES.max_ttl + FENCE_TTL).as_millis() as u64
}

/// An integer reply (or a string holding one).
#[doc(hidden)]
pub fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// A fencing token reply (a string of digits, or an integer).
#[doc(hidden)]
pub fn as_token(v: &Value) -> Option<FencingToken> {
    let s = match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.to_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => return None,
    };
    s.parse().ok().map(FencingToken)
}

/// A PTTL answer as a remaining TTL: `None` for "no expiry" or "no key".
#[doc(hidden)]
pub fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

/// The token and label in a lock value `<owner hex><mark><token> <label>` (the mark is a
/// space, or `+` once a waiter watches it).
#[doc(hidden)]
pub fn parse_value(value: &[u8]) -> Option<(FencingToken, String)> {
    let (owner, rest) = (value.get(..32)?, value.get(32..)?);
    let (mark, rest) = rest.split_first()?;
    if !owner.iter().all(u8::is_ascii_hexdigit) || !matches!(mark, b' ' | b'+') {
        return None;
    }
    let rest = std::str::from_utf8(rest).ok()?;
    let (token, label) = rest.split_once(' ').unwrap_or((rest, ""));
    Some((FencingToken(token.parse().ok()?), label.to_owned()))
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let ttl_ms = ttl_millis(ttl)?;
        let names = self.names(key);
        let mut invocation = scripts::ACQUIRE.key(&names.lock);
        invocation
            .key(names.fence())
            .arg(owner.token().to_hex())
            .arg(ttl_ms)
            .arg(owner.label())
            .arg(fence_ttl_millis());
        let reply: Vec<Value> = self
            .bounded("acquire", |mut conn| {
                let invocation = &invocation;
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
        match reply.as_slice() {
            [flag, token] if as_int(flag) == Some(1) => {
                let token = as_token(token).ok_or_else(|| error::unexpected("acquire token"))?;
                Ok(AcquireOutcome::Acquired(Grant::new(
                    token,
                    Duration::from_millis(ttl_ms),
                )))
            }
            [flag, pttl] if as_int(flag) == Some(0) => Ok(AcquireOutcome::Held(Contention::new(
                as_int(pttl).and_then(remaining),
            ))),
            _ => Err(error::unexpected("acquire reply")),
        }
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        let names = self.names(key);
        let mut invocation = scripts::RELEASE.key(&names.lock);
        invocation.arg(owner.token().to_hex());
        let released: i64 = self
            .bounded("release", |mut conn| {
                let invocation = &invocation;
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
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

    async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let ttl_ms = ttl_millis(ttl)?;
        let names = self.names(key);
        let mut invocation = scripts::EXTEND.key(&names.lock);
        invocation.arg(owner.token().to_hex()).arg(ttl_ms);
        let reply: Vec<Value> = self
            .bounded("extend", |mut conn| {
                let invocation = &invocation;
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
        match reply.as_slice() {
            [flag, token] if as_int(flag) == Some(1) => {
                let token = as_token(token).ok_or_else(|| error::unexpected("extend token"))?;
                Ok(ExtendOutcome::Extended(Grant::new(
                    token,
                    Duration::from_millis(ttl_ms),
                )))
            }
            [flag] if as_int(flag) == Some(0) => Ok(ExtendOutcome::NotHeld),
            _ => Err(error::unexpected("extend reply")),
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let names = self.names(key);
        let invocation = scripts::INSPECT.key(&names.lock);
        let reply: Vec<Value> = self
            .bounded("inspect", |mut conn| {
                let invocation = &invocation;
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
        match reply.as_slice() {
            [] => Ok(None),
            [Value::BulkString(value), pttl] => {
                let (token, label) =
                    parse_value(value).ok_or_else(|| error::unexpected("lock value"))?;
                Ok(Some(LockInfo::new(
                    label,
                    token,
                    as_int(pttl).and_then(remaining),
                )))
            }
            _ => Err(error::unexpected("inspect reply")),
        }
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        _hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let names = self.names(key);
        // Order matters: in-process interest first, then the server subscription, then
        // the re-check, so a release at any point after the failed attempt wakes us.
        // The re-check marks the lock, so that its release publishes (a release of a lock
        // nobody watches does not).
        let subscription = self.waiters.subscribe_local(key);
        let _registration = self.waiters.register(key, &names.channel()).await?;
        let watch = scripts::WATCH.key(&names.lock);
        let pttl: i64 = self
            .bounded("watch", |mut conn| {
                let watch = &watch;
                async move { watch.invoke_async(&mut conn).await }
            })
            .await?;
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
        let mut invocation = scripts::FORCE_RELEASE.key(&names.lock);
        invocation.arg(names.channel());
        let released: i64 = self
            .bounded("force release", |mut conn| {
                let invocation = &invocation;
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
        Ok(if released == 1 {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    async fn shutdown(&self) {
        self.waiters.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_micros(1)).unwrap(), 1);
        assert_eq!(ttl_millis(Duration::from_micros(1500)).unwrap(), 2);
        assert_eq!(ttl_millis(Duration::from_secs(3)).unwrap(), 3000);
        assert!(ttl_millis(Duration::ZERO).is_err());
        assert!(ttl_millis(Duration::MAX).is_err());
    }

    #[test]
    fn values_parse() {
        let owner = "0123456789abcdef0123456789abcdef";
        for mark in [' ', '+'] {
            let value = format!("{owner}{mark}1700000000123456 host/1 task");
            let (t, l) = parse_value(value.as_bytes()).unwrap();
            assert_eq!(t, FencingToken(1_700_000_000_123_456));
            assert_eq!(l, "host/1 task");
        }
        assert!(parse_value(format!("{owner}*17 x").as_bytes()).is_none());
        assert!(parse_value(b"garbage").is_none());
        assert!(parse_value(b"0123 1700000000123456 host/1 task").is_none());
    }

    #[test]
    fn malformed_urls_are_config_errors() {
        for url in [
            "",
            "redis",
            "http://127.0.0.1/",
            "redis://",
            "redis://127.0.0.1/notadb",
            "redis://[::1",
            "redis://h:notaport/",
            "redis://h1,h2/",
            "redis://h/0?timeout=5",
            "redis://h/0?prefx=a",
            "redis://u:a@h/0?password=b",
        ] {
            match StoreUrl::parse(url).and_then(|u| open_client(&u, None)) {
                Err(LockError::Config { .. }) => {}
                other => panic!("{url}: {other:?}"),
            }
        }
        for url in [
            "redis://u:s3cret@127.0.0.1/x",
            "redis://127.0.0.1/x?password=s3cret",
            "redis://127.0.0.1/0?password=s3cret&protocol=9",
        ] {
            let err = StoreUrl::parse(url)
                .and_then(|u| open_client(&u, None))
                .unwrap_err();
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
        let err = StoreUrl::parse("redis://h/0?timeout=5")
            .and_then(|u| open_client(&u, None))
            .unwrap_err()
            .to_string();
        assert!(err.contains("write 500ms or 5s"), "{err}");
    }

    #[test]
    fn url_options_set_the_builder_and_methods_override_them() {
        let b = RedisBackend::builder("redis://h/0?prefix=app:&timeout=250ms&connect_timeout=1s");
        assert_eq!(b.prefix, "app:");
        assert_eq!(b.response_timeout, Duration::from_millis(250));
        assert_eq!(b.connect_timeout, Duration::from_secs(1));
        let b = RedisBackend::builder("redis://h/0?prefix=app:").prefix("other:");
        assert_eq!(b.prefix, "other:");
    }

    #[test]
    fn builder_debug_hides_passwords() {
        for url in [
            "redis://u:s3cret@127.0.0.1/0",
            "redis+unix:///tmp/r.sock?db=1&pass=s3cret",
            "redis://127.0.0.1/0?password=s3cret",
            "not a url s3cret",
        ] {
            let shown = format!("{:?}", RedisBackend::builder(url));
            assert!(!shown.contains("s3cret"), "{shown}");
        }
    }
}
