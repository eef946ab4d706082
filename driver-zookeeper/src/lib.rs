//! distlock backend for ZooKeeper: the session as the lease, ephemeral sequential nodes as
//! the queue of waiters, and zxids as fencing tokens.
//!
//! Built on [`zookeeper_client`], the actively maintained tokio-native client (written
//! from scratch against the wire protocol, with multi-reads, watches that are plain
//! futures, TLS and SASL/digest authentication), rather than bindings to the C client or
//! the older callback-style crates.
//!
//! * One ZooKeeper session per backend: its heartbeats renew every hold at once.
//! * A claim is an ephemeral sequential node under the key's node, named as Curator's
//!   `InterProcessMutex` names its nodes, so Java services using Curator on the same path
//!   and distlock clients exclude each other (see [`ZkBackend::lock_path`]).
//! * The fencing token is the holder node's `czxid`
//!   ([`FencingGuarantee::Strict`](lockcore::driver::FencingGuarantee::Strict)).
//! * `lost()` fires when the session expires (a renewal finds the node gone);
//!   `renewal_failing()` while the client is disconnected.
//!
//! See [`ZkBackend`] for the design, [`ZkConfig::parse`] for the URL syntax, and
//! `docs/zookeeper.md` for layout, fencing and faults.
//!
//! # Examples
//!
//! ```no_run
//! # extern crate lockcore as distlock_core; // the workspace's name for it
//! # async fn demo() -> Result<(), distlock_core::LockError> {
//! use std::time::Duration;
//! use distlock_core::LockClient;
//!
//! let backend = distlock_zookeeper::connect("zk://10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181/billing").await?;
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
mod error;
mod places;
mod renew;
mod session;
mod store;
mod wait;

use std::sync::Arc;

use lockcore::LockError;

pub use backend::ZkBackend;
pub use capabilities::{CAPABILITIES, NAME};
pub use config::{ZkConfig, DEFAULT_PORT, DEFAULT_ROOT};
/// The ZooKeeper client library this driver is built on, for code that talks to the same
/// ensemble directly (benchmarks, tests, tools).
pub use zookeeper_client;

/// Builds a backend from a `zk://` or `zks://` URL (syntax: [`ZkConfig::parse`]) and opens
/// its session, so that unreachable servers and refused credentials show here.
///
/// # Errors
///
/// [`LockError::Config`] for a malformed URL (or TLS without the `tls` feature);
/// [`LockError::Unavailable`] when no server answers within the connect timeout;
/// [`LockError::Backend`] if ZooKeeper refuses the credentials or the root path.
///
/// # Examples
///
/// ```no_run
/// # extern crate lockcore as distlock_core; // the workspace's name for it
/// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
/// let backend = distlock_zookeeper::connect("zk://127.0.0.1:2181/locks?session_timeout=6s").await?;
/// assert_eq!(backend.config().root, "/locks");
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<ZkBackend>, LockError> {
    ZkBackend::new(ZkConfig::parse(url)?).checked().await
}
