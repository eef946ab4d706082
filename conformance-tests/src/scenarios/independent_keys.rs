use std::sync::Arc;
use std::time::Instant;

use crate::scenarios::{clients, Keys};
use crate::{check, Harness, Outcome};

/// Holding one key never delays another: distinct keys are granted at once to different
/// owners, concurrently.
pub async fn independent_keys(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl() * 20;
    let c = clients(&*h, 2).await?;
    let held = c[0].lock(keys.key("one")).ttl(ttl).acquire().await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (client, key) = (c[i % 2].clone(), keys.key(&format!("other-{i}")));
        tasks.push(tokio::spawn(async move {
            client.lock(key).ttl(ttl).try_acquire().await
        }));
    }
    let mut guards = Vec::new();
    for t in tasks {
        let g = t
            .await
            .map_err(|e| crate::Failure(format!("task panicked: {e}")))??;
        let Some(g) = g else {
            return Err(crate::Failure("a free key was reported held".into()));
        };
        guards.push(g);
    }
    check!(
        started.elapsed() < h.ttl() * 5,
        "16 free keys took {:?}",
        started.elapsed()
    );
    for g in guards {
        g.release().await?;
    }
    held.release().await?;
    Ok(())
}
