use std::sync::Arc;
use std::time::Instant;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Permits of a holder that dies without releasing (no renewal, no release) come back after
/// its TTL, not before and not much later, to a client that waits for them.
pub async fn dead_holder_permits_return(h: Arc<dyn Harness>) -> Outcome {
    const PERMITS: u32 = 3;
    let keys = Keys::new();
    let key = keys.key("dead-holder");
    let ttl = h.ttl();
    let c = clients(&*h, 3).await?;
    let live = c[0]
        .semaphore(&key, PERMITS)
        .ttl(ttl * 20)
        .acquire()
        .await?;
    // The dead holder: two permits, renewed by nobody, never released while it matters.
    let dead = c[1]
        .semaphore(&key, PERMITS)
        .permits(2)
        .ttl(ttl)
        .watchdog(false)
        .acquire()
        .await?;
    let died = Instant::now();
    let probe = c[2].new_owner();
    check!(
        c[2].semaphore(&key, PERMITS)
            .owner(probe.clone())
            .try_acquire()
            .await?
            .is_none(),
        "a permit was granted with {PERMITS} of {PERMITS} out"
    );
    let back = c[2]
        .semaphore(&key, PERMITS)
        .permits(2)
        .owner(probe)
        .ttl(ttl * 20)
        .wait(ttl * 20)
        .acquire()
        .await
        .map_err(|e| Failure(format!("the dead holder's permits never came back: {e}")))?;
    let after = died.elapsed();
    check!(
        after >= ttl / 2,
        "the dead holder's permits came back after {after:?}, before its TTL ({ttl:?})"
    );
    check!(
        after <= ttl * 4,
        "the dead holder's permits came back only after {after:?} (TTL {ttl:?})"
    );
    check!(
        back.token() > dead.token(),
        "the new holder's token {} is not above the dead holder's {}",
        back.token(),
        dead.token()
    );
    let held: u32 = c[0]
        .inspect_all(&key)
        .await?
        .iter()
        .filter_map(|i| i.claim.semaphore_permits())
        .sum();
    check!(
        held == PERMITS,
        "{held} permits are shown out, expected the live holder's 1 and the new holder's 2"
    );
    back.release().await?;
    live.release().await?;
    drop(dead);
    Ok(())
}
