//! [`RedisBackendBuilder`]: connecting, checking the server and loading the scripts.

use std::sync::Arc;
use std::time::Duration;

use lockcore::driver::ReleaseNotifier;
use lockcore::store_url::StoreUrl;
use lockcore::LockError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::backend::RedisBackend;
use crate::config::{self, url_options, Target};
use crate::connection::Connection;
use crate::error;
use crate::lua::Lua;
use crate::names;
use crate::pubsub::Source;
use crate::scripts;
use crate::sentinel::SentinelConnection;
use crate::waiters::{MessageFilter, Waiters};

/// The key prefix used unless the builder sets another.
pub const DEFAULT_PREFIX: &str = "distlock:";
/// How long establishing a connection may take unless the builder sets another bound.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server may take to answer a command unless the builder sets another bound.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

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
    fencing: bool,
}

impl RedisBackend {
    /// A builder for a backend on the server at `url`.
    ///
    /// Accepted URLs: `redis://host[:port][/db]`, `redis://[user][:password]@host[:port][/db]`
    /// (percent-encode special characters in the password), `rediss://…` for TLS (rustls,
    /// verifying the server against the platform's root certificates, or the one given to
    /// [`RedisBackendBuilder::tls_root_certificate`]), and `redis+unix:///path/to/socket?db=N&pass=…` for a Unix socket.
    ///
    /// A Redis Cluster (Redis 7 or later): `redis+cluster://[user:password@]h1:p1,h2:p2,…/`
    /// (any nodes of the cluster; the rest is discovered), `rediss+cluster://…` for TLS to every
    /// node. A master under Redis Sentinel:
    /// `redis+sentinel://[user:password@]s1[:p1],s2[:p2],…/master-name[/db]` (sentinel port
    /// 26379 by default; the credentials are the master's, the sentinels' own go in
    /// `sentinel_user=` and `sentinel_password=`), `rediss+sentinel://…` for TLS to both.
    /// See `docs/redis-safety.md` for what each topology's failover does to the guarantees.
    ///
    /// Options (the grammar of [`lockcore::store_url`]): `password=` (or `pass=`) and
    /// `user=` instead of the userinfo, `protocol=resp2|resp3`, `prefix=` (as
    /// [`prefix`](RedisBackendBuilder::prefix)), `connect_timeout=` and `timeout=` (as
    /// [`connect_timeout`](RedisBackendBuilder::connect_timeout) and
    /// [`response_timeout`](RedisBackendBuilder::response_timeout); durations with a unit,
    /// `500ms`, `2s`), `fencing=false` (as [`fencing`](RedisBackendBuilder::fencing)). The
    /// builder's methods override the URL's options. The URL is parsed
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
            fencing: true,
        };
        if let Ok(url) = &builder.target {
            match url_options(url) {
                Ok(options) => {
                    if let Some(p) = options.prefix {
                        builder.prefix = p;
                    }
                    if let Some(t) = options.connect_timeout {
                        builder.connect_timeout = t;
                    }
                    if let Some(t) = options.response_timeout {
                        builder.response_timeout = t;
                    }
                    if let Some(fencing) = options.fencing {
                        builder.fencing = fencing;
                    }
                }
                Err(e) => builder.target = Err(e),
            }
        }
        builder
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
            .field("fencing", &self.fencing)
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
    /// One server's only: [`build`](Self::build) refuses it with a cluster or sentinel URL.
    pub fn connection(mut self, connection: ConnectionManager) -> Self {
        self.connection = Some(connection);
        self
    }

    /// Whether acquisitions take fencing tokens (default `true`). Switched off, a grant is
    /// a plain `SET key value NX PX ttl` (a script only where it is refused, to re-grant to
    /// the same owner or read the holder's TTL), no fence key is kept, every token is 0,
    /// and the backend declares [`FencingGuarantee::None`](lockcore::driver::FencingGuarantee::None)
    /// and no shared claims ([`UNFENCED_CAPABILITIES`](crate::UNFENCED_CAPABILITIES)).
    /// For callers that need mutual exclusion but never hand a token to a resource.
    ///
    /// Every client of one lock must agree: a fenced and an unfenced client exclude each
    /// other, but the unfenced one does not see shared claims or reservations on the key.
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
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
        let target = self.target?;
        let op_timeout = self.connect_timeout + self.response_timeout;
        let used: Vec<&Lua> = scripts::all().to_vec();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            // Reconnection is retried by the next command, not in a backoff loop a command
            // would wait behind: an unreachable server must fail calls promptly.
            .set_number_of_retries(0);
        // Every failure to connect names where (the URL's hosts, or its socket's path).
        let place = target.place(6379);
        let opened = async {
            Ok::<_, LockError>(match config::open(&target, self.tls)? {
                Target::Single(client) => {
                    let conn = match self.connection {
                        Some(conn) => conn,
                        None => {
                            let connect =
                                ConnectionManager::new_with_config(client.clone(), config);
                            settle(
                                tokio::time::timeout(op_timeout, connect).await,
                                "connecting",
                                op_timeout,
                            )?
                        }
                    };
                    let mut conn = Connection::Single(conn);
                    load_scripts(&mut conn, &used, op_timeout).await?;
                    (conn, Source::Single(client))
                }
                Target::Cluster(cluster) => {
                    if self.connection.is_some() {
                        return Err(LockError::config(
                        "a connection given to the builder is one server's; a redis+cluster:// URL needs the backend to open its own",
                    ));
                    }
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
                    let conn = settle(
                        tokio::time::timeout(op_timeout, connect).await,
                        "connecting to the cluster",
                        op_timeout,
                    )?;
                    let mut conn = Connection::Cluster(conn);
                    // Releases are announced with SPUBLISH, which Redis 7 introduced.
                    let mut has_spublish = redis::cmd("COMMAND");
                    has_spublish.arg("INFO").arg("SPUBLISH");
                    let info: Vec<redis::Value> = settle(
                        tokio::time::timeout(op_timeout, has_spublish.query_async(&mut conn)).await,
                        "COMMAND INFO",
                        op_timeout,
                    )?;
                    if !matches!(info.first(), Some(redis::Value::Array(_))) {
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
                    if self.connection.is_some() {
                        return Err(LockError::config(
                        "a connection given to the builder is one server's; a redis+sentinel:// URL needs the backend to open its own",
                    ));
                    }
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
            conn,
            prefix: self.prefix,
            waiters,
            op_timeout,
            fencing: self.fencing,
        }))
    }
}

/// The outcome of a request bounded by `after`.
fn settle<T>(
    answer: Result<Result<T, redis::RedisError>, tokio::time::error::Elapsed>,
    what: &str,
    after: Duration,
) -> Result<T, LockError> {
    match answer {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(error::map(e)),
        Err(_) => Err(error::timed_out(what, after)),
    }
}

/// Checks that the server answers (and accepts the credentials: a server that wants a
/// password accepts the connection and refuses the first command, so find out now, not at
/// the first lock) and loads `scripts`, so the first operations are single EVALSHAs (a
/// `NOSCRIPT` costs two more round trips). One pipelined round trip on one server; on a
/// cluster, each `SCRIPT LOAD` goes to every node.
async fn load_scripts(
    conn: &mut Connection,
    scripts: &[&Lua],
    op_timeout: Duration,
) -> Result<(), LockError> {
    let answered = async {
        if conn.is_cluster() {
            let _: String = redis::cmd("PING").query_async(conn).await?;
            let sent = scripts.iter().map(|script| {
                let mut conn = conn.clone();
                async move { script.load_cmd().query_async::<String>(&mut conn).await }
            });
            let hashes = futures_util::future::join_all(sent).await;
            hashes.into_iter().collect::<Result<Vec<String>, _>>()
        } else {
            let mut first = redis::pipe();
            first.cmd("PING");
            for script in scripts {
                first.add_command(script.load_cmd());
            }
            // PONG, then each script's hash.
            let mut answers = first.query_async::<Vec<String>>(conn).await?;
            answers.drain(..1.min(answers.len()));
            Ok(answers)
        }
    };
    let hashes = settle(
        tokio::time::timeout(op_timeout, answered).await,
        "PING and SCRIPT LOAD",
        op_timeout,
    )?;
    let expected: Vec<&str> = scripts.iter().map(|script| script.get_hash()).collect();
    if hashes.len() != expected.len() || hashes.iter().zip(&expected).any(|(h, e)| h != e) {
        return Err(error::unexpected(&format!(
            "SCRIPT LOAD answered the hashes {hashes:?}, expected {expected:?}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
