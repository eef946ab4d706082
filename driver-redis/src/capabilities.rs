//! What the backend declares, and the TTLs in milliseconds it gives Redis within those
//! limits.

use std::time::Duration;

use lockcore::driver::{Capabilities, Fairness, FencingGuarantee};
use lockcore::LockError;

/// What the redis backend declares: clock-assisted fencing (the fence counter has a floor
/// from the server's `TIME`), release notifications by pub/sub, bounded fairness (a long
/// wait marks the key as its next turn, see
/// [`ClaimRequest::waited`](lockcore::driver::ClaimRequest::waited)), TTLs from 1 ms
/// (Redis counts `PX` in milliseconds) to 24 hours, expiry judged by the server's clock,
/// shared claims: read-write locks and semaphores (see [`scripts::CLAIM`](crate::scripts::CLAIM)).
pub const CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::ClockAssisted)
    .with_notifications(true)
    .with_fairness(Fairness::Bounded)
    .with_claims(true, true)
    .with_batched_renewals(true)
    .with_min_ttl(Duration::from_millis(1))
    .with_max_ttl(Duration::from_secs(24 * 3600));

/// What the redis backend declares with fencing switched off
/// ([`RedisBackendBuilder::fencing`](crate::RedisBackendBuilder::fencing), `?fencing=false`):
/// [`CAPABILITIES`] without fencing tokens (every token is 0), without shared claims and
/// without fairness (the unfenced grant is a plain `SET NX PX`, which does not look at the
/// leases or marks beside the lock).
pub const UNFENCED_CAPABILITIES: Capabilities = CAPABILITIES
    .with_fencing(FencingGuarantee::None)
    .with_fairness(Fairness::None)
    .with_claims(false, false);

/// How long a fence key outlives the longest lock: long enough that an idle key's counter
/// is still there when a lock could still be held, short enough that fence keys of keys
/// no longer used do not pile up. After it expires, the `TIME` floor keeps tokens rising.
const FENCE_TTL: Duration = Duration::from_secs(3600);

/// A TTL in whole milliseconds, rounded up (Redis `PX` counts milliseconds).
#[doc(hidden)]
pub fn ttl_millis(ttl: Duration) -> Result<u64, LockError> {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms)
        .ok()
        .filter(|ms| *ms > 0 && *ms <= CAPABILITIES.max_ttl.as_millis() as u64)
        .ok_or_else(|| LockError::InvalidTtl {
            ttl,
            reason: format!(
                "the redis backend accepts TTLs from 1 ms to {:?}",
                CAPABILITIES.max_ttl
            ),
        })
}

/// The fence key's TTL in ms: the longest lock TTL plus an hour.
#[doc(hidden)]
pub fn fence_ttl_millis() -> u64 {
    (CAPABILITIES.max_ttl + FENCE_TTL).as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_micros(1)).unwrap(), 1);
        assert_eq!(ttl_millis(Duration::from_micros(1500)).unwrap(), 2);
        assert_eq!(ttl_millis(Duration::from_secs(3)).unwrap(), 3000);
        assert!(ttl_millis(Duration::ZERO).is_err());
        assert!(ttl_millis(Duration::MAX).is_err());
    }
}
