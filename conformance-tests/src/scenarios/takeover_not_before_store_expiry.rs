use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// Time zones the store's sessions are put in, in minutes east of UTC: none, one ahead and
/// one behind, both off the hour (so a zone handled in whole hours shows too).
const ZONES: [i32; 3] = [0, 5 * 60 + 45, -(9 * 60 + 30)];

/// A lock whose holder stops renewing is taken over no earlier than its lease's expiry by
/// the store's clock — never before the TTL the store applied has passed since the
/// request was sent — and soon after it; also with the store's sessions in a time zone
/// ahead of or behind UTC, where the store has one (an expiry written by one clock and
/// judged by the other makes a lock expire hours early or never).
pub async fn takeover_not_before_store_expiry(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let ttl = h.ttl();
    let mut outcome = Ok(());
    for zone in ZONES {
        if zone != 0 && !store.set_time_zone(zone).await? {
            continue;
        }
        outcome = take_over(&*store, &keys.key(&format!("zone{zone}")), ttl, zone).await;
        if outcome.is_err() {
            break;
        }
    }
    // Back to UTC whatever happened: the store may be shared by the scenario's later steps.
    store.set_time_zone(0).await?;
    outcome
}

/// One holder that never renews and one client polling for the key: the take-over comes
/// after the lease and within a bound.
async fn take_over(store: &dyn crate::FaultStore, key: &str, ttl: Duration, zone: i32) -> Outcome {
    // Clients opened after the zone was set: their sessions are in it.
    let a = store.client().await?;
    let b = store.client().await?;
    let sent = Instant::now();
    let held = a
        .client
        .lock(key)
        .ttl(ttl)
        .watchdog(false)
        .acquire()
        .await?;
    let applied = held.lease().ttl();
    // The store's expiry (a millisecond clock may round it down by one tick).
    let earliest = applied.saturating_sub(Duration::from_millis(2));
    let bound = applied * 4 + Duration::from_secs(2);
    loop {
        let probe = b.client.lock(key).ttl(ttl).try_acquire().await?;
        let at = sent.elapsed();
        if let Some(next) = probe {
            check!(
                at >= earliest,
                "with the store's sessions {zone} minutes off UTC, a lock of {applied:?} was \
                 taken over {at:?} after its request was sent: before its lease ended"
            );
            next.release().await?;
            break;
        }
        check!(
            at < bound,
            "with the store's sessions {zone} minutes off UTC, a lock of {applied:?} whose \
             holder stopped renewing was not taken over within {bound:?}"
        );
        tokio::time::sleep(ttl / 20).await;
    }
    let _ = held.release().await;
    Ok(())
}
