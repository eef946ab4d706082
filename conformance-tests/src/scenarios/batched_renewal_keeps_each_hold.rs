use std::sync::Arc;

use lockcore::{LockClient, LockGuard, ReleaseOutcome};

use crate::scenarios::observed::Observed;
use crate::scenarios::{clients, is_free, Keys};
use crate::{check, Failure, Harness, Outcome};

/// The watchdog renews the holds that fall due together in one batch
/// ([`renew`](lockcore::LockBackend::renew)), and each hold keeps its own
/// outcome: of holds renewed together, one freed behind its holder's back is reported lost
/// alone while the others stay held (with their tokens) over several TTLs; and a hold
/// released while a renewal batch carrying it is on its way stays free when the batch
/// arrives, without `lost()` firing.
pub async fn batched_renewal_keeps_each_hold(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let observed = Arc::new(Observed::new(c[0].backend().clone()));
    let client = LockClient::new(observed.clone());
    let mut held = Vec::new();
    for i in 0..HOLDS {
        let key = keys.key(&format!("batch-{i}"));
        let g = client.lock(&key).ttl(ttl).acquire().await?;
        held.push((key, g));
    }
    let effective = held[0].1.lease().ttl();
    // Wait for a batch of more than one renewal (holds taken together fall due together).
    let mut batch = Vec::new();
    for _ in 0..ROUNDS {
        observed
            .renewed_since(observed.extends(), effective * 3)
            .await?;
        batch = observed.last_batch();
        if !batch.is_empty() {
            break;
        }
    }
    // One hold of the batch is freed behind its holder's back: only it is lost.
    let victim = batch.first().cloned().unwrap_or_else(|| held[0].0.clone());
    let Some(at) = held.iter().position(|(k, _)| *k == victim) else {
        return Err(Failure(format!(
            "a renewal batch carried the key {victim:?}, which the scenario never locked"
        )));
    };
    let (victim, lost) = held.remove(at);
    c[1].force_release(&victim).await?;
    let fired = tokio::time::timeout(effective * 3, lost.lost()).await;
    check!(
        fired.is_ok(),
        "a hold freed behind its holder's back was not reported lost within {:?} of \
         watchdog renewals (a renewal batch answered it renewed)",
        effective * 3
    );
    drop(lost);
    // Two more renewal rounds: the others were renewed, not lost with it.
    let seen = observed.extends();
    observed.renewed_since(seen, effective * 3).await?;
    tokio::time::sleep(effective / 2).await;
    observed
        .renewed_since(observed.extends(), effective * 3)
        .await?;
    kept(
        &held,
        &c[1],
        &format!("{victim:?} was freed behind its holder's back"),
    )
    .await?;

    // A hold released while a batch carrying it is held back on its way.
    let mut round = 0;
    loop {
        round += 1;
        let Some((key, g)) = held.pop() else {
            return Err(Failure("no hold left to release".into()));
        };
        let hold = g.handle();
        let (gated, answered) = (observed.gated(), observed.answered());
        observed.gate_renewals(true);
        let reached = observed.gated_since(gated, effective * 2).await;
        let released = g.release().await;
        observed.gate_renewals(false);
        check!(
            reached,
            "no renewal batch was sent within {:?} of closing the gate",
            effective * 2
        );
        let released = released?;
        check!(
            released == ReleaseOutcome::Released,
            "releasing a renewed hold answered {released:?}"
        );
        // The batch either reaches the store now, or the client gave up on it (its
        // renewal attempt timed out at the gate): that round proves nothing.
        let arrived = observed.answered_since(answered, effective).await;
        if arrived {
            check!(
                is_free(&c[1], &key, ttl).await?,
                "a hold released while a renewal batch carrying it was on its way was held \
                 again when the batch arrived (a renewal re-created the lock)"
            );
            let fired = tokio::time::timeout(effective / 2, hold.lost()).await;
            check!(
                fired.is_err(),
                "lost() fired for a hold released while its renewal batch was on its way"
            );
            break;
        }
        check!(
            round < ROUNDS,
            "in {ROUNDS} rounds no renewal batch held at the gate reached the store after \
             the release (each timed out first)"
        );
    }
    kept(&held, &c[1], "another hold of the batch was released").await?;
    for (_, g) in held {
        g.release().await?;
    }
    Ok(())
}

/// How many holds the scenario takes together.
const HOLDS: usize = 6;

/// Rounds tried before giving up on an event that depends on timing.
const ROUNDS: u32 = 3;

/// Every hold of `held` is still held by its guard: not lost, and `other` sees its token.
async fn kept(held: &[(String, LockGuard)], other: &LockClient, after: &str) -> Outcome {
    for (key, g) in held {
        check!(
            !g.is_lost(),
            "the hold of {key:?} was reported lost after {after}"
        );
        let info = other.inspect(key).await?;
        check!(
            info.as_ref().map(|i| i.token) == Some(g.token()),
            "after {after}, the store shows {info:?} on {key:?}, which its guard holds with \
             token {}",
            g.token()
        );
    }
    Ok(())
}
