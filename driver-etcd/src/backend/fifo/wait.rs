//! Waiting in a FIFO queue: for the deletion of the key just before ours, keeping our own
//! lease (and so our place) alive meanwhile.

use std::time::{Duration, Instant};

use etcd_client::EventType;
use lockcore::{LockError, LockKey, RetryPolicy, WaitHint};

use crate::backend::EtcdBackend;
use crate::watch::open_from_now;

/// How often a waiter's lease is refreshed, as a fraction of its TTL (lockcore's watchdog
/// renews holders at the same rate).
const REFRESH_FRACTION: u32 = 3;

/// The pause before a failed refresh of a waiter's lease is tried again: 100 ms each time.
const REFRESH_RETRY: RetryPolicy =
    RetryPolicy::doubling(Duration::from_millis(100), Duration::from_millis(100));

impl EtcdBackend {
    /// Waits for the deletion of the key before ours in the queue (release, expiry,
    /// abandon or break-lock), keeping our own lease alive meanwhile.
    pub(in crate::backend) async fn fifo_wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let deadline = tokio::time::Instant::now() + max_wait;
        let place = hint
            .revision()
            .and_then(|rev| {
                let places = self.places.lock().unwrap_or_else(|e| e.into_inner());
                places.by_rev(key, rev).cloned()
            })
            .filter(|p| !p.held);
        let Some((place, pred)) = place.and_then(|p| p.waits_for.clone().map(|w| (p, w))) else {
            // Not a place of ours (a hint of another backend): nothing to watch. Come back
            // soon rather than sleep through a release.
            let soon = tokio::time::Instant::now() + Duration::from_millis(50);
            tokio::time::sleep_until(deadline.min(soon)).await;
            return Ok(());
        };
        // Subscribed first, then re-checked. The watch starts at the store's current
        // revision rather than at `seen` (see `open_from_now`).
        let opened =
            tokio::time::timeout_at(deadline, open_from_now(&self.endpoints, &pred.key)).await;
        let mut stream = match opened {
            Err(_) | Ok(Ok(None)) => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Ok(Ok(Some((stream, at)))) => {
                if at > pred.seen {
                    // Written since: a deletion before the watch began shows as a missing
                    // key (or a newer place of the same name).
                    match self.get(&pred.key).await? {
                        (Some(kv), _) if kv.create_revision() == pred.rev => {}
                        _ => return Ok(()),
                    }
                }
                stream
            }
        };
        let Some(mut lease) = place.lease else {
            return Ok(());
        };
        // Our lease must outlive the wait, or the place goes with it.
        let refresh = async {
            let mut retry = REFRESH_RETRY.backoff();
            loop {
                let at = lease.refreshed + lease.ttl() / REFRESH_FRACTION;
                tokio::time::sleep_until(at.into()).await;
                let started = Instant::now();
                match self.leases.keep_alive(lease.id).await {
                    Ok(true) => {
                        lease.refreshed = started;
                        self.places
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .refreshed(key, &place.owner, place.rev, lease.id, started);
                    }
                    // Gone (revoked, expired): so is our key. The next attempt queues again.
                    Ok(false) => return,
                    Err(e) => {
                        tracing::debug!(key = %key, error = %lockcore::ErrorChain(&e), "etcd: cannot refresh a waiter's lease");
                        retry.pause().await;
                    }
                }
            }
        };
        tokio::pin!(refresh);
        loop {
            tokio::select! {
                biased;
                _ = pred.wake.notified() => return Ok(()),
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => {
                        if resp.canceled() {
                            // Compacted past `seen`, or the member is going away: look again.
                            tracing::debug!(key = %key, reason = resp.cancel_reason(), "etcd: watch cancelled");
                            return Ok(());
                        }
                        if resp.events().iter().any(|ev| ev.event_type() == EventType::Delete) {
                            return Ok(());
                        }
                    }
                    Ok(None) | Err(_) => return Ok(()),
                },
                _ = &mut refresh => return Ok(()),
                _ = tokio::time::sleep_until(deadline) => return Ok(()),
            }
        }
    }
}
