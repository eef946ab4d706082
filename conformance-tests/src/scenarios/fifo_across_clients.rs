use std::sync::Arc;

use lockcore::LockClient;
use tokio::sync::mpsc;

use crate::scenarios::observed::Observed;
use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Waiters of the FIFO scenario, each on a client of its own.
const WAITERS: usize = 4;

/// On a backend that declares [`Fairness::Fifo`](lockcore::driver::Fairness::Fifo): waiters of
/// different clients (as different processes would be) are served in the order the store
/// first refused them, however slow each is to come back after a release; and a holder
/// that releases and asks again at once gets nothing while they wait.
pub async fn fifo_across_clients(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("fifo");
    let ttl = h.ttl();
    let c = clients(&*h, WAITERS + 1).await?;
    let holder_client = &c[WAITERS];
    let holder = holder_client.lock(&key).ttl(ttl * 30).acquire().await?;
    let limit = ttl * 30;
    let (served_tx, mut served) = mpsc::unbounded_channel::<usize>();
    let mut tasks = Vec::with_capacity(WAITERS);
    for (i, client) in c[..WAITERS].iter().enumerate() {
        // Every attempt after the first refusal is held back a while: a store that lets
        // whoever asks first in after a release would let the holder's next request in.
        let observed = Arc::new(Observed::new(client.backend().clone()).with_slow_retries(ttl / 4));
        let waiting = LockClient::new(observed.clone());
        let (key, served_tx) = (key.clone(), served_tx.clone());
        tasks.push(tokio::spawn(async move {
            let guard = waiting.lock(&key).ttl(ttl * 30).wait(limit).acquire().await;
            let outcome = match guard {
                Ok(guard) => {
                    // Told before the release: the order told is the order served.
                    let _ = served_tx.send(i);
                    guard.release().await.map(drop)
                }
                Err(e) => Err(e),
            };
            waiting.shutdown().await;
            outcome
        }));
        // The next waiter asks only once the store has refused this one (its place taken).
        observed.refused_within(ttl * 10).await?;
    }
    drop(served_tx);
    holder.release().await?;
    let again = holder_client.lock(&key).ttl(ttl * 30).try_acquire().await?;
    let barged = again.as_ref().map(|g| g.token());
    drop(again);
    check!(
        barged.is_none(),
        "the holder released and asked again at once, and got the key (token {barged:?}) before {WAITERS} clients that were waiting for it"
    );
    let mut order = Vec::with_capacity(WAITERS);
    while let Ok(Some(i)) = tokio::time::timeout(limit, served.recv()).await {
        order.push(i);
    }
    for task in tasks {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(Failure(format!(
                    "a waiter failed after being served in the order {order:?}: {e}"
                )))
            }
            Err(e) => return Err(Failure(format!("a waiter's task failed: {e}"))),
        }
    }
    let arrival: Vec<usize> = (0..WAITERS).collect();
    check!(
        order == arrival,
        "waiters that queued in the order {arrival:?} were served in the order {order:?}"
    );
    Ok(())
}
