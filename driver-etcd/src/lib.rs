//! distlock backend for etcd v3: leases, transactions, watches, and create revisions as
//! fencing tokens.
//!
//! etcd is a consensus store, so its revisions are natural fencing tokens: the token of a
//! hold is the lock key's `create_revision`, strictly increasing across holders whatever
//! the clocks do ([`FencingGuarantee::Strict`](lockcore::driver::FencingGuarantee::Strict)).
//! Leases expire by the leader's clock; their TTLs are whole seconds with a server minimum
//! of about 2 s (declared as [`CAPABILITIES`]`.min_ttl`; shorter requests are rounded up
//! and the lease shows the TTL applied).
//!
//! See [`EtcdBackend`] for how each operation maps onto etcd, [`EtcdConfig::parse`] for
//! the URL syntax, and `docs/etcd.md` for the safety notes.
//!
//! # Examples
//!
//! ```no_run
//! # extern crate lockcore as distlock_core; // the workspace's name for it
//! # async fn demo() -> Result<(), distlock_core::LockError> {
//! use std::time::Duration;
//! use distlock_core::LockClient;
//!
//! let backend = distlock_etcd::connect("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/billing").await?;
//! let locks = LockClient::new(backend);
//! let guard = locks.lock("invoice:42").ttl(Duration::from_secs(10)).acquire().await?;
//! println!("fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
// On docs.rs (`--cfg docsrs`, see Cargo.toml) every item shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod backend;
mod capabilities;
mod config;
mod encoding;
mod endpoints;
mod error;
mod leases;
mod places;
mod queue;
mod release;
mod renew;
mod sets;
mod store;
mod wait;
mod watch;

use std::sync::{Arc, Mutex, MutexGuard};

use lockcore::LockError;

pub use backend::EtcdBackend;
pub use capabilities::{CAPABILITIES, NAME};
pub use config::{EtcdConfig, DEFAULT_NAMESPACE, DEFAULT_PORT};
/// The etcd client library this driver is built on, for code that talks to the same
/// cluster directly (benchmarks, tests, tools).
pub use etcd_client;

/// Locks `m`; a panic elsewhere while it was held (poison) does not make its state unusable:
/// every critical section leaves it consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Builds a backend from an `etcd://` or `etcds://` URL (syntax: [`EtcdConfig::parse`])
/// and reads its namespace once, so that refused credentials show here.
///
/// If no endpoint answers, that check is left to the first operation (each operation
/// connects and fails over to the other listed endpoints by itself), so a backend can be
/// built while the cluster is down.
///
/// # Errors
///
/// [`LockError::Config`] for a malformed URL; [`LockError::Backend`] if etcd refuses the
/// credentials or the namespace.
///
/// # Examples
///
/// ```no_run
/// # extern crate lockcore as distlock_core; // the workspace's name for it
/// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
/// let backend = distlock_etcd::connect("etcd://127.0.0.1:2379,127.0.0.1:22379?timeout=2s").await?;
/// assert_eq!(backend.config().endpoints.len(), 2);
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<EtcdBackend>, LockError> {
    EtcdBackend::new(EtcdConfig::parse(url)?)?.checked().await
}
