//! The distlock contract: what a distributed lock *is*, once for every store.
//!
//! * [`LockKey`], [`Owner`], [`FencingToken`], [`Lease`]: validated keys, secret owner
//!   tokens, tokens that strictly increase with every new holder, and leases measured on
//!   the holder's monotonic clock.
//! * [`LockBackend`]: the few atomic operations a store must provide (object-safe, used
//!   as `Arc<dyn LockBackend>`), and the [`Capabilities`] it declares.
//! * [`LockClient`] and [`LockGuard`]: waiting with deadlines, cancellation-safe
//!   acquisition, reentrancy, the renewal watchdog and the [`lost`](LockHandle::lost)
//!   signal, owner-checked release. This policy lives here once; drivers only store.
//! * [`memory::MemoryBackend`]: the complete in-process reference backend.
//! * [`FencedResource`]: the check a protected resource makes with fencing tokens.
//! * `testing` (feature `testing`): a store that application tests steer (lost locks,
//!   failing renewals, an unavailable store, held answers) on tokio's clock.
//! * [`metrics`]: what a client records through the `metrics` facade (feature `metrics`);
//!   every lock operation also runs in a `tracing` span (`distlock.acquire`, …) with its key,
//!   backend, outcome and token.
//!
//! # Examples
//!
//! ```
//! # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
//! use std::time::Duration;
//! use distlock_core::{FencedResource, LockClient, memory::MemoryBackend};
//!
//! let locks = LockClient::new(MemoryBackend::new());
//! let ledger = FencedResource::new(0u64);
//!
//! let guard = locks.lock("ledger").ttl(Duration::from_secs(10)).wait(Duration::from_secs(5)).acquire().await?;
//! ledger.write(guard.token(), |balance| *balance += 10).expect("our token is the newest");
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
// On docs.rs (`--cfg docsrs`, see Cargo.toml) every item shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod acquire;
mod backend;
mod capabilities;
mod claim;
mod client;
pub mod driver;
pub mod election;
mod error;
mod fencing;
mod guard;
mod hint;
mod hold;
mod inner;
mod key;
mod lease;
mod line;
pub mod memory;
pub mod metrics;
mod multi;
mod notify;
mod owner;
mod request;
mod retry;
mod set;
mod slots;
mod starving;
pub mod store_url;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;
mod watchdog;

// What an application uses.
pub use backend::{LockBackend, LockInfo, ReleaseOutcome};
pub use claim::{Claim, ClaimMode};
pub use client::{LockClient, LockClientBuilder};
pub use error::{ErrorChain, LockError};
pub use fencing::{FencedResource, FencingToken, StaleToken};
pub use guard::{LockGuard, LockHandle};
pub use hold::RenewalHealth;
pub use key::LockKey;
pub use lease::Lease;
pub use multi::{MultiLockGuard, MultiLockRequest};
pub use owner::Owner;
pub use request::LockRequest;
pub use retry::RetryPolicy;

// Inside the crate, the driver module's items are at the root too.
use backend::{
    AcquireOutcome, Capabilities, ClaimRequest, ClockSource, Contention, ExtendOutcome, Fairness,
    FencingGuarantee, Grant, LockBackendExt, Renewal, SetOutcome, WaitHint,
};
use error::Operation;
use owner::{OwnerToken, MAX_LABEL_LEN};

/// Whether a subscriber may want INFO spans, as `tracing`'s own macros decide: the
/// acquire and release spans are made only then, since a disabled span still costs its
/// enters, exits and records.
fn info_spans_enabled() -> bool {
    use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};
    tracing::Level::INFO <= STATIC_MAX_LEVEL && tracing::Level::INFO <= LevelFilter::current()
}
