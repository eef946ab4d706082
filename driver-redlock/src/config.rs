//! The builder: the instances' URLs (one each, or a `redlock://` URL, parsed here), the key
//! prefix, the timeouts, fencing and TLS; and `build`, which connects to every instance in
//! parallel.

use std::sync::Arc;
use std::time::Duration;

use driver_redis::__redlock as support;
use lockcore::driver::ReleaseNotifier;
use lockcore::store_url::{Credentials, StoreUrl};
use lockcore::LockError;
use tokio::sync::OnceCell;

use crate::announcements::{release_filter, Announcements, Nonces};
use crate::backend::RedlockBackend;
use crate::quorum::majority;
use crate::rounds::Failures;
use crate::store::{label, Inner, Instance, TlsFiles, NAME};

/// The key prefix used unless the builder sets another (the same as driver-redis's).
pub const DEFAULT_PREFIX: &str = driver_redis::DEFAULT_PREFIX;

/// How long connecting to one instance may take unless the builder sets another bound.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

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

    pub(crate) fn builder_for(urls: Vec<Result<StoreUrl, LockError>>) -> RedlockBackendBuilder {
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
        parse(url)
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
    /// [`default_instance_timeout`](crate::default_instance_timeout), and
    /// [`DEFAULT_UNTIMED_INSTANCE_TIMEOUT`](crate::DEFAULT_UNTIMED_INSTANCE_TIMEOUT) for
    /// requests without a TTL). Keep it far below the TTLs you use: an acquisition spends up
    /// to one timeout per round of its validity.
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
        self.tls.get_or_insert_with(TlsFiles::default).root = Some(pem.into());
        self
    }

    /// For `rediss://` instances: authenticate with this client certificate and key (PEM).
    pub fn tls_client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.get_or_insert_with(TlsFiles::default).client =
            Some((certificate_pem.into(), key_pem.into()));
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
        let quorum = majority(self.urls.len());
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
            nonces: Nonces::new(nonce_base),
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

// The `redlock://` URL: a host list the `url` crate cannot parse, so we parse it here.
//
// ```text
// redlock://[user[:password]@]host[:port][,[user[:password]@]host[:port]…][/db][?option=value&…]
// redlocks://…                      (every instance over TLS, like rediss://)
// ```
//
// Credentials on the first entry apply to every entry that carries none of its own; an
// entry with its own credentials uses those. The password may also be given as
// `?password=…` (for every instance without credentials of its own). Passwords are
// percent-decoded once, here, and kept as secrets from then on. The port defaults to
// 6379. Options (the grammar of [`lockcore::store_url`]): `prefix`, `timeout` (the
// per-instance timeout, e.g. `50ms`, `1s`), `connect_timeout`, `tls` (boolean),
// `fencing` (boolean), `user`, `password`.

/// The options a `redlock://` URL takes.
const KNOWN_OPTIONS: &[&str] = &[
    "prefix",
    "timeout",
    "connect_timeout",
    "tls",
    "fencing",
    "user",
    "password",
];

const SYNTAX: &str =
    "expected redlock://[user:password@]host:port,host:port,host:port[/db][?prefix=…&timeout=…]";

fn bad(what: impl std::fmt::Display) -> LockError {
    LockError::config(format!("malformed redlock URL: {what}; {SYNTAX}"))
}

/// Parses a `redlock://` or `redlocks://` URL into a builder with its options. Errors never
/// echo a password.
fn parse(url: &str) -> Result<RedlockBackendBuilder, LockError> {
    let url = StoreUrl::parse(url)?;
    let mut tls = match url.scheme() {
        "redlock" => false,
        "redlocks" => true,
        other => {
            return Err(bad(format_args!(
                "the scheme must be redlock:// or redlocks://, not {other:?}"
            )))
        }
    };
    url.check_options(KNOWN_OPTIONS, &[])?;
    if url.fragment().is_some() {
        return Err(bad("a fragment (#…) is not allowed"));
    }
    let db = url.decoded_path()?;
    if !db.is_empty() && (!db.bytes().all(|b| b.is_ascii_digit()) || db.parse::<u32>().is_err()) {
        return Err(bad("the database (the path) is not a number"));
    }
    if let Some(t) = url.bool_option("tls")? {
        tls = t;
    }
    let duration = |key: &str| -> Result<Option<Duration>, LockError> {
        match url.duration_option(key)? {
            Some(d) if d.is_zero() || d > Duration::from_secs(3600) => Err(bad(format_args!(
                "{key} must be above zero and at most an hour"
            ))),
            other => Ok(other),
        }
    };
    let (prefix, fencing) = (url.str_option("prefix")?, url.bool_option("fencing")?);
    let (instance_timeout, connect_timeout) = (duration("timeout")?, duration("connect_timeout")?);
    if url.endpoints().is_empty() {
        return Err(bad("no instances"));
    }
    // Credentials for the instances without their own: the first instance's, else the
    // `user`/`password` options.
    let first = url.endpoints()[0].credentials.clone();
    let (user, password) = (url.str_option("user")?, url.secret_option("password")?);
    let from_options = (user.is_some() || password.is_some()).then(|| Credentials {
        user: user.unwrap_or_default().to_owned(),
        password,
    });
    if first.is_some() && from_options.is_some() {
        return Err(bad(
            "credentials are given both before '@' and as ?user=/?password=; keep one",
        ));
    }
    let default_credentials = first.or(from_options);
    let scheme = if tls { "rediss" } else { "redis" };
    let path = if db.is_empty() {
        "/".to_owned()
    } else {
        format!("/{db}")
    };
    let mut instances = Vec::new();
    for (i, endpoint) in url.endpoints().iter().enumerate() {
        if endpoint.host.is_empty() {
            return Err(bad(format_args!("instance {} names no host", i + 1)));
        }
        let mut endpoint = endpoint.clone();
        if endpoint.credentials.is_none() {
            endpoint.credentials = default_credentials.clone();
        }
        endpoint.port = Some(endpoint.port.unwrap_or(6379));
        instances.push(Ok(StoreUrl::for_endpoint(scheme, endpoint, &path)));
    }
    let mut builder = RedlockBackend::builder_for(instances);
    if let Some(prefix) = prefix {
        builder.prefix = prefix.to_owned();
    }
    builder.instance_timeout = instance_timeout;
    builder.connect_timeout = connect_timeout.unwrap_or(builder.connect_timeout);
    builder.fencing = fencing.unwrap_or(builder.fencing);
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use super::*;

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

#[cfg(test)]
mod url_tests {
    use super::*;
    use lockcore::store_url::ExposeSecret;

    fn shown(p: &RedlockBackendBuilder) -> Vec<String> {
        p.urls
            .iter()
            .map(|i| i.as_ref().unwrap().to_string())
            .collect()
    }

    fn passwords(p: &RedlockBackendBuilder) -> Vec<Option<String>> {
        p.urls
            .iter()
            .map(|i| {
                let password = i.as_ref().unwrap().password().unwrap();
                password.map(|s| s.expose_secret().to_owned())
            })
            .collect()
    }

    #[test]
    fn host_lists_parse() {
        let p = parse("redlock://127.0.0.1:7001,127.0.0.1:7002,localhost").unwrap();
        assert_eq!(
            shown(&p),
            [
                "redis://127.0.0.1:7001/",
                "redis://127.0.0.1:7002/",
                "redis://localhost:6379/"
            ]
        );
        let p = parse(
            "redlock://u:p%40ss@h1:1,h2:2,x:y@h3:3/4?prefix=app%3A&timeout=50ms&fencing=false",
        )
        .unwrap();
        assert_eq!(
            shown(&p),
            [
                "redis://u:***@h1:1/4",
                "redis://u:***@h2:2/4",
                "redis://x:***@h3:3/4"
            ]
        );
        assert_eq!(
            passwords(&p),
            [Some("p@ss".into()), Some("p@ss".into()), Some("y".into())]
        );
        assert_eq!(p.prefix, "app:");
        assert_eq!(p.instance_timeout, Some(Duration::from_millis(50)));
        assert!(!p.fencing);
        let p = parse("redlocks://[::1]:7000,h:7001?connect_timeout=1.5s").unwrap();
        assert_eq!(shown(&p), ["rediss://[::1]:7000/", "rediss://h:7001/"]);
        assert_eq!(p.connect_timeout, Duration::from_millis(1500));
        let p = parse("redlock://h1,h2,h3?tls=true").unwrap();
        assert!(shown(&p).iter().all(|i| i.starts_with("rediss://")));
        let p = parse("redlock://h1,h2?password=lock&prefix=lock:").unwrap();
        assert_eq!(
            shown(&p),
            ["redis://:***@h1:6379/", "redis://:***@h2:6379/"]
        );
        assert_eq!(passwords(&p), [Some("lock".into()), Some("lock".into())]);
    }

    #[test]
    fn malformed_urls_are_config_errors() {
        for url in [
            "",
            "redis://h:1",
            "redlock://",
            "redlock://h1,,h2",
            "redlock://h1,h2:",
            "redlock://h1:notaport",
            "redlock://h1:70000",
            "redlock://h1/notadb",
            "redlock://h1?timeout=5",
            "redlock://h1?timeout=2h",
            "redlock://u:p@h1?password=q",
            "redlock://h1?timeout=-1s",
            "redlock://h1?bogus=1",
            "redlock://h1?tls=maybe",
            "redlock://h1#frag",
            "redlock://[::1,h2",
            "redlock://h 1",
            "redlock://@h1",
        ] {
            match parse(url) {
                Err(LockError::Config { .. }) => {}
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn errors_never_show_passwords() {
        for url in [
            "redlock://u:s3cret@h1:notaport",
            "redlock://u:s3cret@h1,h2?bogus=1",
            "redlock://u:s3cret@h1/x",
        ] {
            let e = parse(url).unwrap_err().to_string();
            assert!(!e.contains("s3cret"), "{e}");
        }
        let p = parse("redlock://u:s3cret@h1").unwrap();
        assert!(!format!("{p:?}").contains("s3cret"));
        let e = parse("redlock://h1?timeout=5").unwrap_err().to_string();
        assert!(e.contains("write 500ms or 5s"), "{e}");
    }
}
