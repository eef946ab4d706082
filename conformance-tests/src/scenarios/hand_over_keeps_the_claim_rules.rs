use std::sync::Arc;

use lockcore::{AcquireOutcome, Claim, LockError, ReleaseOutcome};

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// A hand-over ([`LockBackend::release_and_claim`](lockcore::LockBackend::release_and_claim),
/// which lockcore sends when a client's permit or read lease goes to its next waiting
/// request) is a release followed by a claim the store decides as any other: the released
/// room is the next owner's, with a later token; an owner that holds nothing releases
/// nothing and its hand-over grants nothing past the capacity; another process's
/// reservation and a capacity mismatch are respected. Sent to the backend directly, whether
/// it does the hand-over in one request or by the trait's default.
pub async fn hand_over_keeps_the_claim_rules(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = lockcore::LockKey::new(keys.key("hand-over"))?;
    let ttl = h.ttl() * 20;
    let c = clients(&*h, 2).await?;
    let store = c[0].backend().clone();
    let two = Claim::permits(1, 2)?;
    let [a, x, b, ghost, mismatched, heavy, light] = [(); 7].map(|_| c[0].new_owner());
    let granted = |outcome: Result<AcquireOutcome, LockError>, what: &str| match outcome {
        Ok(AcquireOutcome::Acquired(grant)) => Ok(grant.token),
        other => Err(Failure(format!("{what}: {other:?}"))),
    };
    let refused = |outcome: &Result<AcquireOutcome, LockError>| {
        matches!(outcome, Ok(AcquireOutcome::Held(_)))
    };

    // One permit (a free key's first lease, which some stores keep in the key's record):
    // handed from a to b.
    let one_key = lockcore::LockKey::new(keys.key("hand-over-one"))?;
    let one = Claim::permits(1, 1)?;
    let t1 = granted(
        store.try_claim(&one_key, &a, ttl, one).await,
        "a free permit",
    )?;
    let full = store.try_claim(&one_key, &b, ttl, one).await;
    check!(refused(&full), "a second permit of 1 was answered {full:?}");
    let (released, claimed) = store.release_and_claim(&one_key, &a, &b, ttl, one).await?;
    check!(
        released == ReleaseOutcome::Released,
        "the hand-over's release of the only permit answered {released:?}"
    );
    let t2 = granted(claimed, "the only permit handed over")?;
    check!(t2 > t1, "the handed permit's token {t2} is not above {t1}");
    check!(
        store.release(&one_key, &b).await? == ReleaseOutcome::Released,
        "the handed permit could not be released"
    );

    // Full: a and x hold the 2 permits, b is refused.
    let ta = granted(
        store.try_claim(&key, &a, ttl, two).await,
        "the first permit",
    )?;
    let tx = granted(
        store.try_claim(&key, &x, ttl, two).await,
        "the second permit",
    )?;
    let full = store.try_claim(&key, &b, ttl, two).await;
    check!(refused(&full), "a third permit of 2 was answered {full:?}");

    // a's permit goes to b.
    let (released, claimed) = store.release_and_claim(&key, &a, &b, ttl, two).await?;
    check!(
        released == ReleaseOutcome::Released,
        "the hand-over's release of a held permit answered {released:?}"
    );
    let tb = granted(claimed, "the permit handed over")?;
    check!(
        tb > tx && tx > ta,
        "tokens do not rise through the hand-over: {ta}, {tx}, then {tb}"
    );
    let held: Vec<_> = store
        .inspect_all(&key)
        .await?
        .iter()
        .map(|l| l.token)
        .collect();
    check!(
        held == [tx, tb],
        "after the hand-over the holders' tokens are {held:?}, not [{tx}, {tb}]"
    );

    // Nothing to release: nothing freed, nothing granted past the capacity.
    let (released, claimed) = store.release_and_claim(&key, &a, &ghost, ttl, two).await?;
    check!(
        released == ReleaseOutcome::NotHeld,
        "a hand-over by an owner that holds nothing released: {released:?}"
    );
    check!(
        refused(&claimed),
        "a hand-over that freed nothing answered its claim {claimed:?} with 2 of 2 out"
    );
    store.abandon(&key, &ghost).await?;

    // A claim of another capacity is refused as a mismatch, after the release went through.
    let (released, claimed) = store
        .release_and_claim(&key, &b, &mismatched, ttl, Claim::permits(1, 3)?)
        .await?;
    check!(
        released == ReleaseOutcome::Released,
        "the hand-over's release answered {released:?}"
    );
    check!(
        matches!(claimed, Err(LockError::Config { .. })),
        "a hand-over's claim of 1 of 3 on a semaphore of 2 answered {claimed:?}"
    );

    // Behind another process's reservation (a waiting claim of both permits), the room a
    // hand-over frees is not the lighter claim's.
    let both = Claim::permits(2, 2)?;
    let waiting = store.try_claim(&key, &heavy, ttl, both).await;
    check!(
        refused(&waiting),
        "2 permits with 1 of 2 out answered {waiting:?}"
    );
    let behind = store.try_claim(&key, &light, ttl, two).await;
    check!(
        refused(&behind),
        "a permit behind a waiting claim of 2 was answered {behind:?}"
    );
    let (released, claimed) = store.release_and_claim(&key, &x, &light, ttl, two).await?;
    check!(
        released == ReleaseOutcome::Released,
        "the hand-over's release answered {released:?}"
    );
    check!(
        refused(&claimed),
        "a hand-over passed a waiting claim's reservation: {claimed:?}"
    );
    let th = granted(
        store.try_claim(&key, &heavy, ttl, both).await,
        "the waiting claim of 2, once both were free",
    )?;
    check!(th > tb, "the token {th} is not above the earlier {tb}");
    store.abandon(&key, &light).await?;
    store.release(&key, &heavy).await?;
    check!(
        store.inspect_all(&key).await?.is_empty(),
        "the key is still held after every holder released"
    );
    Ok(())
}
