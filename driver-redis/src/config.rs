//! [`RedisBackendBuilder`] and the URL: the builder's settings, the options each scheme
//! accepts, and from a parsed URL to a redis client (the password handed over apart from
//! the URL), a cluster's nodes or the sentinels to ask.

use std::sync::Arc;
use std::time::Duration;

use lockcore::driver::ReleaseNotifier;
use lockcore::store_url::{ExposeSecret, StoreUrl};
use lockcore::LockError;
use redis::aio::ConnectionManager;
use redis::IntoConnectionInfo;

use crate::connection::ClusterTarget;
use crate::wait::MessageFilter;

/// The key prefix used unless the builder sets another.
pub const DEFAULT_PREFIX: &str = "distlock:";
/// How long establishing a connection may take unless the builder sets another bound.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server may take to answer a command unless the builder sets another bound.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Builds a [`RedisBackend`](crate::RedisBackend) for the server at a URL: see
/// [`RedisBackend::builder`](crate::RedisBackend::builder).
///
/// Accepted URLs: `redis://host[:port][/db]`, `redis://[user][:password]@host[:port][/db]`
/// (percent-encode special characters in the password), `rediss://…` for TLS (rustls,
/// verifying the server against the platform's root certificates, or the one given to
/// [`tls_root_certificate`](Self::tls_root_certificate)), and `redis+unix:///path/to/socket?db=N&pass=…` for a Unix socket.
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
/// [`prefix`](Self::prefix)), `connect_timeout=` and `timeout=` (as
/// [`connect_timeout`](Self::connect_timeout) and
/// [`response_timeout`](Self::response_timeout); durations with a unit,
/// `500ms`, `2s`), `fencing=false` (as [`fencing`](Self::fencing)). The
/// builder's methods override the URL's options. The URL is parsed
/// here, once; its password is kept as a secret that is never printed, and a malformed
/// URL is reported by [`build`](Self::build).
///
/// The owner label shown by `inspect` is set on the client, not the backend:
/// `LockClient::builder(backend).label("billing/node-2").build()`.
#[must_use]
pub struct RedisBackendBuilder {
    /// The parsed URL (its password a secret), or why it does not parse, reported by
    /// [`build`](Self::build).
    pub(crate) target: Result<StoreUrl, LockError>,
    pub(crate) prefix: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) connection: Option<ConnectionManager>,
    pub(crate) tls: Option<redis::TlsCertificates>,
    pub(crate) notifier: Option<(Arc<ReleaseNotifier>, Option<MessageFilter>)>,
    pub(crate) fencing: bool,
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
    /// The builder of [`RedisBackend::builder`](crate::RedisBackend::builder): the URL's
    /// options over the defaults.
    pub(crate) fn new(target: Result<StoreUrl, LockError>) -> RedisBackendBuilder {
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
        if let Err(e) = builder.read_options() {
            builder.target = Err(e);
        }
        builder
    }

    /// Sets what the URL's `prefix`, `connect_timeout`, `timeout` and `fencing` options
    /// say, after checking that it has no others.
    fn read_options(&mut self) -> Result<(), LockError> {
        let Ok(url) = &self.target else {
            return Ok(());
        };
        check_options(url)?;
        if let Some(prefix) = url.str_option("prefix")? {
            self.prefix = prefix.to_owned();
        }
        if let Some(t) = url.duration_option("connect_timeout")? {
            self.connect_timeout = t;
        }
        if let Some(t) = url.duration_option("timeout")? {
            self.response_timeout = t;
        }
        if let Some(fencing) = url.bool_option("fencing")? {
            self.fencing = fencing;
        }
        Ok(())
    }

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
}

/// The options only distlock reads, never passed to the redis crate; every scheme takes
/// them. A TCP `redis://` URL also takes `protocol`; `redis+unix://` also `db` and
/// `protocol` (the path is the socket); `redis+cluster://` nothing more (a cluster has only
/// database 0, and its sharded pub/sub needs RESP3); `redis+sentinel://` the sentinels' own
/// credentials (Sentinel has its `requirepass` apart from the master's).
const OWN_OPTIONS: &[&str] = &[
    "user",
    "password",
    "pass",
    "prefix",
    "timeout",
    "connect_timeout",
    "fencing",
];

/// The port a sentinel listens on unless the URL says otherwise.
const SENTINEL_PORT: u16 = 26379;

fn is_unix(url: &StoreUrl) -> bool {
    matches!(url.scheme(), "redis+unix" | "valkey+unix" | "unix")
}

fn is_cluster(url: &StoreUrl) -> bool {
    matches!(url.scheme(), "redis+cluster" | "rediss+cluster")
}

fn is_sentinel(url: &StoreUrl) -> bool {
    matches!(url.scheme(), "redis+sentinel" | "rediss+sentinel")
}

/// Checks that the URL has only the options its scheme takes.
fn check_options(url: &StoreUrl) -> Result<(), LockError> {
    let more: &[&str] = if is_unix(url) {
        &["db", "protocol"]
    } else if is_cluster(url) {
        &[]
    } else if is_sentinel(url) {
        &["sentinel_user", "sentinel_password"]
    } else {
        &["protocol"]
    };
    url.check_options(&[OWN_OPTIONS, more].concat(), &[])
}

/// Checks the hosts of a cluster or sentinel URL: at least one, every one named, and the
/// credentials given once, before the first (`none` and `again` say what is wrong).
fn check_hosts(
    url: &StoreUrl,
    bad: impl Fn(std::fmt::Arguments<'_>) -> LockError,
    none: &str,
    again: &str,
) -> Result<(), LockError> {
    if url.endpoints().is_empty() || url.endpoints().iter().any(|e| e.host.is_empty()) {
        return Err(bad(format_args!("{none}")));
    }
    if url.endpoints()[1..].iter().any(|e| e.credentials.is_some()) {
        return Err(bad(format_args!("{again}")));
    }
    Ok(())
}

/// What a URL names: one server, a Redis Cluster, or a master under Redis Sentinel.
pub(crate) enum Target {
    Single(redis::Client),
    Cluster(ClusterTarget),
    Sentinel(SentinelTarget),
}

/// A master under Redis Sentinel: the sentinels to ask, the master's name, and how to talk
/// to each.
pub(crate) struct SentinelTarget {
    pub(crate) client: redis::sentinel::SentinelClient,
    /// The name the sentinels monitor the master as.
    pub(crate) master: String,
    pub(crate) db: i64,
}

/// Reads a `redis+sentinel://[user:password@]s1[:port],s2[:port]/master[/db]` URL.
fn open_sentinel(url: &StoreUrl, tls: Option<redis::TlsCertificates>) -> Result<Target, LockError> {
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    let bad = |what: std::fmt::Arguments<'_>| {
        url.error(format_args!(
            "{what}; expected redis+sentinel://[user:password@]sentinel[:port][,sentinel[:port]…]/master-name[/db] or rediss+sentinel://…"
        ))
    };
    check_hosts(
        url,
        bad,
        "a sentinel URL names at least one sentinel",
        "give the master's credentials once, before the first sentinel or as ?user= and ?password= (the sentinels' own as ?sentinel_user= and ?sentinel_password=)",
    )?;
    let path = url.decoded_path()?;
    let mut parts = path.trim_start_matches('/').split('/');
    let master = match parts.next() {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ => {
            return Err(bad(format_args!(
                "the URL names no master (the name the sentinels monitor)"
            )))
        }
    };
    let db = match parts.next() {
        None | Some("") => 0,
        Some(db) => db
            .parse::<i64>()
            .map_err(|_| bad(format_args!("the database {db:?} is not a number")))?,
    };
    if parts.next().is_some() {
        return Err(bad(format_args!(
            "the path has more than a master name and a database"
        )));
    }
    let tls_on = url.scheme() == "rediss+sentinel";
    if tls_on {
        install_crypto_provider();
    }
    let sentinels = url.endpoints().iter().map(|e| {
        let host = e
            .host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = e.port.unwrap_or(SENTINEL_PORT);
        if tls_on {
            redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            redis::ConnectionAddr::Tcp(host, port)
        }
    });
    let refused =
        |e: redis::RedisError| LockError::config(format!("invalid redis sentinel URL: {e}"));
    let mut builder = SentinelClientBuilder::new(sentinels, &master, SentinelServerType::Master)
        .map_err(refused)?
        .set_client_to_redis_db(db);
    if let Some(user) = url.user()? {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = url.password()? {
        builder = builder.set_client_to_redis_password(password.expose_secret());
    }
    if let Some(user) = url.str_option("sentinel_user")? {
        builder = builder.set_client_to_sentinel_username(user);
    }
    if let Some(password) = url.secret_option("sentinel_password")? {
        builder = builder.set_client_to_sentinel_password(password.expose_secret());
    }
    if tls_on {
        builder = builder
            .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
        if let Some(certificates) = tls {
            builder = builder
                .set_client_to_redis_certificates(certificates.clone())
                .set_client_to_sentinel_certificates(certificates);
        }
    }
    let client = builder.build().map_err(refused)?;
    Ok(Target::Sentinel(SentinelTarget { client, master, db }))
}

/// Makes a client of what the parsed URL names: one server, or a Redis Cluster.
pub(crate) fn open(
    url: &StoreUrl,
    tls: Option<redis::TlsCertificates>,
) -> Result<Target, LockError> {
    if is_sentinel(url) {
        return open_sentinel(url, tls);
    }
    if !is_cluster(url) {
        return open_client(url, tls).map(Target::Single);
    }
    let bad = |what: std::fmt::Arguments<'_>| {
        url.error(format_args!(
            "{what}; expected redis+cluster://[user:password@]host:port[,host:port…]/ or rediss+cluster://…"
        ))
    };
    check_hosts(
        url,
        bad,
        "a cluster URL names at least one node",
        "every node of a cluster takes the same credentials: give them once, before the first host or as ?user= and ?password=",
    )?;
    if !matches!(url.path(), "" | "/" | "/0") {
        return Err(bad(format_args!(
            "a Redis Cluster has only database 0, not {:?}",
            url.path()
        )));
    }
    let tls_scheme = if url.scheme() == "rediss+cluster" {
        install_crypto_provider();
        "rediss"
    } else {
        "redis"
    };
    let nodes = url
        .endpoints()
        .iter()
        .map(|e| {
            format!("{tls_scheme}://{}/", e.host_port(6379))
                .as_str()
                .into_connection_info()
                .map_err(|e| bad(format_args!("{e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let target = ClusterTarget {
        nodes,
        user: url.user()?,
        password: url.password()?,
        // Certificates are for `rediss+cluster://` only: given with a plain URL, they must not
        // switch TLS on behind its back (the cluster client would).
        tls: tls.filter(|_| tls_scheme == "rediss"),
    };
    // The checks the client makes without connecting (e.g. a TLS mode it cannot use).
    target.client(Duration::from_secs(1), Duration::from_secs(1), None)?;
    Ok(Target::Cluster(target))
}

/// Makes a client from the parsed URL: the redis crate gets the URL without its secrets
/// (so nothing it reports can quote them) and the password separately, at the last moment.
pub(crate) fn open_client(
    url: &StoreUrl,
    tls: Option<redis::TlsCertificates>,
) -> Result<redis::Client, LockError> {
    match url.scheme() {
        "redis" | "valkey" | "redis+unix" | "valkey+unix" | "unix" => {}
        "rediss" | "valkeys" => install_crypto_provider(),
        other => {
            return Err(LockError::config(format!(
                "unsupported URL scheme {other:?} for the redis backend; use redis://, rediss://, redis+unix://, redis+cluster:// or redis+sentinel://"
            )))
        }
    }
    if !is_unix(url) {
        url.single_endpoint().map_err(|e| {
            // The message alone: the error's own text starts "configuration error:", which
            // the new one says again.
            let said = match &e {
                LockError::Config { message } => message.clone(),
                other => other.to_string(),
            };
            LockError::config(format!(
                "{said}; expected redis://[user:password@]host[:port][/db] or rediss://…"
            ))
        })?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RedisBackend;

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

#[cfg(test)]
mod config_tests {
    use super::*;
    use crate::RedisBackend;

    /// A client of `url` as `build` makes it: its options read by the builder, then opened.
    fn opened(url: &str) -> Result<(), LockError> {
        let target = RedisBackend::builder(url).target?;
        open(&target, None).map(|_| ())
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
            match opened(url) {
                Err(LockError::Config { .. }) => {}
                other => panic!("{url}: {other:?}"),
            }
        }
        for url in [
            "redis://u:s3cret@127.0.0.1/x",
            "redis://127.0.0.1/x?password=s3cret",
            "redis://127.0.0.1/0?password=s3cret&protocol=9",
        ] {
            let err = opened(url).unwrap_err();
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
        let err = opened("redis://h/0?timeout=5").unwrap_err().to_string();
        assert!(err.contains("write 500ms or 5s"), "{err}");
    }

    /// There is one layout: an option asking for another is refused by name, on every scheme.
    #[test]
    fn the_fair_option_is_refused_by_name() {
        for url in [
            "redis://127.0.0.1/?fair=true",
            "redis+unix:///tmp/redis.sock?fair=true",
            "redis+cluster://127.0.0.1:7000/?fair=true",
            "redis+sentinel://127.0.0.1/master?fair=true",
        ] {
            let parsed = StoreUrl::parse(url).unwrap();
            match check_options(&parsed) {
                Err(LockError::Config { message }) => {
                    assert!(
                        message.contains("unknown option \"fair\""),
                        "{url}: {message}"
                    )
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        let err = opened("redis://127.0.0.1/?fair=true").unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err:?}");
    }
}
