use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scenarios::{clients, is_free, Keys};
use crate::{check, Failure, Harness, Outcome};

/// A set acquisition dropped while it waits for a key held by another client leaves
/// nothing held: its free key is free again within a bound, long before its lease would
/// end. Key by key, the set holds its free (first) key while it waits; in one request, a
/// refused set holds nothing at all, so the free key must never be seen held.
pub async fn dropped_key_set_leaves_nothing(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let (first, busy) = (keys.key("a-first"), keys.key("b-busy"));
    let c = clients(&*h, 2).await?;
    let held = c[1].lock(&busy).ttl(ttl * 60).acquire().await?;
    let set = c[0]
        .lock_all([busy.clone(), first.clone()])
        .ttl(ttl * 60)
        .acquire();
    let mut set = Box::pin(set);
    // Polled until it holds the free key (key by key), or for a while (in one request it
    // never does).
    let limit = Instant::now() + ttl * 4;
    while Instant::now() < limit {
        tokio::select! {
            r = &mut set => return Err(Failure(format!(
                "the set answered while one of its keys was held by another client: {:?}",
                r.map(|g| g.guards().len())
            ))),
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        if c[1].inspect(&first).await?.is_some() {
            break;
        }
    }
    drop(set);
    let dropped = Instant::now();
    loop {
        if is_free(&c[1], &first, ttl).await? {
            break;
        }
        check!(
            dropped.elapsed() < ttl * 10,
            "the dropped set left its first key held for {:?} (a 60 TTL lease)",
            dropped.elapsed()
        );
        tokio::time::sleep(ttl / 10).await;
    }
    held.release().await?;
    Ok(())
}
