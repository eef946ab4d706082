//! distlock backend: Redlock over N independent Redis masters.
//!
//! Each instance runs driver-redis's single-instance scripts (acquire with its fence bump,
//! owner-checked release with `PUBLISH`, extend, inspect); this crate adds what Redlock is:
//! requests fanned out to all instances in parallel with a per-instance timeout far below
//! the TTL, a majority (N/2+1) within `ttl − elapsed − drift`, release everywhere when an
//! attempt fails, and a fencing round that carries the token from one majority to the next.
//! With fencing switched off the grant is a plain `SET NX PX` (the script only when it is
//! refused) and every token is 0.
//!
//! Tokens are *clock-assisted*: any two majorities share an instance that saw the larger
//! token, as long as that instance keeps its counter (AOF with `appendfsync always`); after
//! any other restart only the `TIME` floor keeps tokens rising. `docs/redlock.md` has the
//! URL syntax, the assumptions and the measured figures.
//!
//! # Examples
//!
//! ```no_run
//! # extern crate lockcore as distlock_core; // the workspace's name for it
//! # async fn demo() -> Result<(), distlock_core::LockError> {
//! use std::time::Duration;
//! use distlock_core::LockClient;
//!
//! let backend = distlock_redlock::connect("redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003").await?;
//! let locks = LockClient::new(backend);
//! let guard = locks.lock("invoice:42").ttl(Duration::from_secs(30)).acquire().await?;
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

mod announcements;
mod backend;
mod config;
mod fencing;
mod quorum;
mod renew;
mod rounds;
mod store;
mod wait;

pub use backend::{RedlockBackend, CAPABILITIES, UNFENCED_CAPABILITIES};
pub use config::{RedlockBackendBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX};
pub use rounds::{default_instance_timeout, DEFAULT_UNTIMED_INSTANCE_TIMEOUT};
pub use store::NAME;

/// The redis client crate the instances are reached with.
pub use driver_redis::redis;

/// The single-instance driver this one builds on (its scripts are what benchmarks of a
/// hand-written Redlock run). Not a stable API.
#[doc(hidden)]
pub use driver_redis as __driver_redis;

/// Connects to the instances of a `redlock://` URL.
///
/// ```text
/// redlock://[user[:password]@]host[:port],[user[:password]@]host[:port],…[/db][?options]
/// redlocks://…        every instance over TLS (rediss://)
/// ```
///
/// * Instances are separated by commas; the port defaults to 6379. IPv6 addresses go in
///   brackets: `[::1]:7000`.
/// * Credentials on the first instance apply to every instance without its own;
///   percent-encode `@ , / ? # :` and spaces in them.
/// * `/db` selects the same database number on every instance.
/// * Options: `prefix=…` (key prefix, default `distlock:`), `timeout=50ms` (per-instance
///   timeout; default derived from each lock's TTL), `connect_timeout=2s`, `tls=true`
///   (same as `redlocks://`), `fencing=false` (no fencing tokens: every token is 0, one
///   round fewer).
///
/// For a different TLS setting or certificates per instance, use
/// [`RedlockBackend::builder`] with one `redis://`/`rediss://` URL per instance.
///
/// # Errors
///
/// [`LockError::Config`] for a malformed URL (the message never shows a password),
/// [`LockError::Backend`] when an instance refuses the credentials,
/// [`LockError::QuorumNotReached`] when fewer than a majority can be reached.
///
/// # Examples
///
/// ```no_run
/// # extern crate lockcore as distlock_core; // the workspace's name for it
/// # async fn demo() -> Result<(), distlock_core::LockError> {
/// let backend = distlock_redlock::connect(
///     "redlock://app:secret@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379/0?prefix=billing:&timeout=50ms",
/// )
/// .await?;
/// let locks = distlock_core::LockClient::new(backend);
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<RedlockBackend>, LockError> {
    RedlockBackend::builder_from_url(url)?.build().await
}
