//! The renewal watchdog: one per hold, renewing at `ttl / 3`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::guard::Hold;
use crate::lease::{lost_margin, valid_until};
use crate::{ExtendOutcome, LockBackend};

/// Renews `hold` every `ttl / 3` until it is released, and marks it lost at the first
/// `NotHeld` or when renewals have failed until `valid_until − margin`. Without `renew`,
/// only the expiry signal runs.
pub(crate) async fn run(backend: Arc<dyn LockBackend>, hold: Arc<Hold>, renew: bool) {
    let stop = hold.stopped().clone();
    let interval = hold.ttl / 3;
    // Each attempt must end before the next is due, so a hung store cannot hold up the
    // expiry check.
    let attempt_timeout = (hold.ttl / 4).max(Duration::from_millis(1));
    let margin = lost_margin(hold.ttl);
    let mut next = Instant::now() + interval;
    loop {
        let lost_at = hold
            .valid_until()
            .checked_sub(margin)
            .unwrap_or_else(Instant::now);
        let wake = if renew { next.min(lost_at) } else { lost_at };
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
        // Re-read: a manual extend may have moved the end of the lease while we slept.
        let lost_at = hold
            .valid_until()
            .checked_sub(margin)
            .unwrap_or_else(Instant::now);
        if Instant::now() >= lost_at {
            hold.mark_lost();
            return;
        }
        if !renew || Instant::now() < next {
            continue;
        }
        let started = Instant::now();
        let attempt = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(attempt_timeout, backend.extend(&hold.key, &hold.owner, hold.ttl)) => r,
        };
        match attempt {
            Ok(Ok(ExtendOutcome::Extended(grant))) => {
                hold.set_valid_until(
                    valid_until(started, grant.ttl, grant.valid_until).max(hold.valid_until()),
                );
                next = started + interval;
            }
            Ok(Ok(ExtendOutcome::NotHeld)) => {
                hold.mark_lost();
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(key = %hold.key, error = %e, "lock renewal failed; retrying");
                next = Instant::now() + interval / 4;
            }
            Err(_) => {
                tracing::warn!(key = %hold.key, timeout = ?attempt_timeout, "lock renewal timed out; retrying");
                next = Instant::now() + interval / 4;
            }
        }
    }
}
