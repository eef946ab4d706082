//! Waiting for a release: subscribed on every instance, then a re-check that marks the
//! copies it finds held, so that their release is announced (see
//! [`crate::announcements`]).

use std::sync::Arc;
use std::time::Duration;

use driver_redis::__redlock as support;
use lockcore::driver::WaitHint;
use lockcore::{LockError, LockKey};

use crate::quorum::time_until_at_most;
use crate::store::Inner;

impl Inner {
    /// Waits until `key` is released (or `max_wait` passed), or, for a split vote's hint,
    /// its back-off; woken in-process in the order of `place` (see
    /// [`LockBackend::wait_released`](lockcore::LockBackend::wait_released)).
    pub(crate) async fn wait_released(
        self: &Arc<Self>,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        if let Some(backoff) = hint.retry_delay() {
            // A split vote or a late grant: back off briefly, then try again. LockClient
            // sleeps such a pause itself; a direct caller (lockbench's hand-off loop) lands
            // here.
            tokio::time::sleep(backoff.min(max_wait)).await;
            return Ok(());
        }
        let (q, n) = (self.quorum, self.instances.len());
        // In-process interest first, then the servers' subscriptions, then the re-check:
        // a release at any point after the failed attempt wakes us.
        let subscription = self.notifier.subscribe(key, place);
        self.announcements.waiting(key);
        let timeout = self.untimed();
        let registrations = futures_util::future::join_all((0..n).map(|i| async move {
            let backend = self.instance(i, timeout).await?;
            match tokio::time::timeout(timeout, backend.watch_releases(key)).await {
                Ok(r) => r,
                Err(_) => Err(support::timed_out("SUBSCRIBE", timeout)),
            }
        }))
        .await;
        let listening = registrations.iter().filter(|r| r.is_ok()).count();
        // The re-check marks every copy it finds held, so that its release publishes: more
        // than n − q copies when the lock is out of reach, at least one of them the
        // majority holder's (see `release_filter`).
        // A claim refused by shared leases carries the largest change stamp the refusing
        // instances had: an instance whose stamp is above it has seen a release since
        // (instances' clocks agree within the drift Redlock assumes; a change missed by a
        // skewed clock costs a wait until the leases' expiry, never a wrong answer).
        let names = support::names(&self.prefix, key);
        let mut watch = support::WATCH.key(&names.lock);
        if let Some(rev) = hint.revision() {
            watch
                .key(names.leases())
                .key(names.claims())
                .arg(rev)
                .arg("after");
        }
        let (seen, failures) = self
            .survey(
                ("watch", watch, true),
                |pttl: i64| Ok((pttl != -2).then(|| support::remaining(pttl))),
                |seen, pending| {
                    let free = seen.iter().filter(|s| s.is_none()).count();
                    let held = seen.len() - free;
                    free >= q || held > n - q || pending == 0
                },
            )
            .await;
        if listening == 0 && seen.is_empty() {
            return Err(self.too_few(0, failures));
        }
        let held: Vec<Option<Duration>> = seen.into_iter().flatten().collect();
        if held.len() <= n - q {
            return Ok(());
        }
        let wait = time_until_at_most(held, n - q).map_or(max_wait, |d| d.min(max_wait));
        let _ = tokio::time::timeout(wait, subscription.released()).await;
        drop(registrations);
        Ok(())
    }
}
