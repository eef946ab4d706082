//! Hand-overs within one client: a shared or permit hold released by one of the client's
//! requests goes straight to the client's next waiting request for the same claim, in the
//! release's own request to the store ([`LockBackend::release_and_claim`]), so the room is
//! never left free for the round trip a woken waiter's claim would take.
//!
//! The head of a key's line (the one request of the client that waits for the store)
//! *offers* to take a hand-over while it waits; a release of the same claim by another
//! owner *takes* the offer and answers it with the claim's outcome. The store decides that
//! claim as any other (reservations, marks, other processes' claims respected): a
//! hand-over only saves the round trip.
//!
//! [`LockBackend::release_and_claim`]: crate::LockBackend::release_and_claim

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::{AcquireOutcome, Claim, LockError, LockKey, Owner};

/// What a hand-over answers its waiter: when the claim was sent, and its outcome.
pub(crate) type Handed = (Instant, Result<AcquireOutcome, LockError>);

/// The offers of one client's waiting requests, by key: at most one per key (its line's
/// head).
#[derive(Default)]
pub(crate) struct Offers {
    per_key: Mutex<HashMap<LockKey, Offer>>,
    ids: AtomicU64,
}

/// A waiting request's offer: the claim it would send, and where its answer goes.
pub(crate) struct Offer {
    id: u64,
    pub(crate) owner: Owner,
    pub(crate) ttl: Duration,
    pub(crate) claim: Claim,
    answer: oneshot::Sender<Handed>,
}

/// An offer as its request keeps it: withdrawn when the request stops waiting, or answered.
pub(crate) struct Posted {
    id: u64,
    pub(crate) answer: oneshot::Receiver<Handed>,
}

impl Offers {
    fn per_key(&self) -> MutexGuard<'_, HashMap<LockKey, Offer>> {
        self.per_key.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `owner` waits for `key` and would take `claim` for `ttl` from a hand-over.
    pub(crate) fn post(&self, key: &LockKey, owner: &Owner, ttl: Duration, claim: Claim) -> Posted {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        let offer = Offer {
            id,
            owner: owner.clone(),
            ttl,
            claim,
            answer,
        };
        self.per_key().insert(key.clone(), offer);
        Posted {
            id,
            answer: answered,
        }
    }

    /// Withdraws `posted`: `true` if it was still offered, `false` if a release took it
    /// (its answer is then on its way, or the release went away: the channel closes).
    pub(crate) fn withdraw(&self, key: &LockKey, posted: &Posted) -> bool {
        let mut per_key = self.per_key();
        match per_key.get(key) {
            Some(offer) if offer.id == posted.id => {
                per_key.remove(key);
                true
            }
            _ => false,
        }
    }

    /// A release by `owner` of its `claim` on `key`: the offer of another owner for the
    /// same claim, if one waits.
    pub(crate) fn take(&self, key: &LockKey, owner: &Owner, claim: Claim) -> Option<Offer> {
        let mut per_key = self.per_key();
        let offer = per_key.get(key)?;
        if offer.claim != claim || offer.owner.token() == owner.token() {
            return None;
        }
        per_key.remove(key)
    }
}

impl Offer {
    /// Answers the offer's request with the claim sent at `sent`. A request that went away
    /// meanwhile has handed its answer to its clean-up (see `acquire/cleanup.rs`), which
    /// releases a grant; if even that is gone (no runtime), the lease runs out.
    pub(crate) fn answer(self, sent: Instant, outcome: Result<AcquireOutcome, LockError>) {
        let _ = self.answer.send((sent, outcome));
    }
}
