use std::sync::Arc;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Thousands of keys are acquired, held together and released through one client with
/// bounded concurrency, then all are free again.
pub async fn many_keys(h: Arc<dyn Harness>) -> Outcome {
    const KEYS: usize = 2000;
    const CONCURRENCY: usize = 32;
    let keys = Keys::new();
    let ttl = h.ttl() * 100;
    let c = clients(&*h, 2).await?;
    let names: Arc<Vec<String>> = Arc::new((0..KEYS).map(|i| keys.key(&format!("k{i}"))).collect());
    let mut tasks = Vec::new();
    for t in 0..CONCURRENCY {
        let (client, names) = (c[0].clone(), names.clone());
        tasks.push(tokio::spawn(async move {
            let mut guards = Vec::new();
            for name in names.iter().skip(t).step_by(CONCURRENCY) {
                match client.lock(name).ttl(ttl).try_acquire().await? {
                    Some(g) => guards.push(g),
                    None => return Err(Failure(format!("free key {name:?} was held"))),
                }
            }
            Ok::<_, Failure>(guards)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(
            t.await
                .map_err(|e| Failure(format!("task panicked: {e}")))??,
        );
    }
    check!(all.len() == KEYS, "{} of {KEYS} keys acquired", all.len());
    for i in [0, KEYS / 2, KEYS - 1] {
        check!(
            c[1].inspect(&names[i]).await?.is_some(),
            "{:?} is not held",
            names[i]
        );
    }
    let mut tasks = Vec::new();
    let mut chunks: Vec<Vec<_>> = (0..CONCURRENCY).map(|_| Vec::new()).collect();
    for (i, g) in all.into_iter().enumerate() {
        chunks[i % CONCURRENCY].push(g);
    }
    for chunk in chunks {
        tasks.push(tokio::spawn(async move {
            for g in chunk {
                g.release().await?;
            }
            Ok::<_, lockcore::LockError>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| Failure(format!("task panicked: {e}")))??;
    }
    for i in [0, KEYS / 3, KEYS - 1] {
        check!(
            c[1].inspect(&names[i]).await?.is_none(),
            "{:?} is still held",
            names[i]
        );
    }
    Ok(())
}
