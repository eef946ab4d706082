//! Releasing: the owner-checked release on every instance, `Released` once a majority
//! released (one nonce for all, so that waiters count its announcements, see
//! [`crate::announcements`]); and the forced release.

use std::sync::Arc;
use std::time::Duration;

use driver_redis::__redlock as support;
use lockcore::{LockError, LockKey, Owner, ReleaseOutcome};

use crate::quorum::Tally;
use crate::rounds::Failures;
use crate::store::Inner;

impl Inner {
    /// Releases `owner`'s lock on every instance: [`ReleaseOutcome::Released`] when a
    /// majority did, with how many released it.
    ///
    /// # Errors
    ///
    /// [`LockError::QuorumNotReached`] when too few instances answered to tell (those that
    /// answered did release; the rest free it at its TTL).
    pub(crate) async fn release(
        self: &Arc<Self>,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<Tally<ReleaseOutcome>, LockError> {
        let names = support::names(&self.prefix, key);
        let nonce = self.nonces.next();
        let results = self
            .release_on(
                &names,
                &owner.token().to_hex(),
                &nonce,
                false,
                self.untimed(),
                |_| true,
                |results, pending| {
                    let released = results
                        .iter()
                        .filter(|(_, r)| matches!(r, Ok(1 | 2)))
                        .count();
                    released >= self.quorum || released + pending < self.quorum
                },
            )
            .await;
        let (mut agreed, mut answered) = (0, 0);
        let mut failures = Failures::default();
        let mut announced = 0;
        for (i, r) in results {
            match r {
                Ok(n) => {
                    answered += 1;
                    if n >= 1 {
                        agreed += 1;
                    }
                    if n == 2 {
                        announced += 1;
                    }
                }
                Err(e) => {
                    failures.add(&self.instances[i].label, e);
                }
            }
        }
        tracing::debug!(key = %key, released = agreed, announced, answered, "redlock release");
        if agreed > 0 && announced == 0 && self.notifier.has_subscribers() {
            // No copy was marked (as far as the answers so far tell): no waiter of another
            // client watches this lock, but one of ours may sleep on it since an earlier
            // holder. Counted as this release's wake-up, so that an announcement from a
            // straggler does not wake a second waiter of ours.
            self.announcements.wake_once(key, nonce.as_bytes());
        }
        let unanswered = self.instances.len() - answered;
        if agreed >= self.quorum {
            Ok(Tally {
                outcome: ReleaseOutcome::Released,
                agreed,
                answered,
            })
        } else if agreed + unanswered >= self.quorum {
            Err(self.too_few(answered, failures))
        } else {
            Ok(Tally {
                outcome: ReleaseOutcome::NotHeld,
                agreed,
                answered,
            })
        }
    }

    /// Sends the owner-checked release to the instances `on` picks (one nonce for all, so
    /// waiters count its announcements) and collects answers until `enough` (given the
    /// answers so far and the number still pending) says so; the rest finish in the
    /// background. A release queued behind a grant on the same connection runs after it, so
    /// a grant that arrives late is still undone. With `keep_reservation` (undoing an
    /// attempt refused overall, whose owner goes on waiting) an instance keeps the
    /// reservation the owner made there; otherwise the release removes it too.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn release_on(
        self: &Arc<Self>,
        names: &support::Names,
        owner_hex: &str,
        nonce: &str,
        keep_reservation: bool,
        timeout: Duration,
        on: impl Fn(usize) -> bool,
        enough: impl Fn(&[(usize, Result<i64, LockError>)], usize) -> bool,
    ) -> Vec<(usize, Result<i64, LockError>)> {
        let mut inv = names.call(&support::RELEASE);
        inv.arg(owner_hex).arg(nonce);
        if keep_reservation {
            inv.arg("keep");
        }
        let mut round = self.round("release", timeout, inv, on);
        let mut results = Vec::with_capacity(self.instances.len());
        while !enough(&results, round.len()) {
            let Some(answer) = round.next().await else {
                break;
            };
            results.push(answer);
        }
        round.detach();
        results
    }

    /// Deletes `key` on every instance whoever holds it, announcing the release.
    pub(crate) async fn force_release(
        self: &Arc<Self>,
        key: &LockKey,
    ) -> Result<ReleaseOutcome, LockError> {
        let names = support::names(&self.prefix, key);
        let mut inv = names.call(&support::FORCE_RELEASE);
        inv.arg(names.channel()).arg(self.nonces.next());
        let mut round = self.round::<i64>("force release", self.untimed(), inv, |_| true);
        let (mut answered, mut deleted) = (0, 0);
        let mut failures = Failures::default();
        while let Some((i, r)) = round.next().await {
            match r {
                Ok(d) => {
                    answered += 1;
                    if d == 1i64 {
                        deleted += 1;
                    }
                }
                Err(e) => {
                    failures.add(&self.instances[i].label, e);
                }
            }
        }
        if answered < self.quorum {
            return Err(self.too_few(answered, failures));
        }
        Ok(if deleted > 0 {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }
}

impl Inner {
    /// `owner` gave up waiting: its reservation is removed on every instance (best effort,
    /// in the background past the round's timeout; a reservation left behind expires with
    /// the TTL of the claim that made it).
    pub(crate) async fn give_up(self: &Arc<Self>, key: &LockKey, owner: &Owner) {
        let names = support::names(&self.prefix, key);
        let mut inv = names.call(&support::ABANDON);
        inv.arg(owner.token().to_hex()).arg(self.nonces.next());
        let mut round = self.round::<i64>("abandon", self.untimed(), inv, |_| true);
        while round.next().await.is_some() {}
    }
}
