use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::FencingToken;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Many campaigners on several clients take turns leading one election: never two leaders
/// at once, and each new leader's term is above the last one's.
pub async fn election_one_leader_at_a_time(h: Arc<dyn Harness>) -> Outcome {
    const CLIENTS: usize = 3;
    const TASKS_PER_CLIENT: usize = 2;
    const ROUNDS: usize = 4;
    let keys = Keys::new();
    let key = keys.key("election");
    let ttl = h.ttl() * 20;
    let leading = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let terms: Arc<Mutex<Vec<FencingToken>>> = Arc::default();
    let mut tasks = Vec::new();
    for (c, client) in clients(&*h, CLIENTS).await?.into_iter().enumerate() {
        for t in 0..TASKS_PER_CLIENT {
            let (client, key) = (client.clone(), key.clone());
            let (leading, overlaps, terms) = (leading.clone(), overlaps.clone(), terms.clone());
            tasks.push(tokio::spawn(async move {
                let election = client.election(&key).ttl(ttl).wait(ttl * 10);
                for round in 0..ROUNDS {
                    let leadership = election.campaign(format!("node-{c}.{t}/{round}")).await?;
                    if leading.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    terms
                        .lock()
                        .map_err(|_| lockcore::LockError::config("poisoned"))?
                        .push(leadership.term());
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    leading.fetch_sub(1, Ordering::SeqCst);
                    leadership.resign().await?;
                }
                Ok::<(), lockcore::LockError>(())
            }));
        }
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure(format!("campaigner panicked: {e}")))??;
    }
    check!(
        overlaps.load(Ordering::SeqCst) == 0,
        "{} times two leaders at once",
        overlaps.load(Ordering::SeqCst)
    );
    let terms = terms
        .lock()
        .map_err(|_| Failure("terms poisoned".into()))?
        .clone();
    check!(
        terms.len() == CLIENTS * TASKS_PER_CLIENT * ROUNDS,
        "{} terms for {} campaigns",
        terms.len(),
        CLIENTS * TASKS_PER_CLIENT * ROUNDS
    );
    check!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms did not rise from leader to leader: {terms:?}"
    );
    Ok(())
}
