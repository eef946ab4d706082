//! Extending: the owner-checked renewal on every instance, `Extended` only when a majority
//! renewed within the new validity (see [`crate::quorum`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use driver_redis::__redlock as support;
use driver_redis::redis::Value;
use lockcore::driver::{ExtendOutcome, Grant};
use lockcore::{FencingToken, LockError, LockKey, Owner};

use crate::fencing::common_token;
use crate::quorum::{decided, valid_until, Tally};
use crate::rounds::Failures;
use crate::store::{Inner, NAME};

impl Inner {
    /// Renews `owner`'s lease on every instance: [`ExtendOutcome::Extended`] when a majority
    /// did within the new validity (`ttl − elapsed − drift`, which is the grant's
    /// `valid_until`), with how many renewed it.
    ///
    /// # Errors
    ///
    /// [`LockError::QuorumNotReached`] when too few instances answered to tell;
    /// [`LockError::Unavailable`] when a majority renewed but only after the new validity
    /// had run out.
    pub(crate) async fn extend(
        self: &Arc<Self>,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<Tally<ExtendOutcome>, LockError> {
        let ttl_ms = support::ttl_millis(ttl)?;
        let applied = Duration::from_millis(ttl_ms);
        let timeout = self.timeout_for(applied);
        let names = support::names(&self.prefix, key);
        let owner_hex = owner.token().to_hex();
        let started = Instant::now();
        let valid_until = valid_until(started, applied);
        let mut inv = names.call(&support::EXTEND);
        inv.arg(&owner_hex).arg(ttl_ms);
        let mut pending = self.round("extend", timeout, inv, |_| true);
        let q = self.quorum;
        let (mut agreed, mut answered) = (0, 0);
        let (mut tokens, mut written) = (Vec::new(), Vec::new());
        let mut failures = Failures::default();
        while let Some((i, r)) = pending.next().await {
            match r.and_then(|reply: Vec<Value>| parse_extend(&reply)) {
                Ok(Some((token, written_back))) => {
                    answered += 1;
                    agreed += 1;
                    tokens.push(token);
                    if written_back {
                        written.push(token);
                    }
                }
                Ok(None) => answered += 1,
                Err(e) => {
                    tracing::debug!(instance = %self.instances[i].label, error = %lockcore::ErrorChain(&e), "redlock extend failed on an instance");
                    failures.add(&self.instances[i].label, e);
                }
            }
            if decided(agreed, answered, pending.len(), q) {
                break;
            }
        }
        pending.detach();
        tracing::debug!(key = %key, extended = agreed, answered, "redlock extend");
        if agreed < q {
            if answered < q {
                return Err(self.too_few(answered, failures));
            }
            return Ok(Tally {
                outcome: ExtendOutcome::NotHeld,
                agreed,
                answered,
            });
        }
        if Instant::now() >= valid_until {
            return Err(LockError::unavailable(
                NAME,
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "a majority renewed the lock only after its new validity had run out",
                ),
            ));
        }
        // The holder's T is on the written-back copies; copies not written back yet carry
        // their instance's own grant token, and a few of those may agree on another one.
        let token = common_token(&written)
            .or_else(|| common_token(&tokens))
            .ok_or_else(|| support::unexpected("extend tokens"))?;
        Ok(Tally {
            outcome: ExtendOutcome::Extended(
                Grant::new(token, applied).with_valid_until(valid_until),
            ),
            agreed,
            answered,
        })
    }
}

fn parse_extend(reply: &[Value]) -> Result<Option<(FencingToken, bool)>, LockError> {
    match reply {
        [flag, token] if support::as_int(flag) == Some(1) => {
            let parsed =
                support::as_token(token).ok_or_else(|| support::unexpected("extend token"))?;
            Ok(Some((parsed, support::written_back(token))))
        }
        [flag] if support::as_int(flag) == Some(0) => Ok(None),
        _ => Err(support::unexpected("extend reply")),
    }
}
