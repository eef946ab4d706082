use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Readers waiting behind a writer, each on its own client.
const READERS: usize = 4;

/// A release that frees room for many wakes enough of them: readers waiting on several
/// clients behind a writer all hold the key together soon after the writer's release (well
/// under the writer's TTL when the backend declares notifications), none sleeping until a
/// timeout: a granted reader passes the wake-up on.
pub async fn release_wakes_enough_waiters(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("wake-readers");
    let ttl = h.ttl();
    let c = clients(&*h, READERS + 1).await?;
    let notified = c[0].capabilities().notifications;
    // A reader nobody wakes sleeps until the writer's lease would have run out.
    let writer_ttl = ttl * 8;
    let writer = c[READERS].lock(&key).ttl(writer_ttl).acquire().await?;
    let inside = Arc::new(AtomicUsize::new(0));
    let arrived = Arc::new(Notify::new());
    let (leave, left) = watch::channel(false);
    let readers: Vec<_> = (0..READERS)
        .map(|i| {
            let (client, key) = (c[i].clone(), key.clone());
            let (inside, arrived, mut left) = (inside.clone(), arrived.clone(), left.clone());
            tokio::spawn(async move {
                let g = client
                    .lock(&key)
                    .shared()
                    .ttl(ttl * 40)
                    .wait(ttl * 40)
                    .acquire()
                    .await?;
                let at = Instant::now();
                inside.fetch_add(1, Ordering::SeqCst);
                arrived.notify_one();
                let _ = left.wait_for(|leave| *leave).await;
                g.release().await?;
                Ok::<_, lockcore::LockError>(at)
            })
        })
        .collect();
    // Time for the readers to find the key held and wait (not a synchronisation: a reader
    // that has not tried yet simply comes in after the release).
    tokio::time::sleep(ttl).await;
    let released = Instant::now();
    writer.release().await?;
    let together = tokio::time::timeout(ttl * 40, async {
        while inside.load(Ordering::SeqCst) < READERS {
            arrived.notified().await;
        }
    })
    .await;
    let holding = c[READERS].inspect_all(&key).await;
    leave.send_replace(true);
    let mut latest = Duration::ZERO;
    for r in readers {
        let at = r
            .await
            .map_err(|e| Failure(format!("reader task panicked: {e}")))??;
        latest = latest.max(at.saturating_duration_since(released));
    }
    check!(
        together.is_ok(),
        "only {} of {READERS} readers got in after the writer's release",
        inside.load(Ordering::SeqCst)
    );
    let holding = holding?;
    check!(
        holding.len() == READERS,
        "{} of {READERS} readers held the key together: {holding:?}",
        holding.len()
    );
    if notified {
        check!(
            latest <= ttl * 3,
            "the last reader got in {latest:?} after the writer's release (bound {:?}, writer's TTL {writer_ttl:?})",
            ttl * 3
        );
    }
    Ok(())
}
