//! How requests retry failures that retrying may fix.

use std::time::{Duration, Instant};

use crate::client::jitter;

/// How [`acquire`](crate::LockRequest::acquire) retries failures that retrying may fix (the
/// store unreachable, no Redlock quorum): exponential backoff with jitter, starting at
/// [`first_delay`](Self::first_delay) and doubling up to [`max_delay`](Self::max_delay),
/// for at most [`max_elapsed`](Self::max_elapsed) of failures in a row (no limit by default)
/// and never past the request's [`wait`](crate::LockRequest::wait) deadline.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lockcore::RetryPolicy;
///
/// // A leader loop that rides out a store restart of up to a minute.
/// let policy = RetryPolicy::new().max_delay(Duration::from_secs(2)).max_elapsed(Duration::from_secs(60));
/// assert_eq!(policy.get_max_elapsed(), Some(Duration::from_secs(60)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    first_delay: Duration,
    max_delay: Duration,
    max_elapsed: Option<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// 10 ms first, doubling up to 1 s, with no limit on how long failures may go on.
    pub const fn new() -> Self {
        RetryPolicy {
            first_delay: Duration::from_millis(10),
            max_delay: Duration::from_secs(1),
            max_elapsed: None,
        }
    }

    /// The pause after the first failure (default 10 ms; jitter adds up to half of it).
    pub const fn first_delay(mut self, delay: Duration) -> Self {
        self.first_delay = delay;
        self
    }

    /// The longest pause between two attempts (default 1 s).
    pub const fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// Give up (returning the last failure) once failures have gone on this long in a row.
    pub const fn max_elapsed(mut self, limit: Duration) -> Self {
        self.max_elapsed = Some(limit);
        self
    }

    /// The limit set by [`max_elapsed`](Self::max_elapsed), if any.
    pub const fn get_max_elapsed(&self) -> Option<Duration> {
        self.max_elapsed
    }

    /// A fresh backoff sequence following this policy.
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff {
            policy: *self,
            next: self.first_delay,
            failing_since: None,
        }
    }
}

/// One run of retries: the pauses a [`RetryPolicy`] prescribes.
#[derive(Debug)]
pub(crate) struct Backoff {
    policy: RetryPolicy,
    next: Duration,
    failing_since: Option<Instant>,
}

impl Backoff {
    /// The pause before the next attempt after a failure at `now`, or `None` when the
    /// policy says to give up.
    pub(crate) fn next_pause(&mut self, now: Instant) -> Option<Duration> {
        let since = *self.failing_since.get_or_insert(now);
        let base = self.next.min(self.policy.max_delay);
        let pause = base + jitter(base / 2);
        if let Some(limit) = self.policy.max_elapsed {
            if now.saturating_duration_since(since) + pause > limit {
                return None;
            }
        }
        self.next = (base * 2).min(self.policy.max_delay);
        Some(pause)
    }

    /// An attempt was answered: the next failure starts a new run.
    pub(crate) fn reset(&mut self) {
        self.next = self.policy.first_delay;
        self.failing_since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_cap_and_stop_at_the_limit() {
        let policy = RetryPolicy::new()
            .first_delay(Duration::from_millis(100))
            .max_delay(Duration::from_millis(400))
            .max_elapsed(Duration::from_secs(2));
        let mut b = policy.backoff();
        let t0 = Instant::now();
        let mut at = t0;
        let mut pauses = Vec::new();
        while let Some(p) = b.next_pause(at) {
            pauses.push(p);
            at += p;
        }
        let bases = [100, 200, 400, 400];
        for (p, base) in pauses.iter().zip(bases) {
            let base = Duration::from_millis(base);
            assert!(*p >= base && *p <= base + base / 2, "{pauses:?}");
        }
        assert!(pauses.len() >= 4, "{pauses:?}");
        assert!(at - t0 <= Duration::from_secs(2), "{pauses:?}");
        b.reset();
        let p = b.next_pause(at).unwrap();
        assert!(p <= Duration::from_millis(150), "reset starts over: {p:?}");
    }
}
