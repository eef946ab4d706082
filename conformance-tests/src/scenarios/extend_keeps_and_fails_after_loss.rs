use std::sync::Arc;
use std::time::Instant;

use lockcore::driver::LockBackendExt;
use lockcore::LockError;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Extending by the owner keeps the lock past its first TTL; after the lock expired and was
/// taken over, extend fails with `NotHeld` and never takes the lock back; extending a key
/// nobody holds never creates it, nor revives a lease that ran out.
pub async fn extend_keeps_and_fails_after_loss(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("extended");
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let a = c[0].lock(&key).ttl(ttl).watchdog(false).acquire().await?;
    let effective = a.lease().ttl();
    // A stall that lets the lease run out on this clock before an extension's answer is in
    // (a loaded machine) makes a lost() at that moment legitimate: only a loss while every
    // extension came in time is a failure.
    let mut late = false;
    for _ in 0..4 {
        tokio::time::sleep(effective / 3).await;
        let lost_at = a.valid_until() - lockcore::driver::lost_margin(effective);
        a.extend().await?;
        late |= Instant::now() >= lost_at;
    }
    // 4/3 of a TTL have passed: only the extensions keep it.
    check!(
        c[1].lock(&key).ttl(ttl).try_acquire().await?.is_none(),
        "an extended lock was free after its first TTL"
    );
    check!(
        late || !a.is_lost(),
        "lost() fired although every extension succeeded in time"
    );
    let b = c[1]
        .lock(&key)
        .ttl(ttl * 20)
        .wait(effective * 10)
        .acquire()
        .await?;
    match a.extend().await {
        Err(LockError::NotHeld { key: lost }) if lost.as_str() == key => {}
        other => {
            return Err(Failure(format!(
                "extend after take-over answered {other:?}, expected NotHeld"
            )))
        }
    }
    check!(
        a.is_lost(),
        "extend found the lock gone but lost() did not fire"
    );
    let info = c[1].inspect(&key).await?;
    check!(
        info.map(|i| i.token) == Some(b.token()),
        "a failed extend disturbed the new holder"
    );
    b.release().await?;
    // Never creating: a renewal of a key nobody holds (released, or never taken) fails and
    // leaves it free; it must not resurrect the lock.
    let free = lockcore::LockKey::new(keys.key("never-held"))?;
    let ghost = lockcore::Owner::new("ghost");
    let outcome = c[0].backend().extend(&free, &ghost, ttl * 10).await?;
    check!(
        outcome == lockcore::driver::ExtendOutcome::NotHeld,
        "extend of a free key answered {outcome:?}"
    );
    check!(
        c[1].inspect(free.as_str()).await?.is_none(),
        "extend of a free key created it"
    );
    // Nor does it revive a lease that ran out with nobody taking the key meanwhile: the
    // holder lost it at its expiry, whoever came next.
    let lapsed = c[0]
        .lock(keys.key("lapsed"))
        .ttl(ttl)
        .watchdog(false)
        .acquire()
        .await?;
    let lapsed_ttl = lapsed.lease().ttl();
    tokio::time::sleep(lapsed_ttl + lapsed_ttl / 2).await;
    let outcome = c[0]
        .backend()
        .extend(lapsed.key(), lapsed.owner(), ttl * 10)
        .await?;
    check!(
        outcome == lockcore::driver::ExtendOutcome::NotHeld,
        "extend of a lease that had run out answered {outcome:?}, expected NotHeld"
    );
    drop(lapsed);
    Ok(())
}
