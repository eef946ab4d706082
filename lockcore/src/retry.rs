//! How requests retry failures that retrying may fix.

use std::future::Future;
use std::time::{Duration, Instant};

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
/// use distlock_core::RetryPolicy;
///
/// // A leader loop that rides out a store restart of up to a minute.
/// let policy = RetryPolicy::new().max_delay(Duration::from_secs(2)).max_elapsed(Duration::from_secs(60));
/// assert_eq!(policy.get_max_elapsed(), Some(Duration::from_secs(60)));
/// ```
///
/// Drivers use the same type for their own retries (another endpoint, a busy database, a
/// lost notification session) through [`backoff`](Self::backoff) and [`run`](Self::run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    first_delay: Duration,
    max_delay: Duration,
    max_elapsed: Option<Duration>,
    max_retries: Option<u32>,
    jitter: bool,
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
            max_retries: None,
            jitter: true,
        }
    }

    /// Pauses of `first` doubling up to `max`, without jitter and without limits: the
    /// shape of a driver's internal reconnect loop.
    pub const fn doubling(first: Duration, max: Duration) -> Self {
        RetryPolicy {
            first_delay: first,
            max_delay: max,
            max_elapsed: None,
            max_retries: None,
            jitter: false,
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

    /// Give up (returning the last failure) after this many retries in a row.
    pub const fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = Some(retries);
        self
    }

    /// Pauses exactly as prescribed, without the random extra of up to half a pause that
    /// keeps many clients from retrying in step (on by default).
    pub const fn without_jitter(mut self) -> Self {
        self.jitter = false;
        self
    }

    /// The limit set by [`max_elapsed`](Self::max_elapsed), if any.
    pub const fn get_max_elapsed(&self) -> Option<Duration> {
        self.max_elapsed
    }

    /// A fresh sequence of pauses following this policy.
    pub fn backoff(&self) -> Backoff {
        Backoff {
            policy: *self,
            next: self.first_delay,
            failing_since: None,
            retries: 0,
            deadline: None,
        }
    }

    /// Runs `op` until it succeeds, fails in a way `retryable` rejects, or the policy gives
    /// up (then the last failure is returned); pauses between attempts as prescribed.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use distlock_core::RetryPolicy;
    ///
    /// let mut calls = 0;
    /// let policy = RetryPolicy::new().first_delay(Duration::from_millis(1)).max_retries(2);
    /// let out: Result<(), &str> = policy.run(|| { calls += 1; async { Err("busy") } }, |_| true).await;
    /// assert_eq!((out, calls), (Err("busy"), 3));
    /// # }
    /// ```
    pub async fn run<T, E, F, Fut>(
        &self,
        mut op: F,
        mut retryable: impl FnMut(&E) -> bool,
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut backoff = self.backoff();
        loop {
            match op().await {
                Err(e) if retryable(&e) => match backoff.next_pause(Instant::now()) {
                    Some(pause) => tokio::time::sleep(pause).await,
                    None => return Err(e),
                },
                other => return other,
            }
        }
    }
}

/// One run of retries: the pauses a [`RetryPolicy`] prescribes, from
/// [`RetryPolicy::backoff`].
#[derive(Debug)]
pub struct Backoff {
    policy: RetryPolicy,
    next: Duration,
    failing_since: Option<Instant>,
    retries: u32,
    deadline: Option<Instant>,
}

impl Backoff {
    /// Also gives up when a pause would end at or after `deadline`.
    pub fn until(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The pause before the next attempt after a failure at `now`, or `None` when the
    /// policy (or the deadline) says to give up.
    pub fn next_pause(&mut self, now: Instant) -> Option<Duration> {
        let since = *self.failing_since.get_or_insert(now);
        let base = self.next.min(self.policy.max_delay);
        let pause = if self.policy.jitter {
            base + jitter(base / 2)
        } else {
            base
        };
        if let Some(limit) = self.policy.max_elapsed {
            if now.saturating_duration_since(since) + pause > limit {
                return None;
            }
        }
        if self
            .policy
            .max_retries
            .is_some_and(|max| self.retries >= max)
        {
            return None;
        }
        if self.deadline.is_some_and(|d| now + pause >= d) {
            return None;
        }
        self.retries += 1;
        self.next = (base * 2).min(self.policy.max_delay);
        Some(pause)
    }

    /// Sleeps the next pause; `false` (at once) when the policy says to give up.
    pub async fn pause(&mut self) -> bool {
        match self.next_pause(Instant::now()) {
            Some(pause) => {
                tokio::time::sleep(pause).await;
                true
            }
            None => false,
        }
    }

    /// An attempt was answered: the next failure starts a new run.
    pub fn reset(&mut self) {
        self.next = self.policy.first_delay;
        self.failing_since = None;
        self.retries = 0;
    }
}

/// A random duration in `0..=max` (from the operating system's CSPRNG, so clients started
/// together do not draw the same sequence).
pub fn jitter(max: Duration) -> Duration {
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    let r = getrandom::u64().unwrap_or(nanos / 2);
    Duration::from_nanos(r % nanos.saturating_add(1))
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

    #[test]
    fn without_jitter_the_pauses_are_exact_and_retries_and_deadlines_stop_them() {
        let policy = RetryPolicy::doubling(Duration::from_millis(20), Duration::from_millis(50));
        let mut b = policy.max_retries(3).backoff();
        let now = Instant::now();
        let pauses: Vec<_> = std::iter::from_fn(|| b.next_pause(now)).collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(pauses, [ms(20), ms(40), ms(50)]);
        let mut b = policy.backoff().until(now + ms(45));
        assert_eq!(b.next_pause(now), Some(ms(20)));
        assert_eq!(
            b.next_pause(now + ms(20)),
            None,
            "20 + 40 ms passes the deadline"
        );
        assert_eq!(
            b.next_pause(now + ms(4)),
            Some(ms(40)),
            "4 + 40 ms does not"
        );
    }

    #[test]
    fn jitter_stays_in_range() {
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
        for _ in 0..100 {
            assert!(jitter(Duration::from_micros(7)) <= Duration::from_micros(7));
        }
        assert!(jitter(Duration::MAX) <= Duration::MAX);
    }
}
