//! distlock: distributed locks with fencing tokens, a renewal watchdog, a lost-lock signal
//! and cancellation-safe acquisition, over pluggable backends.
//!
//! This facade re-exports the contract ([`lockcore`]) and the drivers compiled in by Cargo
//! features, and picks a backend from a URL with [`connect`].
//!
//! | feature  | URL schemes | backend |
//! |----------|-------------|---------|
//! | `memory` (default) | `memory:`, `memory:NAME` | in-process reference store |
//! | `sqlite` | `sqlite:PATH` | a SQLite file (created when missing), shared by processes |
//! | `redis` | `redis://`, `rediss://` | one Redis server |
//! | `redis` | `redis+cluster://h1:6379,h2:6379,h3:6379`, `rediss+cluster://…` | a Redis Cluster |
//! | `redis` | `redis+sentinel://s1:26379,s2:26379/mymaster`, `rediss+sentinel://…` | the master Redis Sentinel names |
//! | `redlock` | `redlock://h1:6379,h2:6379,h3:6379`, `redlocks://…` | Redlock over N independent Redis masters |
//! | `postgres` | `postgres://`, `postgresql://` | PostgreSQL |
//! | `mysql` | `mysql://`, `mariadb://` | MySQL / MariaDB |
//! | `etcd` | `etcd://h1:2379,h2:2379` | an etcd cluster |
//! | `zookeeper` | `zk://h1:2181,h2:2181,h3:2181/chroot`, `zks://…` (with `zookeeper-tls`) | a ZooKeeper ensemble |
//! | `cli` | | the `distlock` command (turns on `sqlite`, its default store) |
//! | `blocking` | | [`blocking`]: the same locks for code without an async runtime |
//!
//! # Examples
//!
//! ```
//! # #[tokio::main] async fn main() -> Result<(), distlock::LockError> {
//! use std::time::Duration;
//!
//! let locks = distlock::connect("memory:").await?;
//! let guard = locks.lock("invoice:42").ttl(Duration::from_secs(30)).wait(Duration::from_secs(5)).acquire().await?;
//! // pass guard.token() with every write the lock protects
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
// On docs.rs (`--cfg docsrs`, see Cargo.toml) every item shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::sync::Arc;

use lockcore::store_url::StoreUrl;

pub use lockcore;

#[cfg(feature = "blocking")]
pub mod blocking;
pub use lockcore::{
    Claim, ClaimMode, ErrorChain, FencedResource, FencingToken, Lease, LockBackend, LockClient,
    LockClientBuilder, LockError, LockGuard, LockHandle, LockInfo, LockKey, LockRequest,
    MultiLockGuard, MultiLockRequest, Owner, ReleaseOutcome, RenewalHealth, RetryPolicy,
    StaleToken,
};

/// Leader election on one key, built on the exclusive lock.
pub use lockcore::election;

/// What a driver author needs beyond the application's API (see [`lockcore::driver`]).
pub use lockcore::driver;

#[cfg(feature = "memory")]
pub use lockcore::memory;
/// The metrics a client records (names, kinds, labels) when the `metrics` feature is on.
pub use lockcore::metrics;
/// A store that your tests steer, on tokio's clock (feature `testing`; see
/// docs/testing-your-code.md).
#[cfg(feature = "testing")]
pub use lockcore::testing;

/// The Redis driver (feature `redis`).
#[cfg(feature = "redis")]
pub use driver_redis as redis;

/// The Redlock driver: N independent Redis masters (feature `redlock`).
#[cfg(feature = "redlock")]
pub use driver_redlock as redlock;

/// The SQL driver: PostgreSQL, MySQL/MariaDB, SQLite (features `postgres`, `mysql`, `sqlite`).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use driver_sql as sql;

/// The etcd driver (feature `etcd`).
#[cfg(feature = "etcd")]
pub use driver_etcd as etcd;

/// The ZooKeeper driver (feature `zookeeper`).
#[cfg(feature = "zookeeper")]
pub use driver_zookeeper as zookeeper;

/// Every URL scheme distlock knows, with the Cargo feature that compiles its backend in.
pub const SCHEMES: &[(&str, &str)] = &[
    ("memory", "memory"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redis+unix", "redis"),
    ("redis+cluster", "redis"),
    ("rediss+cluster", "redis"),
    ("redis+sentinel", "redis"),
    ("rediss+sentinel", "redis"),
    ("redlock", "redlock"),
    ("redlocks", "redlock"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("mysql", "mysql"),
    ("mariadb", "mysql"),
    ("sqlite", "sqlite"),
    ("etcd", "etcd"),
    ("etcds", "etcd"),
    ("zk", "zookeeper"),
    ("zks", "zookeeper"),
];

/// Connects to the store named by `url` and returns a client for it.
///
/// The scheme picks the backend: see [`SCHEMES`] and the table in the crate docs. Each
/// driver documents the rest of its URL syntax (hosts, credentials, TLS options).
///
/// # Errors
///
/// [`LockError::Config`] for a malformed URL, an unknown scheme (the message lists the
/// known ones) or a scheme whose backend was not compiled in (the message names the Cargo
/// feature to enable); otherwise whatever the driver reports while connecting (e.g.
/// [`LockError::Unavailable`] for an unreachable server).
pub async fn connect(url: &str) -> Result<LockClient, LockError> {
    Ok(LockClient::new(connect_backend(url).await?))
}

/// Like [`connect`], but returns the backend itself, for building a client with
/// [`LockClient::builder`].
///
/// # Errors
///
/// As [`connect`].
pub async fn connect_backend(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    let parsed = match StoreUrl::parse(url) {
        Ok(parsed) if SCHEMES.iter().any(|(s, _)| *s == parsed.scheme()) => parsed,
        // A known scheme with a part that is wrong (an empty port, a bad escape): the parser
        // names that part.
        Err(e) if has_known_scheme(url) => return Err(e),
        other => return Err(not_a_store_url(url, other.is_ok())),
    };
    let scheme = parsed.scheme();
    match scheme {
        #[cfg(feature = "memory")]
        "memory" => {
            parsed.check_options(&[], &[])?;
            let name = parsed.decoded_path()?;
            Ok(if name.is_empty() {
                lockcore::memory::MemoryBackend::new()
            } else {
                lockcore::memory::MemoryBackend::named(&name)
            })
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+unix" | "redis+cluster" | "rediss+cluster"
        | "redis+sentinel" | "rediss+sentinel" => {
            Ok(driver_redis::RedisBackend::builder_for(parsed)
                .build()
                .await?)
        }
        #[cfg(feature = "redlock")]
        "redlock" | "redlocks" => Ok(driver_redlock::connect(url).await?),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => driver_sql::connect(url).await,
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => driver_sql::connect(url).await,
        #[cfg(feature = "sqlite")]
        "sqlite" => driver_sql::connect(url).await,
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Ok(driver_etcd::connect(url).await?),
        #[cfg(feature = "zookeeper")]
        "zk" | "zks" => Ok(driver_zookeeper::connect(url).await?),
        other => Err(not_compiled_in(other)),
    }
}

/// The error for a URL whose `scheme`'s backend was not compiled in: the feature to
/// enable, for a program and for the command.
fn not_compiled_in(scheme: &str) -> LockError {
    let feature = SCHEMES
        .iter()
        .find(|(s, _)| *s == scheme)
        .map_or(scheme, |(_, f)| f);
    LockError::config(format!(
        "the {scheme}: backend is not compiled in: enable the `{feature}` feature of distlock \
         (for the command: `cargo install --locked distlock --features cli,{feature}`)"
    ))
}

/// Whether `url` starts with a scheme of [`SCHEMES`] (in any case) and a `:`.
fn has_known_scheme(url: &str) -> bool {
    url.split_once(':')
        .is_some_and(|(scheme, _)| SCHEMES.iter().any(|(s, _)| s.eq_ignore_ascii_case(scheme)))
}

/// The error for text that is not a URL of a known scheme: a guess at the scheme when it
/// looks like `host:port` (by the port), else the list of schemes. Never quotes `url`
/// unredacted.
fn not_a_store_url(url: &str, parsed: bool) -> LockError {
    let known = SCHEMES
        .iter()
        .map(|(s, _)| format!("{s}:"))
        .collect::<Vec<_>>()
        .join(", ");
    if let Some(guess) = lockcore::store_url::guess_missing_scheme(url) {
        return LockError::config(format!(
            "the lock store URL has no scheme: did you mean {guess}? (known schemes: {known})"
        ));
    }
    if lockcore::store_url::looks_like_host_port(url) {
        return LockError::config(format!(
            "the lock store URL has no scheme: write it as SCHEME://{}, e.g. redis://, postgres://, mysql:// or etcd:// (known schemes: {known})",
            redact(&format!("x://{url}")).trim_start_matches("x://")
        ));
    }
    if parsed {
        let scheme = url
            .split(':')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        return LockError::config(format!(
            "unknown lock store scheme {scheme:?}; known schemes: {known}"
        ));
    }
    if url.trim().is_empty() {
        return LockError::config(format!(
            "the lock store URL is empty (expected SCHEME:..., e.g. sqlite:PATH or redis://host/; known schemes: {known})"
        ));
    }
    // The URL is not quoted: whoever shows this error shows it beside the URL.
    LockError::config(format!(
        "not a lock store URL: it starts with no SCHEME: (e.g. memory:, sqlite:PATH or redis://host/; known schemes: {known})"
    ))
}

/// `url` with its password and secret options (`password`, `sslpassword`, `token`, …)
/// replaced by `***`, for messages and logs; in a URL that does not parse, everything from
/// the first `:` after `scheme://` to the last `@` is hidden as well. Redaction is by parsing ([`lockcore::store_url::redact`]), so text that merely
/// equals the password elsewhere in the URL is left alone.
///
/// # Examples
///
/// ```
/// assert_eq!(distlock::redact("redis://u:lock@lock-host/0"), "redis://u:***@lock-host/0");
/// assert_eq!(
///     distlock::redact("postgres://u@db/app?password=hunter2"),
///     "postgres://u@db/app?password=***"
/// );
/// ```
pub fn redact(url: &str) -> String {
    lockcore::store_url::redact(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheme not compiled in names the feature, and the command that installs the CLI
    /// with it.
    #[test]
    fn a_scheme_not_compiled_in_names_its_feature_and_the_install_command() {
        let text = not_compiled_in("rediss").to_string();
        assert!(
            text.contains("enable the `redis` feature of distlock")
                && text.contains("`cargo install --locked distlock --features cli,redis`"),
            "{text}"
        );
    }

    /// `zk://` and `zks://` name the `zookeeper` feature when it is not compiled in, and
    /// reach the driver when it is: a URL it refuses comes back with the driver's message.
    #[tokio::test]
    async fn zk_urls_pick_the_zookeeper_driver() {
        let text = not_compiled_in("zks").to_string();
        assert!(
            text.contains("enable the `zookeeper` feature of distlock"),
            "{text}"
        );
        let err = connect_backend("zk://h1:2181?bogus=1").await.err();
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        if cfg!(feature = "zookeeper") {
            assert!(text.contains("bogus"), "{text}");
        } else {
            assert!(text.contains("`zookeeper` feature"), "{text}");
        }
        let guess = lockcore::store_url::guess_missing_scheme("zk1.example:2181/locks");
        assert_eq!(guess.as_deref(), Some("zk://zk1.example:2181/locks"));
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://:secret@h"), "redis://:***@h");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("memory:"), "memory:");
        assert_eq!(
            redact("etcd://u:p@a:1,b:2?x=y@z"),
            "etcd://u:***@a:1,b:2?x=y@z"
        );
        assert_eq!(
            redact("postgres://u@h/db?sslpassword=lock&password=lock"),
            "postgres://u@h/db?sslpassword=***&password=***"
        );
        assert_eq!(redact("redis://u:pw@h:x"), "redis://u:***@h:x");
    }

    #[tokio::test]
    async fn forgotten_schemes_get_a_suggestion() {
        for (url, hint) in [
            ("localhost:6379", "did you mean redis://localhost:6379?"),
            ("127.0.0.1:5432", "did you mean postgres://127.0.0.1:5432?"),
            ("db.example:2379", "did you mean etcd://db.example:2379?"),
            (
                "db.example:3306/app",
                "did you mean mysql://db.example:3306/app?",
            ),
            (
                "u:s3cret@localhost:6379",
                "did you mean redis://u:***@localhost:6379?",
            ),
            ("db.example:1234", "write it as SCHEME://db.example:1234"),
        ] {
            match connect(url).await {
                Err(LockError::Config { message }) => {
                    assert!(message.contains(hint), "{url}: {message}");
                    assert!(message.contains("known schemes"), "{url}: {message}");
                    assert!(!message.contains("s3cret"), "{url}: {message}");
                }
                Err(other) => panic!("{url}: {other}"),
                Ok(_) => panic!("{url} connected"),
            }
        }
    }

    #[tokio::test]
    async fn unknown_and_missing_schemes_are_config_errors() {
        let err = connect("nope://x").await.unwrap_err().to_string();
        assert!(
            err.contains("known schemes") && err.contains("redis:"),
            "{err}"
        );
        let err = connect("no-scheme").await.unwrap_err().to_string();
        assert!(err.contains("not a lock store URL"), "{err}");
        // Shown beside the URL by whoever shows it: not quoted a second time.
        assert!(!err.contains("no-scheme"), "{err}");
        let err = connect("").await.unwrap_err().to_string();
        assert!(err.contains("the lock store URL is empty"), "{err}");
    }

    /// A known scheme whose URL has a part that is wrong is told which part, not that it is
    /// no lock store URL; its secrets are never shown.
    #[tokio::test]
    async fn malformed_urls_of_known_schemes_name_the_wrong_part() {
        for (url, says) in [
            ("redis://127.0.0.1:/", "host '127.0.0.1:' has an empty port"),
            (
                "POSTGRES://u:s3cret@h:x/db",
                "the port of host 'h:x' is not a number",
            ),
            ("redlock://a:1,,b:2", "the second host is empty"),
            ("mysql://h/db?password=%zz", "option password"),
        ] {
            match connect(url).await {
                Err(LockError::Config { message }) => {
                    assert!(message.contains(says), "{url}: {message}");
                    assert!(
                        !message.contains("not a lock store URL"),
                        "{url}: {message}"
                    );
                    assert!(!message.contains("s3cret"), "{url}: {message}");
                }
                Err(other) => panic!("{url}: {other}"),
                Ok(_) => panic!("{url} connected"),
            }
        }
    }

    /// A refused connection names the server in the error's own message, not only in its
    /// source.
    #[tokio::test]
    async fn a_refused_connection_names_the_server() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut urls = Vec::new();
        if cfg!(feature = "redis") {
            urls.push(format!("redis://127.0.0.1:{port}/"));
        }
        if cfg!(feature = "postgres") {
            urls.push(format!("postgres://u:pw@127.0.0.1:{port}/db"));
        }
        if cfg!(feature = "mysql") {
            urls.push(format!("mysql://u:pw@127.0.0.1:{port}/db"));
        }
        for url in urls {
            let err = connect(&url)
                .await
                .err()
                .unwrap_or_else(|| panic!("{url} connected"));
            assert!(
                matches!(err, LockError::Unavailable { .. }),
                "{url}: {err:?}"
            );
            let said = err.to_string();
            assert!(
                said.ends_with(&format!(" at 127.0.0.1:{port} is unavailable")),
                "{url}: {said}"
            );
            assert_eq!(err.place(), Some(format!("127.0.0.1:{port}").as_str()));
        }
    }

    /// A Redis URL naming no host says so once, not as a configuration error inside
    /// another.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn a_redis_url_without_a_host_is_one_config_error() {
        match connect("redis:6379").await {
            Err(LockError::Config { message }) => {
                assert!(message.contains("names no host"), "{message}");
                assert!(!message.contains("configuration error"), "{message}");
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("redis:6379 connected"),
        }
    }

    #[cfg(feature = "memory")]
    #[tokio::test]
    async fn memory_urls() {
        let a = connect("memory:shared-test").await.unwrap();
        let b = connect("memory://shared-test").await.unwrap();
        let fresh = connect("memory:").await.unwrap();
        let g = a.lock("k").try_acquire().await.unwrap().unwrap();
        assert!(
            b.lock("k").try_acquire().await.unwrap().is_none(),
            "named stores are shared"
        );
        assert!(
            fresh.lock("k").try_acquire().await.unwrap().is_some(),
            "memory: is a fresh store"
        );
        g.release().await.unwrap();
    }
}

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// docs/cli.md's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/cli.md")]
pub struct CliDocDoctests;

/// docs/etcd.md's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/etcd.md")]
pub struct EtcdDocDoctests;

/// docs/zookeeper.md's examples, compiled as doc tests.
#[cfg(all(doctest, feature = "zookeeper"))]
#[doc = include_str!("../docs/zookeeper.md")]
pub struct ZookeeperDocDoctests;

/// docs/redis-safety.md's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/redis-safety.md")]
pub struct RedisSafetyDocDoctests;

/// docs/redlock.md's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/redlock.md")]
pub struct RedlockDocDoctests;

/// docs/sql.md's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/sql.md")]
pub struct SqlDocDoctests;

/// docs/writing-a-driver.md's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/writing-a-driver.md")]
pub struct WritingADriverDocDoctests;

/// docs/metrics.md's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/metrics.md")]
pub struct MetricsDocDoctests;

/// docs/fencing.md's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/fencing.md")]
pub struct FencingDoctests;

/// docs/shared-claims.md's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/shared-claims.md")]
pub struct SharedClaimsDoctests;

/// docs/layout.md's blocks (text only), checked like every page.
#[cfg(doctest)]
#[doc = include_str!("../docs/layout.md")]
pub struct LayoutDocDoctests;

/// docs/testing-your-code.md's examples, compiled and run as doc tests.
#[cfg(all(doctest, feature = "testing"))]
#[doc = include_str!("../docs/testing-your-code.md")]
pub struct TestingYourCodeDoctests;

/// docs/history-checker.md's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/history-checker.md")]
pub struct HistoryCheckerDoctests;

/// docs/testing.md's blocks (shell and text only), checked like every page.
#[cfg(doctest)]
#[doc = include_str!("../docs/testing.md")]
pub struct TestingDocDoctests;

/// docs/fairness.md's blocks (shell and text only), checked like every page.
#[cfg(doctest)]
#[doc = include_str!("../docs/fairness.md")]
pub struct FairnessDocDoctests;

/// docs/performance.md's blocks (shell and text only), checked like every page.
#[cfg(doctest)]
#[doc = include_str!("../docs/performance.md")]
pub struct PerformanceDocDoctests;

/// docs/multi-key.md's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/multi-key.md")]
pub struct MultiKeyDoctests;
