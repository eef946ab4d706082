//! The `etcd://` URL: a host list the driver parses itself (the `url` crate rejects
//! comma-separated hosts), credentials, TLS and tuning options.

use std::time::Duration;

use lockcore::store_url::{SecretString, StoreUrl};
use lockcore::LockError;

/// The options an `etcd://` URL takes.
const KNOWN_OPTIONS: &[&str] = &[
    "namespace",
    "tls",
    "ca",
    "cert",
    "key",
    "domain",
    "timeout",
    "connect_timeout",
    "user",
    "password",
];

/// The default etcd client port.
pub const DEFAULT_PORT: u16 = 2379;

/// The namespace used when the URL names none.
pub const DEFAULT_NAMESPACE: &str = "distlock/";

/// Everything an `etcd://` URL says; build one with [`EtcdConfig::parse`] or by hand.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use distlock_etcd::EtcdConfig;
///
/// let cfg = EtcdConfig::parse("etcd://app:s3cret@10.0.0.1,10.0.0.2:2479/billing?timeout=2s").unwrap();
/// assert_eq!(cfg.endpoints, ["http://10.0.0.1:2379", "http://10.0.0.2:2479"]);
/// assert_eq!(cfg.namespace, "billing/");
/// assert_eq!(cfg.user.as_deref(), Some("app"));
/// assert_eq!(cfg.timeout, Duration::from_secs(2));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// Endpoint URLs (`http://host:port` or `https://host:port`), tried in order and
    /// rotated through when one fails.
    pub endpoints: Vec<String>,
    /// The prefix of every key the driver writes; always ends with `/`. Two namespaces
    /// must not nest (`a/` and `a/b/`).
    pub namespace: String,
    /// User name for etcd authentication.
    pub user: Option<String>,
    /// Password for etcd authentication: kept as a secret that cannot be printed (`Debug`
    /// shows `[REDACTED]`).
    pub password: Option<SecretString>,
    /// Whether to speak TLS to the endpoints.
    pub tls: bool,
    /// PEM file of the CA that signed the servers' certificates (TLS only).
    pub ca: Option<String>,
    /// PEM files of a client certificate and its key, for mutual TLS.
    pub identity: Option<(String, String)>,
    /// The server name to verify in the servers' certificates (TLS only).
    pub domain: Option<String>,
    /// How long one operation may take, retries on other endpoints included, before it
    /// fails with [`LockError::Unavailable`]. Long enough to ride out a leader election
    /// (about 1–2 s with etcd's defaults).
    pub timeout: Duration,
    /// How long connecting to one endpoint may take.
    pub connect_timeout: Duration,
}

impl EtcdConfig {
    /// A configuration for the given endpoints (`host:port`, or full `http(s)://` URLs)
    /// with default options.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdConfig {
            endpoints: endpoints
                .into_iter()
                .map(|e| {
                    let e = e.into();
                    if e.contains("://") {
                        e
                    } else {
                        format!("http://{e}")
                    }
                })
                .collect(),
            namespace: DEFAULT_NAMESPACE.to_owned(),
            user: None,
            password: None,
            tls: false,
            ca: None,
            identity: None,
            domain: None,
            timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(1),
        }
    }

    /// Parses an `etcd://` or `etcds://` URL:
    ///
    /// ```text
    /// etcd://[user[:password]@]host[:port][,host[:port]...][/namespace][?option=value&...]
    /// etcds://...                      (the same, with TLS)
    /// ```
    ///
    /// * hosts: names, IPv4 addresses or bracketed IPv6 addresses (`[::1]:2379`); the port
    ///   defaults to 2379. Every host is an endpoint of the same cluster.
    /// * user and password: percent-encoded (`%40` for `@`, `%3A` for `:`, `%2C` for `,`),
    ///   or as the options `user=` and `password=`. The password is kept as a
    ///   [`SecretString`] and never shown.
    /// * namespace: the path, percent-encoded; default `distlock/`. A trailing `/` is
    ///   added. Also settable as `?namespace=`.
    /// * options: `tls=true|false`, `ca=PATH` (PEM), `cert=PATH` and `key=PATH` (client
    ///   certificate, both or neither), `domain=NAME` (server name to verify),
    ///   `timeout=DURATION`, `connect_timeout=DURATION` (durations with a unit: `500ms`,
    ///   `2s`, `1m`; a bare number is refused).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the part of the URL that is wrong.
    pub fn parse(url: &str) -> Result<Self, LockError> {
        let url = StoreUrl::parse(url)?;
        let tls = match url.scheme() {
            "etcd" => false,
            "etcds" => true,
            other => {
                return Err(LockError::config(format!(
                    "unknown scheme {other:?} for the etcd driver: use etcd:// or etcds://"
                )))
            }
        };
        url.check_options(KNOWN_OPTIONS, &[])?;
        let mut cfg = EtcdConfig::new(Vec::<String>::new());
        cfg.tls = url.bool_option("tls")?.unwrap_or(tls);
        if url.endpoints().is_empty() {
            return Err(url.error("the etcd URL names no host (etcd://host[:port],…)"));
        }
        for (i, e) in url.endpoints().iter().enumerate() {
            if i > 0 && e.credentials.is_some() {
                return Err(url.error(
                    "etcd credentials go before the first host only (one user for the cluster)",
                ));
            }
            if e.host.is_empty() {
                return Err(url.error("the etcd URL names no host (etcd://host[:port],…)"));
            }
            cfg.endpoints.push(e.host_port(DEFAULT_PORT));
        }
        cfg.user = url.user()?;
        cfg.password = url.password()?;
        if cfg.password.is_some() && cfg.user.is_none() {
            return Err(url.error("an etcd password needs a user name (etcd://user:password@host)"));
        }
        let path = url.decoded_path()?;
        if !path.is_empty() {
            cfg.namespace = path;
        }
        if let Some(ns) = url.str_option("namespace")? {
            cfg.namespace = ns.to_owned();
        }
        cfg.ca = url.str_option("ca")?.map(str::to_owned);
        cfg.domain = url.str_option("domain")?.map(str::to_owned);
        if let Some(t) = url.duration_option("timeout")? {
            cfg.timeout = t;
        }
        if let Some(t) = url.duration_option("connect_timeout")? {
            cfg.connect_timeout = t;
        }
        match (url.str_option("cert")?, url.str_option("key")?) {
            (Some(c), Some(k)) => cfg.identity = Some((c.to_owned(), k.to_owned())),
            (None, None) => {}
            _ => {
                return Err(LockError::config(
                    "the etcd URL options cert= and key= go together",
                ))
            }
        }
        if url.fragment().is_some() {
            return Err(url.error("an etcd URL has no #fragment"));
        }
        if !cfg.tls && (cfg.ca.is_some() || cfg.identity.is_some() || cfg.domain.is_some()) {
            return Err(LockError::config(
                "ca=, cert=, key= and domain= need TLS: use etcds:// or tls=true",
            ));
        }
        let scheme = if cfg.tls { "https" } else { "http" };
        for e in &mut cfg.endpoints {
            *e = format!("{scheme}://{e}");
        }
        cfg.namespace = normalise_namespace(&cfg.namespace)?;
        if cfg.timeout.is_zero() || cfg.connect_timeout.is_zero() {
            return Err(LockError::config("etcd timeouts must be above zero"));
        }
        Ok(cfg)
    }

    /// Sets the namespace (a trailing `/` is added).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for an empty namespace or one with control characters.
    pub fn with_namespace(mut self, namespace: &str) -> Result<Self, LockError> {
        self.namespace = normalise_namespace(namespace)?;
        Ok(self)
    }

    /// Sets the per-operation [`timeout`](Self::timeout).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

fn normalise_namespace(ns: &str) -> Result<String, LockError> {
    if ns.is_empty() || ns == "/" {
        return Err(LockError::config("the etcd namespace must not be empty"));
    }
    if ns.chars().any(char::is_control) {
        return Err(LockError::config(
            "the etcd namespace must not contain control characters",
        ));
    }
    Ok(if ns.ends_with('/') {
        ns.to_owned()
    } else {
        format!("{ns}/")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::store_url::ExposeSecret;

    #[test]
    fn host_lists() {
        let c = EtcdConfig::parse("etcd://127.0.0.1:2379,127.0.0.1:22379,[::1],etcd-3").unwrap();
        assert_eq!(
            c.endpoints,
            [
                "http://127.0.0.1:2379",
                "http://127.0.0.1:22379",
                "http://[::1]:2379",
                "http://etcd-3:2379"
            ]
        );
        assert_eq!(c.namespace, "distlock/");
        assert!(!c.tls);
    }

    #[test]
    fn credentials_tls_and_options() {
        let c = EtcdConfig::parse(
            "etcds://ops%40corp:p%3Ass@h1:1,h2:2/app%2Flocks?ca=/etc/ca.pem&cert=/c.pem&key=/k.pem&domain=etcd.local&timeout=750ms&connect_timeout=2s",
        )
        .unwrap();
        assert_eq!(c.user.as_deref(), Some("ops@corp"));
        assert_eq!(c.password.as_ref().map(|p| p.expose_secret()), Some("p:ss"));
        assert_eq!(c.endpoints, ["https://h1:1", "https://h2:2"]);
        assert_eq!(c.namespace, "app/locks/");
        assert_eq!(c.ca.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(c.identity, Some(("/c.pem".into(), "/k.pem".into())));
        assert_eq!(c.domain.as_deref(), Some("etcd.local"));
        assert_eq!(c.timeout, Duration::from_millis(750));
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert!(!format!("{c:?}").contains("p:ss"));
        let c = EtcdConfig::parse("etcd://h?tls=true&namespace=x").unwrap();
        assert_eq!(c.endpoints, ["https://h:2379"]);
        assert_eq!(c.namespace, "x/");
    }

    /// The one layout needs no option: a URL that still asks for fairness is told so.
    #[test]
    fn the_old_fairness_option_is_refused() {
        let err = EtcdConfig::parse("etcd://h?fair=true").unwrap_err();
        assert!(err.to_string().contains("unknown option \"fair\""), "{err}");
    }

    #[test]
    fn rejects_bad_urls() {
        for bad in [
            "redis://h",
            "etcd:/h",
            "etcd://",
            "etcd://h1,,h2",
            "etcd://h:0",
            "etcd://h:99999",
            "etcd://h:x",
            "etcd://[::1",
            "etcd://h?bogus=1",
            "etcd://h?ca=/x",
            "etcds://h?cert=/x",
            "etcd://h?timeout=soon",
            "etcd://h?timeout=0",
            "etcd://@h",
            "etcd://u:%zz@h",
            "etcd://h?timeout=500",
            "etcd://h1,u:p@h2",
            "etcd://:p@h",
        ] {
            assert!(
                matches!(EtcdConfig::parse(bad), Err(LockError::Config { .. })),
                "{bad}"
            );
        }
        let err = EtcdConfig::parse("etcd://u:secret@h:x")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("secret"), "{err}");
        let err = EtcdConfig::parse("etcd://h?timeout=5")
            .unwrap_err()
            .to_string();
        assert!(err.contains("write 500ms or 5s"), "{err}");
        for url in [
            "etcd://u:secret@h?bogus=1",
            "etcd://h?password=secret&tls=maybe",
        ] {
            let err = EtcdConfig::parse(url).unwrap_err().to_string();
            assert!(!err.contains("secret"), "{err}");
        }
    }
}
