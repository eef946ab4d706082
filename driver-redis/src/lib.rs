//! distlock backend for Redis: a single server (or Valkey, or any server speaking the same
//! commands and Lua), a Redis Cluster (`redis+cluster://`), or the master Redis Sentinel
//! names (`redis+sentinel://`).
//!
//! The classic Redis lock (`SET key value NX PX ttl`, Lua compare-and-delete release)
//! done right: acquisition, release, renewal, inspection and break-lock are each one
//! atomic Lua script; every acquisition returns a fencing token (clock-assisted: a fence
//! key bumped to `max(last + 1, now_us)` of the server's `TIME`); release is owner-checked
//! and `PUBLISH`es on the lock's channel when someone waits, so waiters are woken instead
//! of polling — one per release and per process, through a single pub/sub connection per
//! backend. A waiter's re-check marks the lock it found held; a release of a lock nobody
//! marked publishes nothing (a `PUBLISH` costs the server as much as the `DEL`), and wakes
//! the releasing backend's own waiters in-process.
//!
//! Key layout under the prefix `P` (default `distlock:`): the lock lives at `P{K}`, its
//! fence counter at `P{K}:fence` and its channel is `P{K}:released`, where `K` is the
//! lock key with `%`, `{` and `}` escaped as `%25`, `%7B`, `%7D`. The braces form a Redis
//! Cluster hash tag, so a lock and its fence key always share a slot, and the escaping keeps
//! every key's names apart from every other key's.
//!
//! Requires Redis 5 or later (or Valkey): the acquire script reads `TIME` before writing,
//! which needs the effects replication of scripts that is the default since Redis 5. On a
//! Redis Cluster, Redis 7 or later: releases are announced on sharded channels (`SPUBLISH`),
//! so that only the shard owning a lock's slot carries them, and a backend's waiters share
//! one pub/sub connection per master. Under Sentinel the backend follows the master the
//! sentinels name, at once on their `+switch-master` announcement.
//!
//! What Redis persistence, eviction and failover do to the guarantees is on the safety
//! page, `docs/redis-safety.md`.
//!
//! # Examples
//!
//! ```no_run
//! # extern crate lockcore as distlock_core; // the workspace's name for it
//! # async fn demo() -> Result<(), distlock_core::LockError> {
//! use std::time::Duration;
//! use distlock_core::LockClient;
//!
//! let locks = LockClient::new(distlock_redis::connect("redis://127.0.0.1:6379/").await?);
//! let guard = locks.lock("invoice:42").ttl(Duration::from_secs(30)).wait(Duration::from_secs(5)).acquire().await?;
//! println!("holding with fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
// On docs.rs (`--cfg docsrs`, see Cargo.toml) every item shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::sync::Arc;

use lockcore::LockError;

mod backend;
mod config;
mod connection;
mod error;
mod names;
mod renew;
mod sentinel;
#[doc(hidden)]
pub mod store;
mod wait;

/// What driver-redlock reuses of this backend: the scripts, key names, error mapping and
/// reply parsing, so Redlock runs exactly the single-instance scripts on each instance.
/// Not a stable API.
#[doc(hidden)]
pub mod __redlock {
    pub use crate::error::{timed_out, unexpected};
    pub use crate::names::{check_prefix, names, Names};
    pub use crate::store::{
        self as scripts, acquire_outcome, as_int, as_token, fence_ttl_millis, grant_call,
        inspected, lease_owner, parse_value, remaining, ttl_millis, unfenced_fallback,
        unfenced_set, written_back, ABANDON, ACQUIRE, CLAIM, EXTEND, FORCE_RELEASE, INSPECT,
        INSPECT_ALL, RELEASE, WATCH, WRITE_BACK,
    };
    pub use crate::wait::{MessageFilter, Registration};
}

pub use backend::{RedisBackend, CAPABILITIES, UNFENCED_CAPABILITIES};
pub use config::{
    RedisBackendBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, DEFAULT_RESPONSE_TIMEOUT,
};
/// The redis client crate this backend is built on (for
/// [`RedisBackendBuilder::connection`]).
pub use redis;

/// Connects to the Redis server at `url` with the default prefix and timeouts.
///
/// Accepted: `redis://host[:port][/db]`, `redis://user:password@host:port/db`,
/// `rediss://…` (TLS), `redis+unix:///path?db=N`, `redis+cluster://h1:p1,h2:p2/` (a Redis
/// Cluster), `redis+sentinel://s1:p1,s2:p2/master-name[/db]` (the master Sentinel names).
/// Use [`RedisBackend::builder`] for a prefix, timeouts or an existing connection.
///
/// # Errors
///
/// [`LockError::Config`] for a malformed URL, [`LockError::Unavailable`] when the server
/// cannot be reached, [`LockError::Backend`] when it refuses the credentials.
///
/// # Examples
///
/// ```no_run
/// # extern crate lockcore as distlock_core; // the workspace's name for it
/// # async fn demo() -> Result<(), distlock_core::LockError> {
/// let backend = distlock_redis::connect("redis://app:secret@127.0.0.1:6379/2").await?;
/// let locks = distlock_core::LockClient::new(backend);
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<RedisBackend>, LockError> {
    RedisBackend::builder(url).build().await
}
