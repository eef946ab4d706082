use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Waiters on other clients acquire promptly after the holder releases, long before the
/// holder's TTL would have run out (bounded hand-off latency), and each waiter in turn
/// gets the lock when the one before it releases.
pub async fn waiter_acquires_after_release(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("handoff");
    let ttl = h.ttl();
    let c = clients(&*h, 3).await?;
    let notified = c[0].capabilities().notifications;
    for round in 0..3 {
        let a = c[0].lock(&key).ttl(ttl * 30).acquire().await?;
        let waiters: Vec<_> = (1..3)
            .map(|i| {
                let (client, key) = (c[i].clone(), key.clone());
                tokio::spawn(async move {
                    let g = client
                        .lock(&key)
                        .ttl(ttl * 30)
                        .wait(ttl * 25)
                        .acquire()
                        .await?;
                    let at = Instant::now();
                    g.release().await?;
                    Ok::<_, lockcore::LockError>(at)
                })
            })
            .collect();
        // Let the waiters fail their first try and go to sleep on the backend's signal.
        tokio::time::sleep(ttl / 2).await;
        let released = Instant::now();
        a.release().await?;
        let mut first: Option<Duration> = None;
        for w in waiters {
            let at = w
                .await
                .map_err(|e| Failure(format!("waiter panicked: {e}")))??;
            let gap = at.saturating_duration_since(released);
            first = Some(first.map_or(gap, |f| f.min(gap)));
        }
        let gap = first.unwrap_or_default();
        // Notifying backends hand over in a fraction of a TTL; polling ones within their
        // poll interval (100 ms at most); a waiter that sleeps through the release would
        // take the holder's whole TTL (30 ttl).
        let bound = if notified {
            ttl
        } else {
            ttl + Duration::from_millis(250)
        };
        check!(
            gap <= bound,
            "round {round}: hand-off took {gap:?} (bound {bound:?})"
        );
    }
    Ok(())
}
