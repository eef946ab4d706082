//! The `zk://` URL: a host list (ZooKeeper's own connect string, which the `url` crate
//! rejects), the root path under which locks live, credentials, TLS and timeouts.

use std::time::Duration;

use lockcore::store_url::{SecretString, StoreUrl};
use lockcore::LockError;

/// The options a `zk://` URL takes.
const KNOWN_OPTIONS: &[&str] = &[
    "session_timeout",
    "timeout",
    "connect_timeout",
    "connection_timeout",
    "tls",
    "ca",
    "cert",
    "key",
    "user",
    "password",
];

/// The default ZooKeeper client port.
pub const DEFAULT_PORT: u16 = 2181;

/// The root path used when the URL names none.
pub const DEFAULT_ROOT: &str = "/distlock";

/// Everything a `zk://` URL says; build one with [`ZkConfig::parse`] or [`ZkConfig::new`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use distlock_zookeeper::ZkConfig;
///
/// let cfg = ZkConfig::parse("zk://app:s3cret@10.0.0.1,10.0.0.2:2182/billing/locks?session_timeout=6s").unwrap();
/// assert_eq!(cfg.hosts, ["10.0.0.1:2181", "10.0.0.2:2182"]);
/// assert_eq!(cfg.root, "/billing/locks");
/// assert_eq!(cfg.user.as_deref(), Some("app"));
/// assert_eq!(cfg.session_timeout, Duration::from_secs(6));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ZkConfig {
    /// The ensemble's servers as `host:port`; the client picks one and moves to another
    /// when it fails, keeping its session.
    pub hosts: Vec<String>,
    /// The path under which every lock's node lives (`/distlock` by default): the chroot.
    /// Created (with its parents) on first use.
    pub root: String,
    /// User name for ZooKeeper's `digest` authentication. The nodes the driver creates are
    /// then readable and writable by that user alone (`creator_all`).
    pub user: Option<String>,
    /// Its password: kept as a secret that cannot be printed (`Debug` shows `[REDACTED]`).
    pub password: Option<SecretString>,
    /// The session timeout asked of the servers (they clamp it between 2 and 20 ticks by
    /// default). The session is every hold's lease: a hold's TTL is at most this.
    pub session_timeout: Duration,
    /// How long one operation may take before it fails with [`LockError::Unavailable`].
    pub timeout: Duration,
    /// How long opening a session may take.
    pub connect_timeout: Duration,
    /// How long a connection may stay silent before the client drops it and moves to
    /// another server, keeping the session; `None`: the client library's default, two
    /// fifths of the session timeout. A longer one rides out slower answers but leaves less
    /// of the session to find another server in.
    pub connection_timeout: Option<Duration>,
    /// Whether to speak TLS to the servers (their `secureClientPort`).
    pub tls: bool,
    /// PEM file of the CA that signed the servers' certificates (TLS only).
    pub ca: Option<String>,
    /// PEM files of a client certificate and its key, for mutual TLS.
    pub identity: Option<(String, String)>,
}

impl ZkConfig {
    /// A configuration for the given servers (`host:port`) with default options: root
    /// `/distlock`, a 10 s session, 3 s per operation.
    pub fn new<I, S>(hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ZkConfig {
            hosts: hosts.into_iter().map(Into::into).collect(),
            root: DEFAULT_ROOT.to_owned(),
            user: None,
            password: None,
            session_timeout: Duration::from_secs(10),
            timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(5),
            connection_timeout: None,
            tls: false,
            ca: None,
            identity: None,
        }
    }

    /// The same configuration under another root path (`/a/b`; a missing leading `/` is
    /// added).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a path ZooKeeper would refuse (empty segments, `.`/`..`).
    pub fn with_root(mut self, root: &str) -> Result<Self, LockError> {
        self.root = normalise_root(root)?;
        Ok(self)
    }

    /// The same configuration with another session timeout.
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// The same configuration with another silence after which a connection is dropped
    /// (see [`connection_timeout`](Self::connection_timeout)).
    pub fn with_connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = Some(timeout);
        self
    }

    /// The same configuration with another time limit per operation.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Parses a `zk://` or `zks://` URL:
    ///
    /// ```text
    /// zk://[user[:password]@]host[:port][,host[:port]...][/root/path][?option=value&...]
    /// zks://...                        (the same, with TLS)
    /// ```
    ///
    /// * hosts: names, IPv4 addresses or bracketed IPv6 addresses; the port defaults to
    ///   2181. Every host is a server of the same ensemble.
    /// * user and password: ZooKeeper `digest` authentication, percent-encoded (`%40` for
    ///   `@`, `%3A` for `:`), or as the options `user=` and `password=`.
    /// * root path: where the locks live (ZooKeeper's chroot), percent-encoded; default
    ///   `/distlock`.
    /// * options: `session_timeout=DURATION` (default `10s`), `timeout=DURATION` (one
    ///   operation, default `3s`), `connect_timeout=DURATION` (opening a session, default
    ///   `5s`), `connection_timeout=DURATION` (a silent connection's end, default two fifths
    ///   of the session timeout), `tls=true|false`,
    ///   `ca=PATH` (PEM), `cert=PATH` and `key=PATH` (client certificate, both or neither).
    ///   Durations take a unit: `500ms`, `2s`, `1m`.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the part of the URL that is wrong.
    pub fn parse(url: &str) -> Result<Self, LockError> {
        let url = StoreUrl::parse(url)?;
        let tls = match url.scheme() {
            "zk" | "zookeeper" => false,
            "zks" => true,
            other => {
                return Err(LockError::config(format!(
                    "unknown scheme {other:?} for the ZooKeeper driver: use zk:// or zks://"
                )))
            }
        };
        url.check_options(KNOWN_OPTIONS, &[])?;
        let mut cfg = ZkConfig::new(Vec::<String>::new());
        cfg.tls = url.bool_option("tls")?.unwrap_or(tls);
        if url.endpoints().is_empty() {
            return Err(url.error("the ZooKeeper URL names no host (zk://host[:port],…)"));
        }
        for (i, e) in url.endpoints().iter().enumerate() {
            if i > 0 && e.credentials.is_some() {
                return Err(url.error(
                    "ZooKeeper credentials go before the first host only (one user for the ensemble)",
                ));
            }
            if e.host.is_empty() {
                return Err(url.error("the ZooKeeper URL names no host (zk://host[:port],…)"));
            }
            cfg.hosts.push(e.host_port(DEFAULT_PORT));
        }
        cfg.user = url.user()?;
        cfg.password = url.password()?;
        if cfg.password.is_some() != cfg.user.is_some() {
            return Err(url.error(
                "ZooKeeper digest authentication needs a user and a password (zk://user:password@host)",
            ));
        }
        let path = url.decoded_path()?;
        if !path.is_empty() && path != "/" {
            cfg.root = normalise_root(&path)?;
        }
        for (name, slot) in [
            ("session_timeout", &mut cfg.session_timeout),
            ("timeout", &mut cfg.timeout),
            ("connect_timeout", &mut cfg.connect_timeout),
        ] {
            if let Some(t) = url.duration_option(name)? {
                if t.is_zero() {
                    return Err(
                        url.error(format!("the ZooKeeper option {name} must be above zero"))
                    );
                }
                *slot = t;
            }
        }
        if let Some(t) = url.duration_option("connection_timeout")? {
            if t.is_zero() || t >= cfg.session_timeout {
                return Err(url.error(
                    "the ZooKeeper option connection_timeout must be above zero and below the session timeout",
                ));
            }
            cfg.connection_timeout = Some(t);
        }
        cfg.ca = url.str_option("ca")?.map(str::to_owned);
        match (url.str_option("cert")?, url.str_option("key")?) {
            (Some(c), Some(k)) => cfg.identity = Some((c.to_owned(), k.to_owned())),
            (None, None) => {}
            _ => return Err(url.error("the ZooKeeper URL options cert= and key= go together")),
        }
        if url.fragment().is_some() {
            return Err(url.error("a ZooKeeper URL has no #fragment"));
        }
        if !cfg.tls && (cfg.ca.is_some() || cfg.identity.is_some()) {
            return Err(url.error("ca=, cert= and key= need TLS: use zks:// or tls=true"));
        }
        Ok(cfg)
    }

    /// The servers as ZooKeeper's connect string (`h1:2181,h2:2181`), to name them in
    /// errors; never with credentials.
    pub fn place(&self) -> String {
        self.hosts.join(",")
    }
}

/// `root` as an absolute ZooKeeper path without a trailing `/`.
fn normalise_root(root: &str) -> Result<String, LockError> {
    let trimmed = root.trim_matches('/');
    if trimmed.is_empty() {
        return Err(LockError::config(
            "the ZooKeeper root path must name a node below / (e.g. /distlock)",
        ));
    }
    for segment in trimmed.split('/') {
        let bad = segment.is_empty()
            || segment == "."
            || segment == ".."
            || segment.chars().any(|c| c.is_control())
            || (segment == "zookeeper" && !trimmed.contains('/'));
        if bad {
            return Err(LockError::config(format!(
                "the ZooKeeper root path {root:?} has a segment ZooKeeper refuses: {segment:?}"
            )));
        }
    }
    Ok(format!("/{trimmed}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_root_and_options() {
        let cfg = ZkConfig::parse("zk://h1,h2:2182,[::1]:2183/a/b?timeout=2s").unwrap();
        assert_eq!(cfg.hosts, ["h1:2181", "h2:2182", "[::1]:2183"]);
        assert_eq!(cfg.root, "/a/b");
        assert_eq!(cfg.timeout, Duration::from_secs(2));
        assert!(!cfg.tls);
        assert_eq!(ZkConfig::parse("zk://h1").unwrap().root, DEFAULT_ROOT);
        assert!(ZkConfig::parse("zks://h1?ca=/etc/ca.pem").unwrap().tls);
    }

    #[test]
    fn refuses_what_cannot_work() {
        for bad in [
            "zk://",
            "redis://h1",
            "zk://h1?bogus=1",
            "zk://h1?ca=/x.pem",
            "zk://user@h1",
            "zk://h1?timeout=0s",
            "zk://h1/a//b",
            "zk://h1/zookeeper",
            "zks://h1?cert=/c.pem",
        ] {
            assert!(ZkConfig::parse(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn never_shows_the_password() {
        let cfg = ZkConfig::parse("zk://app:s3cret@h1").unwrap();
        assert!(!format!("{cfg:?}").contains("s3cret"));
        let password = cfg.password.unwrap();
        assert_eq!(
            lockcore::store_url::ExposeSecret::expose_secret(&password),
            "s3cret"
        );
    }
}
