use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Many clients on a multi-thread runtime run a read-modify-write with an `.await` between
/// read and write under the lock: no update is lost, no two holders overlap, and every new
/// holder's token is above the last one's (on a backend that hands out fencing tokens).
pub async fn mutual_exclusion(h: Arc<dyn Harness>) -> Outcome {
    const CLIENTS: usize = 4;
    const TASKS_PER_CLIENT: usize = 4;
    const ROUNDS: u64 = 10;
    let keys = Keys::new();
    let key = keys.key("counter");
    let ttl = h.ttl() * 20;
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let last_token = Arc::new(AtomicU64::new(0));
    let token_regressions = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    let clients = clients(&*h, CLIENTS).await?;
    let fenced = clients
        .first()
        .is_some_and(|c| c.capabilities().fencing != lockcore::driver::FencingGuarantee::None);
    for client in clients {
        for _ in 0..TASKS_PER_CLIENT {
            let (client, key) = (client.clone(), key.clone());
            let (counter, inside, overlaps) = (counter.clone(), inside.clone(), overlaps.clone());
            let (last_token, token_regressions) = (last_token.clone(), token_regressions.clone());
            let wait = ttl * 10;
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = client.lock(&key).ttl(ttl).wait(wait).acquire().await?;
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let t = guard.token().get();
                    if last_token.swap(t, Ordering::SeqCst) >= t {
                        token_regressions.fetch_add(1, Ordering::SeqCst);
                    }
                    let v = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    tokio::time::sleep(std::time::Duration::from_micros(200)).await;
                    counter.store(v + 1, Ordering::SeqCst);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await?;
                }
                Ok::<(), lockcore::LockError>(())
            }));
        }
    }
    for t in tasks {
        t.await
            .map_err(|e| Failure(format!("task panicked: {e}")))??;
    }
    let expected = (CLIENTS * TASKS_PER_CLIENT) as u64 * ROUNDS;
    check!(
        overlaps.load(Ordering::SeqCst) == 0,
        "{} overlapping holds",
        overlaps.load(Ordering::SeqCst)
    );
    check!(
        counter.load(Ordering::SeqCst) == expected,
        "lost updates: counter is {}, expected {expected}",
        counter.load(Ordering::SeqCst)
    );
    check!(
        !fenced || token_regressions.load(Ordering::SeqCst) == 0,
        "{} holders got a token not above their predecessor's",
        token_regressions.load(Ordering::SeqCst)
    );
    Ok(())
}
