//! The `etcd://` URL: a host list the driver parses itself (the `url` crate rejects
//! comma-separated hosts), credentials, TLS and tuning options.

use std::time::Duration;

use lockcore::LockError;

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
/// use driver_etcd::EtcdConfig;
///
/// let cfg = EtcdConfig::parse("etcd://app:s3cret@10.0.0.1,10.0.0.2:2479/billing?timeout=2s").unwrap();
/// assert_eq!(cfg.endpoints, ["http://10.0.0.1:2379", "http://10.0.0.2:2479"]);
/// assert_eq!(cfg.namespace, "billing/");
/// assert_eq!(cfg.user.as_deref(), Some("app"));
/// assert_eq!(cfg.timeout, Duration::from_secs(2));
/// ```
#[derive(Clone, PartialEq, Eq)]
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
    /// Password for etcd authentication (never logged).
    pub password: Option<String>,
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
    /// FIFO fairness: waiters queue in etcd (a key of their own under the lock's prefix)
    /// and are served in the order they queued. A property of the namespace: every client
    /// of one namespace must agree on it (see [`EtcdBackend`](crate::EtcdBackend)).
    pub fair: bool,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("namespace", &self.namespace)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("ca", &self.ca)
            .field("identity", &self.identity)
            .field("domain", &self.domain)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("fair", &self.fair)
            .finish()
    }
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
            fair: false,
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
    /// * user and password: percent-encoded (`%40` for `@`, `%3A` for `:`).
    /// * namespace: the path, percent-encoded; default `distlock/`. A trailing `/` is
    ///   added. Also settable as `?namespace=`.
    /// * options: `tls=true|false`, `ca=PATH` (PEM), `cert=PATH` and `key=PATH` (client
    ///   certificate, both or neither), `domain=NAME` (server name to verify),
    ///   `timeout=DURATION`, `connect_timeout=DURATION` (durations as `500ms`, `2s`, or a
    ///   number of milliseconds), `fair=true|false` (FIFO fairness, see
    ///   [`fair`](Self::fair); every client of a namespace must agree).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the part of the URL that is wrong.
    pub fn parse(url: &str) -> Result<Self, LockError> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            LockError::config(format!(
                "not an etcd URL (etcd://host:port): {}",
                redact(url)
            ))
        })?;
        let tls = match scheme {
            "etcd" => false,
            "etcds" => true,
            other => {
                return Err(LockError::config(format!(
                    "unknown scheme {other:?} for the etcd driver: use etcd:// or etcds://"
                )))
            }
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let mut cfg = EtcdConfig::new(Vec::<String>::new());
        cfg.tls = tls;
        if let Some(userinfo) = userinfo {
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            let user = percent_decode(user, "user name")?;
            if user.is_empty() {
                return Err(LockError::config(
                    "the etcd URL has an empty user name before '@'",
                ));
            }
            cfg.user = Some(user);
            cfg.password = password
                .map(|p| percent_decode(p, "password"))
                .transpose()?;
        }
        for host in hosts.split(',') {
            cfg.endpoints.push(parse_host(host)?);
        }
        if !path.is_empty() {
            cfg.namespace = percent_decode(path, "namespace")?;
        }
        let mut cert = None;
        let mut key = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value, name)?;
            match name {
                "namespace" => cfg.namespace = value,
                "tls" => cfg.tls = parse_bool(name, &value)?,
                "ca" => cfg.ca = Some(value),
                "cert" => cert = Some(value),
                "key" => key = Some(value),
                "domain" => cfg.domain = Some(value),
                "timeout" => cfg.timeout = parse_duration(name, &value)?,
                "connect_timeout" => cfg.connect_timeout = parse_duration(name, &value)?,
                "fair" => cfg.fair = parse_bool(name, &value)?,
                other => {
                    return Err(LockError::config(format!(
                        "unknown etcd URL option {other:?} (known: namespace, tls, ca, cert, key, domain, timeout, connect_timeout, fair)"
                    )))
                }
            }
        }
        match (cert, key) {
            (Some(c), Some(k)) => cfg.identity = Some((c, k)),
            (None, None) => {}
            _ => {
                return Err(LockError::config(
                    "the etcd URL options cert= and key= go together",
                ))
            }
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

    /// Turns FIFO fairness on or off (the URL's `fair=`): with it, waiters queue in etcd
    /// and are served in arrival order. Every client of one namespace must use the same
    /// setting; a backend whose setting differs from the namespace's fails with
    /// [`LockError::Config`].
    ///
    /// # Examples
    ///
    /// ```
    /// use driver_etcd::EtcdConfig;
    ///
    /// let cfg = EtcdConfig::new(["127.0.0.1:2379"]).with_fair(true);
    /// assert!(cfg.fair);
    /// assert_eq!(cfg, EtcdConfig::parse("etcd://127.0.0.1:2379?fair=true").unwrap());
    /// ```
    pub fn with_fair(mut self, fair: bool) -> Self {
        self.fair = fair;
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

/// `host`, `host:port`, `[v6]`, `[v6]:port` → `host:port` (scheme added later).
fn parse_host(host: &str) -> Result<String, LockError> {
    if host.is_empty() {
        return Err(LockError::config(
            "the etcd URL has an empty host (check the commas)",
        ));
    }
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (v6, after) = rest
            .split_once(']')
            .ok_or_else(|| LockError::config(format!("unclosed '[' in etcd host {host:?}")))?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| {
                LockError::config(format!("expected ':port' after ']' in etcd host {host:?}"))
            })?),
        };
        (format!("[{v6}]"), port)
    } else {
        match host.rsplit_once(':') {
            Some((n, p)) => (n.to_owned(), Some(p)),
            None => (host.to_owned(), None),
        }
    };
    if name.is_empty() || name.contains(['/', '@', '?', '#', ' ']) {
        return Err(LockError::config(format!("bad etcd host {host:?}")));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| LockError::config(format!("bad port in etcd host {host:?}")))?,
    };
    Ok(format!("{name}:{port}"))
}

fn parse_bool(name: &str, value: &str) -> Result<bool, LockError> {
    match value {
        "true" | "1" | "yes" | "on" | "" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(LockError::config(format!(
            "etcd URL option {name}={value:?}: expected true or false"
        ))),
    }
}

fn parse_duration(name: &str, value: &str) -> Result<Duration, LockError> {
    let bad = || {
        LockError::config(format!(
            "etcd URL option {name}={value:?}: expected e.g. 500ms or 2s"
        ))
    };
    let (digits, unit) = match value.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&value[..i], &value[i..]),
        None => (value, "ms"),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        _ => Err(bad()),
    }
}

fn percent_decode(s: &str, what: &str) -> Result<String, LockError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    LockError::config(format!("bad percent-encoding in the etcd URL's {what}"))
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| LockError::config(format!("the etcd URL's {what} is not UTF-8")))
}

/// The URL with any password replaced, for error messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.split_once(':') {
                Some((u, _)) => format!("{}{u}:<redacted>{}", &url[..s + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(c.password.as_deref(), Some("p:ss"));
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
        assert!(!c.fair, "FIFO fairness is opt-in");
    }

    #[test]
    fn fairness_option() {
        for (url, fair) in [
            ("etcd://h?fair=true", true),
            ("etcd://h/ns?timeout=2s&fair=1", true),
            ("etcd://h?fair", true),
            ("etcd://h?fair=false", false),
            ("etcd://h", false),
        ] {
            assert_eq!(EtcdConfig::parse(url).unwrap().fair, fair, "{url}");
        }
        assert!(matches!(
            EtcdConfig::parse("etcd://h?fair=maybe"),
            Err(LockError::Config { .. })
        ));
        assert!(EtcdConfig::new(["h"]).with_fair(true).fair);
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
        assert!(!redact("etcd://u:secret@h").contains("secret"));
    }
}
