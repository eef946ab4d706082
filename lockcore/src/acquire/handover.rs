//! A waiting request's side of a hand-over ([`crate::handoff`]): the offer it posts while
//! it waits for a release, and what it does with a release's answer.

use super::{Attempt, Request};
use crate::handoff::{Handed, Posted};
use crate::LockError;

impl Request {
    /// While it waits for a release, the head of a key's line offers to take a hand-over
    /// (a backend that does one in one request, a claim that is not exclusive).
    pub(super) fn offer_hand_over(&mut self) {
        let req = &self.req;
        if self.client.caps.hand_over && !req.claim.is_exclusive() {
            let posted = self
                .client
                .offers
                .post(&req.key, &req.owner, req.ttl, req.claim);
            self.posted = Some(Box::new(posted));
        }
    }

    /// After the wait: `answer` if a release answered the offer meanwhile; otherwise the
    /// offer is withdrawn, or (a release took it just now) its answer awaited. An answer
    /// waits in `handed` for the attempt loop. An offer taken and never answered (the
    /// release went away, or its request to the store failed) may have been granted: the
    /// request claims again itself, which the store answers idempotently.
    pub(super) async fn settle_offer(&mut self, answer: Option<Option<Handed>>) {
        let answer = match answer {
            Some(answer) => answer,
            None => {
                let Some(posted) = self.posted.as_mut() else {
                    return;
                };
                if self.client.offers.withdraw(&self.req.key, posted) {
                    self.posted = None;
                    return;
                }
                // Awaited with the offer still in `posted`: if the caller goes away now,
                // the clean-up awaits the answer and releases a grant.
                (&mut posted.answer).await.ok()
            }
        };
        self.posted = None;
        match answer {
            Some(handed) => self.handed = Some(Box::new(handed)),
            None => self.maybe_applied = true,
        }
    }

    /// A request ending with its offer posted: withdrawn, or, if a release took it, its
    /// answer to be awaited as an attempt in flight (the clean-up releases a grant). A
    /// hand-over answered and not yet seen is such an attempt too.
    pub(super) fn offer_in_flight(&mut self) -> Option<Attempt> {
        if let Some(handed) = self.handed.take() {
            let (_, outcome) = *handed;
            return Some(Box::pin(async move { outcome }));
        }
        let posted = self.posted.take()?;
        if self.client.offers.withdraw(&self.req.key, &posted) {
            return None;
        }
        let backend = self.client.backend.name();
        Some(Box::pin(async move {
            match posted.answer.await {
                Ok((_, outcome)) => outcome,
                Err(_) => Err(LockError::unavailable(
                    backend,
                    "the release handing the claim over went away before its answer",
                )),
            }
        }))
    }
}

/// The answer to the offer in `posted` (`None` if the release that took it went away
/// without one); never resolves without an offer.
pub(super) async fn answer_of(posted: &mut Option<Box<Posted>>) -> Option<Handed> {
    match posted {
        Some(posted) => (&mut posted.answer).await.ok(),
        None => std::future::pending().await,
    }
}
