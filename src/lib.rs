//! distlock: distributed locks with fencing tokens, a renewal watchdog, a lost-lock signal
//! and cancellation-safe acquisition, over pluggable backends.
//!
//! This facade re-exports the contract ([`lockcore`]) and the drivers compiled in by Cargo
//! features, and picks a backend from a URL with [`connect`].
//!
//! | feature  | URL schemes | backend |
//! |----------|-------------|---------|
//! | `memory` (default) | `memory:`, `memory:NAME` | in-process reference store |
//! | `sqlite` (default) | `sqlite:PATH` | a SQLite file (created when missing), shared by processes |
//! | `redis` | `redis://`, `rediss://` | one Redis server |
//! | `redlock` | `redlock://h1:6379,h2:6379,h3:6379`, `redlocks://…` | Redlock over N independent Redis masters |
//! | `postgres` | `postgres://`, `postgresql://` | PostgreSQL |
//! | `mysql` | `mysql://`, `mariadb://` | MySQL / MariaDB |
//! | `etcd` | `etcd://h1:2379,h2:2379` | an etcd cluster |
//! | `cli` (default) | | the `distlock` command |
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

use std::sync::Arc;

pub use lockcore;
pub use lockcore::{
    default_label, BoxError, Capabilities, ClockSource, Fairness, FencedResource, FencingGuarantee,
    FencingToken, Lease, LockBackend, LockClient, LockClientBuilder, LockError, LockGuard,
    LockInfo, LockKey, LockOptions, LockRequest, Owner, OwnerToken, ReleaseOutcome, StaleToken,
    DEFAULT_TTL, MAX_KEY_LEN, MAX_LABEL_LEN,
};

#[cfg(feature = "memory")]
pub use lockcore::memory;

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

/// Every URL scheme distlock knows, with the Cargo feature that compiles its backend in.
pub const SCHEMES: &[(&str, &str)] = &[
    ("memory", "memory"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redlock", "redlock"),
    ("redlocks", "redlock"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("mysql", "mysql"),
    ("mariadb", "mysql"),
    ("sqlite", "sqlite"),
    ("etcd", "etcd"),
    ("etcds", "etcd"),
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
    let Some((scheme, rest)) = url.split_once(':') else {
        return Err(LockError::config(format!(
            "{:?} is not a lock store URL (expected SCHEME:..., e.g. memory: or redis://host/)",
            redact(url)
        )));
    };
    let scheme = scheme.to_ascii_lowercase();
    let _ = rest;
    match scheme.as_str() {
        #[cfg(feature = "memory")]
        "memory" => {
            let name = rest.trim_start_matches("//");
            Ok(if name.is_empty() { lockcore::memory::MemoryBackend::new() } else { lockcore::memory::MemoryBackend::named(name) })
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Ok(driver_redis::connect(url).await?),
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
        other => match SCHEMES.iter().find(|(s, _)| *s == other) {
            Some((_, feature)) => Err(LockError::config(format!(
                "the {other}: backend is not compiled in; enable the `{feature}` feature of distlock"
            ))),
            None => Err(LockError::config(format!(
                "unknown lock store scheme {other:?}; known schemes: {}",
                SCHEMES.iter().map(|(s, _)| format!("{s}:")).collect::<Vec<_>>().join(", ")
            ))),
        },
    }
}

/// `url` with any password replaced by `***`, for messages and logs.
pub fn redact(url: &str) -> String {
    // scheme://user:password@host... → scheme://user:***@host...
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let after = &url[scheme_end + 3..];
    let authority_end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let authority = &after[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &authority[..at];
    let redacted = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => userinfo.to_owned(),
    };
    format!("{}{}{}", &url[..scheme_end + 3], redacted, &after[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

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

/// docs/fencing.md's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/fencing.md")]
pub struct FencingDoctests;
