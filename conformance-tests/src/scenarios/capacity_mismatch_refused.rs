use std::sync::Arc;
use std::time::Instant;

use crate::scenarios::{clients, config_error, Keys};
use crate::{check, Failure, Harness, Outcome};

/// A claim whose capacity differs from the key's is refused with a configuration error
/// naming both (a semaphore of 4 on one of 8, a plain or shared lock on a semaphore, a
/// semaphore on an exclusive lock), at once even when asked to wait, without redefining
/// the key; once the key is free, the other capacity takes it. (The shared lock is tried
/// when the backend declares shared claims.)
pub async fn capacity_mismatch_refused(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let shared = c[0].capabilities().shared;

    let sem_key = keys.key("semaphore-of-8");
    let eight = c[0].semaphore(&sem_key, 8).ttl(ttl * 20).acquire().await?;
    let text = config_error(
        "a semaphore of 4 on a semaphore of 8",
        c[1].semaphore(&sem_key, 4)
            .ttl(ttl * 20)
            .try_acquire()
            .await,
    )?;
    check!(
        text.contains("semaphore of 8") && text.contains("semaphore of 4"),
        "the error does not name both capacities: {text}"
    );
    let asked = Instant::now();
    let text = config_error(
        "a waiting semaphore of 4 on a semaphore of 8",
        c[1].semaphore(&sem_key, 4)
            .ttl(ttl * 20)
            .wait(ttl * 20)
            .acquire()
            .await,
    )?;
    check!(
        asked.elapsed() < ttl * 10,
        "a capacity mismatch was answered only after {:?}: it is no contention to wait out",
        asked.elapsed()
    );
    check!(
        text.contains("semaphore of 8"),
        "the error does not name the key's capacity: {text}"
    );
    let text = config_error(
        "an exclusive lock on a semaphore of 8",
        c[1].lock(&sem_key).ttl(ttl * 20).try_acquire().await,
    )?;
    check!(
        text.contains("semaphore of 8") && text.contains("exclusive"),
        "the error does not name both kinds: {text}"
    );
    if shared {
        let text = config_error(
            "a shared lock on a semaphore of 8",
            c[1].lock(&sem_key)
                .shared()
                .ttl(ttl * 20)
                .try_acquire()
                .await,
        )?;
        check!(
            text.contains("semaphore of 8") && text.contains("shared"),
            "the error does not name both kinds: {text}"
        );
    }
    // The key was not redefined: it is still a semaphore of 8 with 7 permits free.
    let Some(seven) = c[1]
        .semaphore(&sem_key, 8)
        .permits(7)
        .ttl(ttl * 20)
        .try_acquire()
        .await?
    else {
        return Err(Failure(
            "7 free permits of the semaphore of 8 were refused after the mismatches".into(),
        ));
    };
    let capacities: Vec<_> = c[1]
        .inspect_all(&sem_key)
        .await?
        .iter()
        .map(|i| i.claim.capacity())
        .collect();
    check!(
        capacities == [8, 8],
        "after the mismatches the key's leases show capacities {capacities:?}"
    );

    let lock_key = keys.key("exclusive");
    let lock = c[0].lock(&lock_key).ttl(ttl * 20).acquire().await?;
    let text = config_error(
        "a semaphore of 4 on an exclusive lock",
        c[1].semaphore(&lock_key, 4)
            .ttl(ttl * 20)
            .try_acquire()
            .await,
    )?;
    check!(
        text.contains("exclusive") && text.contains("semaphore of 4"),
        "the error does not name both kinds: {text}"
    );

    // Free keys take any capacity.
    eight.release().await?;
    seven.release().await?;
    lock.release().await?;
    let Some(four) = c[1]
        .semaphore(&sem_key, 4)
        .ttl(ttl * 20)
        .try_acquire()
        .await?
    else {
        return Err(Failure(
            "a semaphore of 4 was refused on the free key that was a semaphore of 8".into(),
        ));
    };
    let Some(sem) = c[1]
        .semaphore(&lock_key, 4)
        .ttl(ttl * 20)
        .try_acquire()
        .await?
    else {
        return Err(Failure(
            "a semaphore was refused on the free key that was an exclusive lock".into(),
        ));
    };
    let text = config_error(
        "a semaphore of 8 on the key now a semaphore of 4",
        c[0].semaphore(&sem_key, 8)
            .ttl(ttl * 20)
            .try_acquire()
            .await,
    )?;
    check!(
        text.contains("semaphore of 4") && text.contains("semaphore of 8"),
        "the error does not name both capacities: {text}"
    );
    four.release().await?;
    sem.release().await?;
    Ok(())
}
