use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use lockcore::{ClaimMode, LockError};

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// The semaphore's size.
const PERMITS: u32 = 3;
/// Many clients, many tasks each, a few rounds each.
const CLIENTS: usize = 4;
const TASKS: usize = 3;
const ROUNDS: usize = 5;

/// A semaphore of `n` permits never has more than `n` out, across many clients and tasks
/// (some taking 2 permits) measured by a shared occupancy counter with an `.await` inside
/// each hold; `n` permits can be out at once; every request is served.
pub async fn semaphore_never_exceeds_capacity(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let c = clients(&*h, CLIENTS).await?;

    // Exactly n: 1 + 2 permits fit, then nothing more; a released claim's permits come back.
    let key = keys.key("exact");
    let sem = |i: usize| c[i].semaphore(&key, PERMITS).ttl(ttl * 10);
    // One owner for every probe of client 2: a refused probe may leave a reservation until
    // lockcore abandons it, and a request of the same owner waits for that.
    let probe = c[2].new_owner();
    let Some(one) = sem(0).try_acquire().await? else {
        return Err(Failure(
            "the first permit of a free semaphore was refused".into(),
        ));
    };
    let Some(two) = sem(1).permits(2).try_acquire().await? else {
        return Err(Failure(format!(
            "2 more permits were refused with 1 of {PERMITS} out"
        )));
    };
    check!(
        sem(2).owner(probe.clone()).try_acquire().await?.is_none(),
        "a permit was granted with {PERMITS} of {PERMITS} out"
    );
    let all = c[3].inspect_all(&key).await?;
    let shown: Vec<_> = all
        .iter()
        .map(|i| {
            (
                i.claim.mode(),
                i.claim.semaphore_permits(),
                i.claim.capacity(),
            )
        })
        .collect();
    check!(
        shown
            == vec![
                (ClaimMode::Permits, Some(1), u64::from(PERMITS)),
                (ClaimMode::Permits, Some(2), u64::from(PERMITS))
            ],
        "inspect_all shows (mode, permits, capacity) {shown:?}"
    );
    two.release().await?;
    let Some(again) = sem(2).owner(probe.clone()).permits(2).try_acquire().await? else {
        return Err(Failure(
            "2 released permits did not come back to another client".into(),
        ));
    };
    check!(
        sem(3).permits(1).try_acquire().await?.is_none(),
        "a permit was granted with {PERMITS} of {PERMITS} out again"
    );
    one.release().await?;
    again.release().await?;

    // Under contention: the occupancy never exceeds n, and reaches it.
    let key = keys.key("contended");
    let in_use = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(CLIENTS * TASKS);
    for (i, client) in c.iter().enumerate() {
        for t in 0..TASKS {
            let (client, key) = (client.clone(), key.clone());
            let (in_use, most) = (in_use.clone(), most.clone());
            let permits = if (i * TASKS + t).is_multiple_of(3) {
                2
            } else {
                1
            };
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let g = client
                        .semaphore(&key, PERMITS)
                        .permits(permits)
                        .ttl(ttl * 10)
                        .wait(ttl * 40)
                        .acquire()
                        .await?;
                    let now =
                        in_use.fetch_add(u64::from(permits), Ordering::SeqCst) + u64::from(permits);
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    tokio::time::sleep(ttl / 10).await;
                    in_use.fetch_sub(u64::from(permits), Ordering::SeqCst);
                    g.release().await?;
                }
                Ok::<(), LockError>(())
            }));
        }
    }
    for t in tasks {
        t.await
            .map_err(|e| Failure(format!("task panicked: {e}")))??;
    }
    let most = most.load(Ordering::SeqCst);
    check!(
        most <= u64::from(PERMITS),
        "{most} permits of a semaphore of {PERMITS} were out at once"
    );
    check!(
        most == u64::from(PERMITS),
        "at most {most} of {PERMITS} permits were ever out at once: the semaphore admits too few"
    );
    Ok(())
}
