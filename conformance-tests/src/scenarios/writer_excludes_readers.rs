use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::ClaimMode;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// While a writer holds a key, readers are refused (`try_acquire` answers `None`) and
/// waiting readers stay out; after the writer's release they all get in, promptly when the
/// backend declares notifications, each with a token above the writer's.
pub async fn writer_excludes_readers(h: Arc<dyn Harness>) -> Outcome {
    const READERS: usize = 3;
    let keys = Keys::new();
    let key = keys.key("written");
    let ttl = h.ttl();
    let c = clients(&*h, READERS + 1).await?;
    let notified = c[0].capabilities().notifications;
    let writer = c[READERS].lock(&key).ttl(ttl * 20).acquire().await?;
    for (i, client) in c.iter().take(READERS).enumerate() {
        let refused = client
            .lock(&key)
            .shared()
            .ttl(ttl * 20)
            .try_acquire()
            .await?;
        check!(
            refused.is_none(),
            "reader {i} got in while a writer held the key"
        );
    }
    // Readers that wait: they must stay out until the writer releases. Their TTL keeps
    // their naps (half of it at most) far above the bound below, so a reader nobody wakes
    // is caught.
    let waiting: Vec<_> = c
        .iter()
        .take(READERS)
        .map(|client| {
            let (client, key) = (client.clone(), key.clone());
            tokio::spawn(async move {
                let g = client
                    .lock(&key)
                    .shared()
                    .ttl(ttl * 40)
                    .wait(ttl * 60)
                    .acquire()
                    .await?;
                Ok::<_, lockcore::LockError>((Instant::now(), g))
            })
        })
        .collect();
    // Time for the readers to find the key held (not a synchronisation: a reader that has
    // not tried yet simply comes in after the release).
    tokio::time::sleep(ttl).await;
    let all = c[0].inspect_all(&key).await?;
    check!(
        all.len() == 1 && all[0].claim.mode() == ClaimMode::Exclusive,
        "while the writer holds the key, inspect_all shows {all:?}"
    );
    for (i, w) in waiting.iter().enumerate() {
        check!(
            !w.is_finished(),
            "waiting reader {i} finished while the writer held the key"
        );
    }
    let released = Instant::now();
    let writer_token = writer.token();
    writer.release().await?;
    let mut guards = Vec::with_capacity(READERS);
    let mut latest = Duration::ZERO;
    for (i, w) in waiting.into_iter().enumerate() {
        let (at, g) = w
            .await
            .map_err(|e| Failure(format!("reader task panicked: {e}")))??;
        check!(
            g.token() > writer_token,
            "reader {i} has token {}, not above the writer's {writer_token}",
            g.token()
        );
        latest = latest.max(at.saturating_duration_since(released));
        guards.push(g);
    }
    if notified {
        check!(
            latest <= ttl * 4,
            "the last reader got in {latest:?} after the writer's release (bound {:?})",
            ttl * 4
        );
    }
    let all = c[0].inspect_all(&key).await?;
    check!(
        all.len() == READERS,
        "after the release {} of {READERS} readers hold the key together: {all:?}",
        all.len()
    );
    for g in guards {
        g.release().await?;
    }
    Ok(())
}
