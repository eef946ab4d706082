//! A round: one request to each instance (or some of them), all sent at once, bounded by
//! one per-instance timeout far below the TTL, and the answers collected as they come; and
//! the failures of the instances that did not answer, for the error of a round that too
//! few answered.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use driver_redis::__redlock as support;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lockcore::LockError;

/// The per-instance timeout of operations that carry no TTL (release, holders, waiting,
/// force-release) unless the builder sets one.
pub const DEFAULT_UNTIMED_INSTANCE_TIMEOUT: Duration = Duration::from_millis(500);

/// The per-instance timeout derived from a lock's TTL when the builder sets none: a tenth
/// of the TTL, at least 25 ms and at most 1 s, and never above a third of the TTL — far
/// below the TTL, so an unresponsive instance costs little of the lease's validity.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use distlock_redlock::default_instance_timeout;
///
/// assert_eq!(default_instance_timeout(Duration::from_secs(30)), Duration::from_secs(1));
/// assert_eq!(default_instance_timeout(Duration::from_secs(2)), Duration::from_millis(200));
/// assert_eq!(default_instance_timeout(Duration::from_millis(30)), Duration::from_millis(10));
/// ```
pub fn default_instance_timeout(ttl: Duration) -> Duration {
    (ttl / 10)
        .clamp(Duration::from_millis(25), Duration::from_secs(1))
        .min(ttl / 3)
        .max(Duration::from_millis(1))
}

/// The instances that did not answer in a round, and how each failed.
#[derive(Default)]
pub(crate) struct Failures {
    /// The first error: returned as it is when retrying cannot fix it (see
    /// `Inner::too_few`).
    pub(crate) first: Option<LockError>,
    /// `host:port: cause` of each failure, for [`LockError::QuorumNotReached`].
    pub(crate) each: Vec<String>,
}

impl Failures {
    pub(crate) fn add(&mut self, instance: &str, e: LockError) {
        self.each.push(format!("{instance}: {}", cause(&e)));
        self.first.get_or_insert(e);
    }
}

/// What the Redis client said, without the driver's "redis is unavailable" wrapper (the
/// instance is named instead) and without a level that only repeats the one below.
fn cause(e: &LockError) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        match parts.last_mut() {
            Some(last) if last.contains(&text) => {}
            // A level whose text ends with the one below it ("…: Connection refused"):
            // keep the longer one.
            Some(last) if text.contains(last.as_str()) => *last = text,
            _ => parts.push(text),
        }
        source = s.source();
    }
    if parts.is_empty() {
        e.to_string()
    } else {
        parts.join(": ")
    }
}

/// The answers of one round: a request to each of `n` instances (or some of them), all
/// sent at once and therefore sharing one deadline, the per-instance timeout. One timer per
/// round instead of one per request. An instance that has not answered by the deadline
/// answers `Unavailable` (timed out), and its request is dropped.
pub(crate) struct Round<F> {
    pending: FuturesUnordered<F>,
    /// Instances asked and not answered yet.
    outstanding: Vec<bool>,
    left: usize,
    what: &'static str,
    timeout: Duration,
    deadline: Instant,
    /// Armed at the first poll that has to wait.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    expired: bool,
}

impl<F, T> Round<F>
where
    F: Future<Output = (usize, Result<T, LockError>)> + Send + 'static,
    T: Send + 'static,
{
    /// A round of `requests` (each answering with its instance's index) among `n` instances.
    pub(crate) fn new(
        what: &'static str,
        timeout: Duration,
        n: usize,
        requests: impl IntoIterator<Item = (usize, F)>,
    ) -> Self {
        let mut outstanding = vec![false; n];
        let pending: FuturesUnordered<F> = requests
            .into_iter()
            .map(|(i, request)| {
                outstanding[i] = true;
                request
            })
            .collect();
        Round {
            left: pending.len(),
            pending,
            outstanding,
            what,
            timeout,
            deadline: Instant::now() + timeout,
            timer: None,
            expired: false,
        }
    }

    /// How many instances have not answered yet.
    pub(crate) fn len(&self) -> usize {
        self.left
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// The next answer, or `None` when every instance asked has answered.
    pub(crate) async fn next(&mut self) -> Option<(usize, Result<T, LockError>)> {
        std::future::poll_fn(|cx| self.poll_answer(cx)).await
    }

    fn poll_answer(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<(usize, Result<T, LockError>)>> {
        if !self.expired {
            match self.pending.poll_next_unpin(cx) {
                Poll::Ready(Some((i, r))) => return Poll::Ready(Some(self.answered(i, r))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => {}
            }
            let deadline = self.deadline;
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline.into())));
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.expired = true;
            self.pending = FuturesUnordered::new();
        }
        match self.outstanding.iter().position(|o| *o) {
            Some(i) => {
                let timed_out = support::timed_out(self.what, self.timeout);
                Poll::Ready(Some(self.answered(i, Err(timed_out))))
            }
            None => Poll::Ready(None),
        }
    }

    fn answered(&mut self, i: usize, r: Result<T, LockError>) -> (usize, Result<T, LockError>) {
        self.outstanding[i] = false;
        self.left -= 1;
        (i, r)
    }

    /// Lets the requests still unanswered finish in the background, bounded by their
    /// connection's response timeout: a request dropped before its connection wrote it is
    /// never sent (a release must reach every instance).
    ///
    /// Each request is first handed to its connection here, before the caller goes on: a
    /// request polled first by the background task could queue behind the caller's next
    /// one on the same connection (a release undoing a failed attempt behind the same
    /// owner's next grant, which it would then delete).
    pub(crate) fn detach(mut self) {
        let mut cx = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
        // Polls every request not yet polled, until all are waiting for their answers.
        while let Poll::Ready(Some(_)) = self.pending.poll_next_unpin(&mut cx) {}
        if !self.pending.is_empty() {
            tokio::spawn(self.pending.for_each(|_| async {}));
        }
    }

    /// The requests still unanswered, for a task that waits for them itself.
    pub(crate) fn into_pending(self) -> FuturesUnordered<F> {
        self.pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_timeouts_stay_far_below_the_ttl() {
        for ms in [1u64, 10, 30, 100, 400, 1000, 30_000, 3_600_000] {
            let ttl = Duration::from_millis(ms);
            let t = default_instance_timeout(ttl);
            assert!(
                t <= ttl / 3 || t == Duration::from_millis(1),
                "{ttl:?}: {t:?}"
            );
            assert!(t <= Duration::from_secs(1));
        }
    }
}
