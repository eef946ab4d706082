use std::sync::Arc;
use std::time::Instant;

use lockcore::LockClient;

use crate::scenarios::observed::Observed;
use crate::scenarios::{clients, Keys};
use crate::{check, Harness, Outcome};

/// How many holds the watchdog renews beside the unrenewed one.
const RENEWED: usize = 4;

/// A hold nobody renews (watchdog off, never extended) expires after its TTL even while
/// the same client's other holds of the same TTL are renewed: a driver that renews holds
/// through one shared lease or session (one keep-alive for many keys) must not carry along
/// a key whose own holder stopped renewing it. Another client waiting for that key gets it
/// within twice its TTL, while the renewed holds stay held.
pub async fn unrenewed_hold_expires_beside_renewed(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let observed = Arc::new(Observed::new(c[0].backend().clone()));
    let client = LockClient::new(observed.clone());
    let mut renewed = Vec::new();
    for i in 0..RENEWED {
        renewed.push(
            client
                .lock(keys.key(&format!("renewed-{i}")))
                .ttl(ttl)
                .acquire()
                .await?,
        );
    }
    let effective = renewed[0].lease().ttl();
    // A renewal round first, so that whatever the store renews by (a shared lease, a
    // session) exists before the unrenewed hold is taken.
    observed
        .renewed_since(observed.extends(), effective * 3)
        .await?;
    let quiet = keys.key("unrenewed");
    let g = client
        .lock(&quiet)
        .ttl(ttl)
        .watchdog(false)
        .acquire()
        .await?;
    let taken = Instant::now();
    let lease = g.lease().ttl();
    let renewals = observed.extends();
    let bound = lease * 2;
    let other = c[1].lock(&quiet).ttl(ttl).wait(bound * 2).acquire().await;
    let waited = taken.elapsed();
    let renewed_meanwhile = observed.extends() - renewals;
    check!(
        other.is_ok(),
        "a hold nobody renewed (TTL {lease:?}) was still held {waited:?} after it was \
         taken, while {renewed_meanwhile} renewals of the same client's other holds were \
         sent: {:?}",
        other.as_ref().err()
    );
    check!(
        waited <= bound,
        "a hold nobody renewed (TTL {lease:?}) was taken over only {waited:?} after it was \
         taken (bound {bound:?}), while the same client's other holds were renewed"
    );
    check!(
        renewed_meanwhile > 0,
        "no renewal of the other holds was sent while the unrenewed hold lived: the \
         scenario proved nothing (watchdog interval {:?})",
        effective / 3
    );
    for (i, g) in renewed.iter().enumerate() {
        check!(
            !g.is_lost(),
            "renewed hold {i} was lost while another hold expired beside it"
        );
    }
    drop(g);
    if let Ok(taken_over) = other {
        taken_over.release().await?;
    }
    for g in renewed {
        g.release().await?;
    }
    Ok(())
}
