//! The breakages of shared claims, over the memory backend.

use std::time::Duration;

use lockcore::driver::{AcquireOutcome, ClaimRequest, Contention, READ_WRITE_CAPACITY};
use lockcore::memory::MemoryBackend;
use lockcore::{Claim, ClaimMode, LockBackend, LockError, LockInfo, LockKey, Owner};

/// Where [`ReadersIgnoreWriter`](super::Breakage::ReadersIgnoreWriter) keeps shared leases:
/// a key beside the writer's, whose leases a reader never sees.
pub(super) fn readers_key(key: &LockKey) -> Result<LockKey, LockError> {
    LockKey::new(format!("{} (readers)", key.as_str()))
}

/// `claim` as the memory store takes it, from a request that has waited `waited` (see
/// [`ClaimRequest::waited`]).
pub(super) async fn take(
    inner: &MemoryBackend,
    waited: Option<Duration>,
    key: &LockKey,
    owner: &Owner,
    ttl: Duration,
    claim: Claim,
) -> Result<AcquireOutcome, LockError> {
    let request = ClaimRequest::new(key, owner, ttl, claim);
    let request = match waited {
        Some(waited) => request.waited(waited),
        None => request,
    };
    inner.claim(&request).await
}

/// Readers take their own key (never seeing a writer); anything else waits for them, then
/// takes the key itself.
pub(super) async fn readers_ignore_writer(
    inner: &MemoryBackend,
    waited: Option<Duration>,
    key: &LockKey,
    owner: &Owner,
    ttl: Duration,
    claim: Claim,
) -> Result<AcquireOutcome, LockError> {
    let readers = readers_key(key)?;
    if claim.mode() == ClaimMode::Shared {
        return take(inner, waited, &readers, owner, ttl, claim).await;
    }
    let leases = inner.holders(&readers).await?;
    if !leases.is_empty() {
        let soonest = leases.iter().filter_map(|l| l.remaining_ttl).min();
        return Ok(AcquireOutcome::Held(Contention::new(soonest)));
    }
    take(inner, waited, key, owner, ttl, claim).await
}

/// A semaphore of `n` as the store keeps it: `n + 1` permits.
fn widened(claim: Claim) -> Claim {
    if claim.mode() != ClaimMode::Permits {
        return claim;
    }
    let (Ok(permits), Ok(capacity)) = (
        u32::try_from(claim.weight()),
        u32::try_from(claim.capacity() + 1),
    ) else {
        return claim;
    };
    Claim::permits(permits, capacity).unwrap_or(claim)
}

/// The capacity a caller asked for, from the one the store keeps.
fn narrowed(capacity: u64) -> u64 {
    if capacity == READ_WRITE_CAPACITY {
        capacity
    } else {
        capacity - 1
    }
}

/// Takes `claim` with one permit more room than asked, and words a mismatch with the
/// capacities the callers asked for.
pub(super) async fn admit_one_more(
    inner: &MemoryBackend,
    waited: Option<Duration>,
    key: &LockKey,
    owner: &Owner,
    ttl: Duration,
    claim: Claim,
) -> Result<AcquireOutcome, LockError> {
    match take(inner, waited, key, owner, ttl, widened(claim)).await {
        Err(LockError::Config { message }) => match inner.holders(key).await?.first() {
            Some(held) => Err(LockError::capacity_mismatch(
                key,
                narrowed(held.claim.capacity()),
                &claim,
            )),
            None => Err(LockError::Config { message }),
        },
        answer => answer,
    }
}

/// A lease of a widened semaphore as its holder asked for it.
pub(super) fn shown_one_less(info: LockInfo) -> LockInfo {
    let claim = info.claim;
    if claim.mode() != ClaimMode::Permits {
        return info;
    }
    let asked = Claim::from_parts(claim.weight(), narrowed(claim.capacity())).unwrap_or(claim);
    info.with_claim(asked)
}

/// `claim` made to fit the capacity stored with `key` (which it does not match): the
/// stored kind, with as much of it as asked. `None` when no lease shows the stored kind.
pub(super) async fn as_stored_kind(
    inner: &MemoryBackend,
    key: &LockKey,
    claim: Claim,
) -> Result<Option<Claim>, LockError> {
    let Some(stored) = inner
        .holders(key)
        .await?
        .first()
        .map(|l| l.claim.capacity())
    else {
        return Ok(None);
    };
    if stored == READ_WRITE_CAPACITY {
        // A semaphore on a read-write key: taken as a reader.
        return Ok(Some(Claim::shared()));
    }
    let Ok(size) = u32::try_from(stored) else {
        return Ok(None);
    };
    let permits = match claim.mode() {
        ClaimMode::Permits => u32::try_from(claim.weight()).map_or(size, |k| k.min(size)),
        ClaimMode::Shared => 1,
        _ => size,
    };
    Ok(Claim::permits(permits, size).ok())
}
