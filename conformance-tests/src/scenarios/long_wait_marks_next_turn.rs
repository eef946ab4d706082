use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::driver::{AcquireOutcome, ClaimRequest, STARVING_MARK_TTL};
use lockcore::{LockBackend, LockKey, Owner};

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// How long a request says it waited for its mark: 30 ms is just past
/// [`STARVING_AFTER`](lockcore::driver::STARVING_AFTER), 5 s is an earlier arrival by far.
const LATER: Duration = Duration::from_millis(30);
const EARLIER: Duration = Duration::from_secs(5);

/// When a mark must still keep the key: a waiter renews its mark every
/// [`STARVING_MARK_TTL`]` / 2`, so a mark must outlive that (and lives
/// [`STARVING_MARK_TTL`] when the TTL is longer, as here).
const STILL_MARKED_AFTER: Duration = Duration::from_millis(600);

/// How long a mark whose waiter vanished may keep a free key at most: its life
/// ([`STARVING_MARK_TTL`], a store may round it up to its lease granularity, etcd's 2 s),
/// with room for a slow machine.
const LAPSE_WITHIN: Duration = Duration::from_secs(4);

/// One attempt of `owner`, as a client sends it for a request that has waited `waited`
/// (`None`: a young request, which never marks): whether it was granted.
async fn attempt(
    b: &dyn LockBackend,
    key: &LockKey,
    owner: &Owner,
    ttl: Duration,
    waited: Option<Duration>,
) -> Result<bool, Failure> {
    let request = ClaimRequest::exclusive(key, owner, ttl);
    let request = match waited {
        Some(waited) => request.waited(waited),
        None => request,
    };
    let outcome = b.claim(&request).await?;
    Ok(matches!(outcome, AcquireOutcome::Acquired(_)))
}

/// `holder` takes the free key through `store`; each of `refused` (a store, an owner, how
/// long it waited: `None` for a young request) is refused while it holds it; then `holder`
/// releases it.
async fn refused_while_held(
    store: &dyn LockBackend,
    key: &LockKey,
    holder: &Owner,
    refused: &[(&dyn LockBackend, &Owner, Option<Duration>)],
    ttl: Duration,
) -> Outcome {
    check!(
        attempt(store, key, holder, ttl, None).await?,
        "the free key was refused"
    );
    for (b, owner, waited) in refused {
        check!(
            !attempt(*b, key, owner, ttl, *waited).await?,
            "the held key was granted to {} (waited {waited:?})",
            owner.label()
        );
    }
    store.release(key, holder).await?;
    Ok(())
}

/// On a backend that declares [`Fairness::Bounded`](lockcore::driver::Fairness::Bounded),
/// through the backend trait as a client drives it
/// ([`ClaimRequest::waited`](lockcore::driver::ClaimRequest::waited)): a request refused
/// after a long wait marks the key as its next turn, and a young refusal marks nothing;
/// a marked key goes to no young request (not the releasing owner either) and no later
/// arrival, but to the mark's owner, whose grant removes the mark, or to an earlier
/// arrival; a mark lives long enough to be renewed, lapses soon once its waiter vanished,
/// and goes with `abandon`.
pub async fn long_wait_marks_next_turn(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let c = clients(&*h, 3).await?;
    let (one, two, three) = (
        c[0].backend().clone(),
        c[1].backend().clone(),
        c[2].backend().clone(),
    );
    let (one, two, three) = (&*one, &*two, &*three);
    let ttl = h.ttl() * 30;
    let (holder, young, later, earlier) = (
        Owner::new("holder"),
        Owner::new("young"),
        Owner::new("later"),
        Owner::new("earlier"),
    );

    // A young refusal marks nothing.
    let key = LockKey::new(keys.key("young"))?;
    refused_while_held(one, &key, &holder, &[(two, &young, None)], ttl).await?;
    check!(
        attempt(one, &key, &holder, ttl, None).await?,
        "a young request's refusal kept the key from the releasing owner (it marked it)"
    );
    one.release(&key, &holder).await?;

    // A long wait's mark: the key goes to its owner only, and the grant removes it.
    let key = LockKey::new(keys.key("mark"))?;
    refused_while_held(one, &key, &holder, &[(two, &later, Some(LATER))], ttl).await?;
    check!(
        !attempt(one, &key, &holder, ttl, None).await?,
        "the releasing owner took the key a long waiter had marked"
    );
    check!(
        !attempt(three, &key, &young, ttl, None).await?,
        "a young request took the key a long waiter had marked"
    );
    check!(
        attempt(two, &key, &later, ttl, Some(LATER + LATER)).await?,
        "the mark's owner was refused the free key it had marked"
    );
    two.release(&key, &later).await?;
    check!(
        attempt(three, &key, &young, ttl, None).await?,
        "the mark outlived its owner's grant"
    );
    three.release(&key, &young).await?;

    // The earliest arrival goes first: a later one neither takes its mark nor passes it.
    let key = LockKey::new(keys.key("earliest"))?;
    let waiters = [(two, &earlier, Some(EARLIER)), (three, &later, Some(LATER))];
    refused_while_held(one, &key, &holder, &waiters, ttl).await?;
    check!(
        !attempt(three, &key, &later, ttl, Some(LATER + LATER)).await?,
        "a later arrival took the key an earlier one had marked"
    );
    check!(
        attempt(two, &key, &earlier, ttl, Some(EARLIER + LATER)).await?,
        "the earliest arrival was refused the key it had marked"
    );
    two.release(&key, &earlier).await?;

    // An earlier arrival is not kept out by a later one's mark.
    let key = LockKey::new(keys.key("earlier"))?;
    refused_while_held(one, &key, &holder, &[(two, &later, Some(LATER))], ttl).await?;
    check!(
        attempt(three, &key, &earlier, ttl, Some(EARLIER)).await?,
        "an earlier arrival was kept out by a later one's mark"
    );
    three.release(&key, &earlier).await?;

    // A mark lives long enough to be renewed, then lapses once its waiter vanished.
    let key = LockKey::new(keys.key("lapse"))?;
    // Before the mark was made (sound for the check below: it only errs towards excusing).
    let marked = Instant::now();
    refused_while_held(one, &key, &holder, &[(two, &later, Some(LATER))], ttl).await?;
    tokio::time::sleep(STILL_MARKED_AFTER.saturating_sub(marked.elapsed())).await;
    let refused = !attempt(three, &key, &young, ttl, None).await?;
    // A look answered within the mark's life found it live, however late the machine ran.
    check!(
        refused || marked.elapsed() >= STARVING_MARK_TTL,
        "a mark lapsed {:?} after it was made, before its life ({STARVING_MARK_TTL:?}) was over",
        marked.elapsed()
    );
    let lapsed = loop {
        if attempt(three, &key, &young, ttl, None).await? {
            break true;
        }
        if marked.elapsed() > LAPSE_WITHIN {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    check!(
        lapsed,
        "a mark whose waiter vanished still kept the free key after {LAPSE_WITHIN:?}"
    );
    three.release(&key, &young).await?;

    // `abandon` removes the mark at once.
    let key = LockKey::new(keys.key("abandon"))?;
    refused_while_held(one, &key, &holder, &[(two, &later, Some(LATER))], ttl).await?;
    two.abandon(&key, &later).await?;
    check!(
        attempt(three, &key, &young, ttl, None).await?,
        "an abandoned mark still kept the free key"
    );
    three.release(&key, &young).await?;
    Ok(())
}
