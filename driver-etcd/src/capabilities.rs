//! What the backend declares to lockcore, and its name in errors and logs.

use std::time::Duration;

use lockcore::driver::{Capabilities, ClockSource, Fairness, FencingGuarantee};

/// The backend's name in errors and logs.
pub const NAME: &str = "etcd";

/// What the etcd backend declares: strict fencing (create revisions come from raft),
/// release notifications (watches), FIFO fairness (waiters queue in etcd), shared
/// (read-write) locks and semaphores, batched renewals, TTLs from 2 s (etcd's minimum
/// lease TTL with default election settings) to 24 h, judged by the leader's clock.
pub const CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::Strict)
    .with_notifications(true)
    .with_fairness(Fairness::Fifo)
    .with_claims(true, true)
    .with_min_ttl(Duration::from_secs(2))
    .with_clock(ClockSource::Store)
    .with_batched_renewals(true);
