use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::driver::{AcquireOutcome, ExtendOutcome, LockBackendExt, Renewal};
use lockcore::{Claim, FencingToken, LockClient, LockKey, Owner};

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// A hold with a long remaining lease keeps it, by the store's `inspect`, when it is extended
/// with a shorter TTL (alone, or in a batch beside other holds) or granted again to the
/// same owner with a shorter TTL.
pub async fn extend_never_shortens_lease(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let (long, short) = (ttl * 20, ttl * 2);
    let key = keys.key("exclusive");
    let g = c[0].lock(&key).ttl(long).watchdog(false).acquire().await?;
    keeps_lease(
        &c[0],
        &c[1],
        &key,
        g.owner(),
        g.token(),
        Claim::exclusive(),
        short,
        ttl,
    )
    .await?;
    g.release().await?;
    if c[0].capabilities().shared {
        let key = keys.key("shared");
        let g = c[0]
            .lock(&key)
            .shared()
            .ttl(long)
            .watchdog(false)
            .acquire()
            .await?;
        keeps_lease(
            &c[0],
            &c[1],
            &key,
            g.owner(),
            g.token(),
            Claim::shared(),
            short,
            ttl,
        )
        .await?;
        g.release().await?;
    }
    Ok(())
}

/// Extends `owner`'s lease of `key` (token `token`) with `short`, then asks for it again
/// with `short`, straight through the backend of `holder`, checking after each that the
/// store (seen by `observer`) kept the longer lease.
#[allow(clippy::too_many_arguments)]
async fn keeps_lease(
    holder: &LockClient,
    observer: &LockClient,
    key: &str,
    owner: &Owner,
    token: FencingToken,
    claim: Claim,
    short: Duration,
    ttl: Duration,
) -> Outcome {
    let backend = holder.backend();
    let lock_key = LockKey::new(key)?;
    let before = expiry(observer, key, token).await?;
    let extended = backend.extend(&lock_key, owner, short).await?;
    check!(
        matches!(extended, ExtendOutcome::Extended(_)),
        "extend of a live {claim} lease answered {extended:?}"
    );
    kept(
        observer,
        key,
        token,
        before,
        ttl,
        "an extend with a shorter TTL",
    )
    .await?;
    // The same in a batch of several renewals, which drivers send by another statement or
    // script than a batch of one: beside two holds of other keys, of the same kind.
    let mut companions = Vec::new();
    for n in 0..2 {
        let lock = holder
            .lock(format!("{key}-beside-{n}"))
            .ttl(short)
            .watchdog(false);
        companions.push(if claim.is_exclusive() {
            lock.acquire().await?
        } else {
            lock.shared().acquire().await?
        });
    }
    let mut renewals = vec![Renewal::new(&lock_key, owner, short)];
    renewals.extend(
        companions
            .iter()
            .map(|g| Renewal::new(g.key(), g.owner(), short)),
    );
    let before = expiry(observer, key, token).await?;
    let answers = backend.renew(&renewals).await?;
    check!(
        answers.len() == renewals.len()
            && answers
                .iter()
                .all(|a| matches!(a, Ok(ExtendOutcome::Extended(_)))),
        "a batch of {} renewals of live {claim} leases answered {answers:?}",
        renewals.len()
    );
    kept(
        observer,
        key,
        token,
        before,
        ttl,
        "a batch renewal with a shorter TTL",
    )
    .await?;
    for g in companions {
        g.release().await?;
    }
    let before = expiry(observer, key, token).await?;
    let again = if claim.is_exclusive() {
        backend.try_acquire(&lock_key, owner, short).await?
    } else {
        backend.try_claim(&lock_key, owner, short, claim).await?
    };
    check!(
        matches!(again, AcquireOutcome::Acquired(_)),
        "the holder of a {claim} lease asking again was refused"
    );
    kept(
        observer,
        key,
        token,
        before,
        ttl,
        "a same-owner re-grant with a shorter TTL",
    )
    .await
}

/// The store's expiry of the lease with `token`, as an interval on this process's clock:
/// the remaining TTL added to the instants before and after asking.
async fn expiry(
    observer: &LockClient,
    key: &str,
    token: FencingToken,
) -> Result<(Instant, Instant), Failure> {
    let sent = Instant::now();
    let leases = observer.inspect_all(key).await?;
    let answered = Instant::now();
    let Some(lease) = leases.into_iter().find(|l| l.token == token) else {
        return Err(Failure(format!(
            "inspect no longer shows the lease with token {token}"
        )));
    };
    let Some(remaining) = lease.remaining_ttl else {
        return Err(Failure("inspect shows no remaining TTL".into()));
    };
    Ok((sent + remaining, answered + remaining))
}

/// The lease's expiry after `what` is not earlier than `before` (within `ttl`, far less than
/// the shortening it would be).
async fn kept(
    observer: &LockClient,
    key: &str,
    token: FencingToken,
    before: (Instant, Instant),
    ttl: Duration,
    what: &str,
) -> Outcome {
    let after = expiry(observer, key, token)
        .await
        .map_err(|f| Failure(format!("after {what}: {}", f.0)))?;
    check!(
        after.1 + ttl >= before.0,
        "{what} shortened the lease: it ended {:?} earlier by the store",
        before.0.saturating_duration_since(after.1)
    );
    Ok(())
}
