use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Two clients take the same three keys as a set over and over, one naming them in one
/// order and the other in the reverse order, each holding its set while the other waits:
/// both finish, and no set waits long for the other's (no deadlock, no waiter sleeping
/// through a release).
pub async fn key_sets_in_opposite_orders_finish(h: Arc<dyn Harness>) -> Outcome {
    const ROUNDS: u32 = 8;
    let keys = Keys::new();
    let ttl = h.ttl();
    let names = [keys.key("x"), keys.key("y"), keys.key("z")];
    let c = clients(&*h, 2).await?;
    let notified = c[0].capabilities().notifications;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (n, client) in c.into_iter().enumerate() {
        let mut order = names.to_vec();
        if n == 1 {
            order.reverse();
        }
        tasks.push(tokio::spawn(async move {
            let mut longest = Duration::ZERO;
            for _ in 0..ROUNDS {
                let asked = Instant::now();
                // A lease far longer than the bound: a waiter that slept through a release
                // would wait it out.
                let set = client
                    .lock_all(order.clone())
                    .ttl(ttl * 30)
                    .wait(ttl * 25)
                    .acquire()
                    .await?;
                longest = longest.max(asked.elapsed());
                tokio::time::sleep(ttl / 10).await;
                set.release().await?;
            }
            Ok::<Duration, lockcore::LockError>(longest)
        }));
    }
    let mut longest = Duration::ZERO;
    for t in tasks {
        let waited = t
            .await
            .map_err(|e| Failure(format!("task panicked: {e}")))??;
        longest = longest.max(waited);
    }
    let took = started.elapsed();
    // The other client holds its set a tenth of a TTL at a time, eight times: even served
    // last every time, a set waits under a TTL plus its hand-overs, each prompt where
    // releases are signalled, and within three polls (100 ms at most each) where they are
    // polled. A waiter that sleeps through a release waits a good part of the 30 TTL lease.
    let polls = if notified {
        Duration::ZERO
    } else {
        Duration::from_millis(300) * ROUNDS
    };
    let bound = ttl * 3 + polls;
    check!(
        longest <= bound,
        "a set waited {longest:?} for the other client's (bound {bound:?}); all 16 took {took:?}"
    );
    Ok(())
}
