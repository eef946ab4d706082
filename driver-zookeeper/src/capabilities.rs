//! What the backend declares to lockcore, and its name in errors and logs.

use std::time::Duration;

use lockcore::driver::{Capabilities, ClockSource, Fairness, FencingGuarantee};

/// The backend's name in errors and logs.
pub const NAME: &str = "zookeeper";

/// What the ZooKeeper backend declares: strict fencing (zxids come from the ensemble's
/// atomic broadcast), release notifications (watches on the node before one's own), FIFO
/// fairness (the sequential nodes are the queue), read-write locks and semaphores,
/// batched renewals (one multi-read per batch), TTLs from 100 ms up to the session
/// timeout (a longer TTL is granted as the session timeout: the session is the lease),
/// judged by the servers' session clock.
pub const CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::Strict)
    .with_notifications(true)
    .with_fairness(Fairness::Fifo)
    .with_claims(true, true)
    .with_min_ttl(Duration::from_millis(100))
    .with_clock(ClockSource::Store)
    .with_batched_renewals(true);
