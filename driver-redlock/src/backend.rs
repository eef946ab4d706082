//! [`RedlockBackend`]: the Redlock algorithm over N independent Redis masters, each run
//! with driver-redis's scripts and connections. `docs/redlock.md` describes the algorithm;
//! each step of it has a file here:
//!
//! * `quorum`: the majority and the validity `ttl − elapsed − drift`;
//! * `rounds`: a request to every instance at once, bounded by the per-instance timeout;
//! * `instances`: the instances' connections and the state every operation shares;
//! * `acquire`: round 1 (the grant), a failed attempt undone everywhere;
//! * `fencing`: round 2, the write-back of T = max over the grants;
//! * `release`, `extend`, `inspect`, `wait`: the other operations;
//! * `announcements`: a release's announcements, and which waiter they wake;
//! * `config`: the builder;
//! * `lock_backend`: [`RedlockBackend`] and its [`LockBackend`](lockcore::LockBackend) impl.

mod acquire;
mod announcements;
mod config;
mod extend;
mod fencing;
mod inspect;
mod instances;
mod lock_backend;
mod quorum;
mod release;
mod rounds;
mod wait;

#[cfg(test)]
mod tests;

pub use config::{RedlockBackendBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX};
pub use instances::NAME;
pub use lock_backend::{RedlockBackend, CAPABILITIES, UNFENCED_CAPABILITIES};
pub use rounds::{default_instance_timeout, DEFAULT_UNTIMED_INSTANCE_TIMEOUT};
