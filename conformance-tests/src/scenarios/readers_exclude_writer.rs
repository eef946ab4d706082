use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// While readers hold a key, a writer is refused (`try_acquire` answers `None`) and a
/// waiting writer stays out until the last reader releases; then it gets in, promptly when
/// the backend declares notifications, with a token above every reader's.
pub async fn readers_exclude_writer(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("read");
    let ttl = h.ttl();
    let c = clients(&*h, 3).await?;
    let notified = c[0].capabilities().notifications;
    let r0 = c[0].lock(&key).shared().ttl(ttl * 20).acquire().await?;
    let r1 = c[1].lock(&key).shared().ttl(ttl * 20).acquire().await?;
    check!(
        c[2].lock(&key).ttl(ttl * 20).try_acquire().await?.is_none(),
        "a writer got in while two readers held the key"
    );
    let inside = Arc::new(AtomicBool::new(false));
    let writer = {
        let (client, key, inside) = (c[2].clone(), key.clone(), inside.clone());
        tokio::spawn(async move {
            // Its TTL keeps its naps far above the bound below.
            let g = client
                .lock(&key)
                .ttl(ttl * 40)
                .wait(ttl * 60)
                .acquire()
                .await?;
            inside.store(true, Ordering::SeqCst);
            Ok::<_, lockcore::LockError>((Instant::now(), g))
        })
    };
    // Time for the writer to find the key held (not a synchronisation).
    tokio::time::sleep(ttl).await;
    check!(
        !inside.load(Ordering::SeqCst),
        "the waiting writer got in while two readers held the key"
    );
    let first_reader = r0.token();
    r0.release().await?;
    tokio::time::sleep(ttl / 2).await;
    check!(
        !inside.load(Ordering::SeqCst),
        "the waiting writer got in while a reader still held the key"
    );
    let second_reader = r1.token();
    let released = Instant::now();
    r1.release().await?;
    let (at, g) = writer
        .await
        .map_err(|e| Failure(format!("writer task panicked: {e}")))??;
    let waited = at.saturating_duration_since(released);
    check!(
        g.token() > first_reader && g.token() > second_reader,
        "the writer's token {} is not above the readers' {first_reader} and {second_reader}",
        g.token()
    );
    if notified {
        check!(
            waited <= ttl * 4,
            "the writer got in {waited:?} after the last reader's release (bound {:?})",
            ttl * 4
        );
    }
    g.release().await?;
    Ok(())
}
