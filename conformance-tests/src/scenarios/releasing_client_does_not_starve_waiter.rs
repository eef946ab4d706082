use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockcore::LockClient;

use crate::scenarios::observed::Observed;
use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// How long the releasing client holds the key each time.
const HOLD: Duration = Duration::from_millis(10);

/// How long the waiter waits at most, after a refusal, for the releasing client's next
/// request to be answered before it asks again (only if that client stopped asking).
const BEHIND_AT_MOST: Duration = Duration::from_millis(200);

/// Grants to the releasing client that the waiter may see go by: those of its first
/// [`STARVING_AFTER`](lockcore::driver::STARVING_AFTER) (one per `HOLD`, 2), before it asks to be next, many times over for a
/// scheduler that runs the waiter late.
const BYPASS_BOUND: usize = 40;

/// On a backend that declares [`Fairness::Bounded`](lockcore::driver::Fairness::Bounded) or
/// [`Fairness::Fifo`](lockcore::driver::Fairness::Fifo): one client takes the key, holds it a
/// moment, releases it and asks again at once, over and over (a worker looping on one
/// key); another client's waiter is served after at most a bounded number of those grants,
/// well within its deadline. A store where whoever asks first after a release wins lets
/// the releasing client in every time, and the waiter reaches its deadline.
pub async fn releasing_client_does_not_starve_waiter(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("starve");
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let releasing = Arc::new(Observed::new(c[0].backend().clone()));
    let greedy = LockClient::new(releasing.clone());
    // Always hears of a release after the releasing client has asked again, as a waiter
    // in another process does (whatever the scheduler does meanwhile): a store where
    // whoever asks first after a release wins never lets it in.
    let slow = Observed::new(c[1].backend().clone()).behind(releasing, BEHIND_AT_MOST);
    let patient = LockClient::new(Arc::new(slow));
    let first = greedy.lock(&key).ttl(ttl * 30).acquire().await?;
    let grants = Arc::new(AtomicUsize::new(0));
    let looping = {
        let (grants, key, greedy) = (grants.clone(), key.clone(), greedy.clone());
        tokio::spawn(async move {
            let mut guard = first;
            loop {
                tokio::time::sleep(HOLD).await;
                if let Err(e) = guard.release().await {
                    break e;
                }
                guard = match greedy.lock(&key).ttl(ttl * 30).acquire().await {
                    Ok(guard) => guard,
                    Err(e) => break e,
                };
                grants.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let deadline = ttl * 25;
    let served = patient
        .lock(&key)
        .ttl(ttl * 30)
        .wait(deadline)
        .acquire()
        .await;
    let bypassed = grants.load(Ordering::SeqCst);
    looping.abort();
    let looped = looping.await;
    if let Ok(e) = looped {
        return Err(Failure(format!(
            "the releasing client failed after {bypassed} grants: {e}"
        )));
    }
    let guard = match served {
        Ok(guard) => guard,
        Err(e) => {
            return Err(Failure(format!(
                "a waiter was never served while another client released and took the key again {bypassed} times: {e}"
            )))
        }
    };
    guard.release().await?;
    patient.shutdown().await;
    greedy.shutdown().await;
    check!(
        bypassed <= BYPASS_BOUND,
        "a waiter was served only after {bypassed} grants to another client that released and asked again at once (at most {BYPASS_BOUND})"
    );
    Ok(())
}
