use std::sync::Arc;
use std::time::Instant;

use lockcore::driver::{ExtendOutcome, Renewal};
use lockcore::LockKey;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// A reader's lease that lapsed (nobody renewed it) is not renewed by a later batch, even
/// while another reader's lease keeps the key read-locked: the batch answers `NotHeld` for
/// it and `Extended` for the live lease beside it. A driver that asks whether the key is
/// read-locked, rather than whether this owner's lease lives, hands the lapsed reader a
/// lease it no longer had, and a writer may have come and gone meanwhile.
pub async fn lapsed_lease_not_renewed(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let name = keys.key("lapsed");
    let key = LockKey::new(name.as_str())?;
    let ttl = h.ttl();
    // One client holds both leases: a renewal goes through the backend that granted it.
    let c = clients(&*h, 1).await?;
    let lapsing = c[0].new_owner();
    let living = c[0].new_owner();
    let quiet = c[0]
        .lock(name.as_str())
        .owner(lapsing.clone())
        .shared()
        .ttl(ttl)
        .watchdog(false)
        .acquire()
        .await?;
    let live = c[0]
        .lock(name.as_str())
        .owner(living.clone())
        .shared()
        .ttl(ttl * 20)
        .acquire()
        .await?;
    // Until the store no longer counts the unrenewed lease among the key's holders.
    let lease = quiet.lease().ttl();
    let limit = Instant::now() + lease * 3;
    loop {
        let holders = c[0].inspect_all(name.as_str()).await?;
        if holders.len() == 1 {
            break;
        }
        if Instant::now() > limit {
            return Err(Failure(format!(
                "an unrenewed read lease (TTL {lease:?}) was still counted {:?} after it was \
                 taken: {} holders",
                lease * 3,
                holders.len()
            )));
        }
        tokio::time::sleep(lease / 10).await;
    }
    let renewals = [
        Renewal::new(&key, &lapsing, ttl),
        Renewal::new(&key, &living, ttl * 20),
    ];
    let answers = c[0].backend().renew(&renewals).await?;
    let mut answers = answers.into_iter();
    let lapsed = answers.next();
    check!(
        matches!(lapsed, Some(Ok(ExtendOutcome::NotHeld))),
        "a batch renewed a read lease that had lapsed, while another reader kept the key \
         read-locked: {lapsed:?}"
    );
    let kept = answers.next();
    check!(
        matches!(&kept, Some(Ok(ExtendOutcome::Extended(g))) if g.token == live.token()),
        "the live read lease beside it answered {kept:?}"
    );
    let holders = c[0].inspect_all(name.as_str()).await?;
    check!(
        holders.len() == 1,
        "after the batch the key has {} holders, not the one live reader",
        holders.len()
    );
    live.release().await?;
    drop(quiet);
    Ok(())
}
