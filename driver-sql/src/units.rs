//! The lock contract's units as the table stores them: TTLs and remaining times in
//! microseconds, fencing tokens in a `BIGINT` column.

use std::time::Duration;

/// A TTL in whole microseconds, rounded up so a lease is never shorter than asked.
pub(crate) fn ttl_micros(ttl: Duration) -> i64 {
    let micros = ttl.as_nanos().div_ceil(1000);
    i64::try_from(micros).unwrap_or(i64::MAX).max(1)
}

/// A remaining time reported by the database, in microseconds, as a duration (negative
/// values, from rows that expire as we read them, become zero).
pub(crate) fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// A fencing token read from a `BIGINT` column.
pub(crate) fn token(fence: i64) -> lockcore::FencingToken {
    lockcore::FencingToken(u64::try_from(fence).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up() {
        assert_eq!(ttl_micros(Duration::from_nanos(1)), 1);
        assert_eq!(ttl_micros(Duration::from_millis(3)), 3000);
        assert_eq!(ttl_micros(Duration::from_nanos(1001)), 2);
    }
}
