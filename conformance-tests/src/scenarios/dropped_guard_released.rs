use std::sync::Arc;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// A guard dropped without `release()` (even on a thread with no runtime) is released in
/// the background, long before its TTL; `shutdown()` waits for that release.
pub async fn dropped_guard_released(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;

    let key = keys.key("dropped");
    let g = c[0].lock(&key).ttl(ttl * 60).acquire().await?;
    drop(g);
    let b = c[1]
        .lock(&key)
        .ttl(ttl * 10)
        .wait(ttl * 5)
        .acquire()
        .await?;
    b.release().await?;

    let key = keys.key("dropped-off-runtime");
    let g = c[0].lock(&key).ttl(ttl * 60).acquire().await?;
    std::thread::spawn(move || drop(g))
        .join()
        .map_err(|_| Failure("drop panicked".into()))?;
    c[0].shutdown().await;
    check!(
        c[1].inspect(&key).await?.is_none(),
        "shutdown() returned before the dropped guard's release"
    );
    Ok(())
}
