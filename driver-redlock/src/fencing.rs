//! The fencing write-back, as `docs/redlock.md` states it in "Fencing (clock-assisted)":
//! each grant bumps its instance's fence to `max(c + 1, now_us)` and returns it (round 1, in
//! the grant script); the client takes **T = max** over the grants ([`holders_token`]),
//! writes `max(c, T)` back to every granting instance, T into the lock value there too
//! ([`Inner::write_back`], round 2), and hands the lease out only when a majority
//! acknowledged ([`WriteBack::acknowledged`]) and the validity measured after the
//! write-back is still positive. Any later majority then shares an instance whose fence is
//! at least T.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use driver_redis::__redlock as support;
use driver_redis::redis::ScriptInvocation;
use lockcore::{FencingToken, LockError};

use crate::rounds::Failures;
use crate::store::Inner;

/// The token of a hold a majority of granting instances carry written back (`0T`), if
/// any: see [`holders_token`].
pub(crate) fn settled_token(settled: &[FencingToken], quorum: usize) -> Option<FencingToken> {
    let mut counts: HashMap<FencingToken, usize> = HashMap::new();
    for t in settled {
        *counts.entry(*t).or_default() += 1;
    }
    counts
        .into_iter()
        .find(|(_, n)| *n >= quorum)
        .map(|(t, _)| t)
}

/// The token an acquisition hands out (`None` without grants): T, the highest token among
/// the grants; but when a majority of the granters re-granted the owner copies written back
/// with one token (`settled`: the marked ones among `granted`), that token, so a same-owner
/// re-grant keeps the holder's token even when a copy granted late still carries its own,
/// higher one.
///
/// Safe: those copies lived since they were written back, so no other owner held a majority
/// in between, and a written-back token is at least its copy's own grant token, so it is
/// above the token of any holder before that copy.
pub(crate) fn holders_token(
    granted: &[(usize, FencingToken)],
    settled: &[FencingToken],
    quorum: usize,
) -> Option<FencingToken> {
    settled_token(settled, quorum).or_else(|| granted.iter().map(|(_, t)| *t).max())
}

/// The fencing write-back of `token` for `owner_hex`'s lock (round 2).
pub(crate) fn write_back_script(
    names: &support::Names,
    owner_hex: &str,
    token: FencingToken,
) -> ScriptInvocation<'static> {
    let mut inv = support::WRITE_BACK.key(&names.lock);
    inv.key(names.fence())
        .key(names.claims())
        .arg(owner_hex)
        .arg(token.0.to_string())
        .arg(support::fence_ttl_millis());
    inv
}

/// What round 2 heard.
pub(crate) struct WriteBack {
    /// Granters that took T.
    pub(crate) acks: usize,
    /// Granters that answered at all (the rest failed or timed out).
    pub(crate) answers: usize,
    /// How the others failed.
    pub(crate) failures: Failures,
}

impl WriteBack {
    /// Whether a majority took T: the lease may be handed out (if still valid).
    pub(crate) fn acknowledged(&self, quorum: usize) -> bool {
        self.acks >= quorum
    }
}

impl Inner {
    /// Round 2: T written back to every granter of round 1, until a majority acknowledged
    /// or can no longer; the rest finish in the background.
    pub(crate) async fn write_back(
        self: &Arc<Self>,
        names: &support::Names,
        owner_hex: &str,
        token: FencingToken,
        timeout: Duration,
        granted: &[(usize, FencingToken)],
    ) -> WriteBack {
        let q = self.quorum;
        let script = write_back_script(names, owner_hex, token);
        let mut round2 = self.round("fence write-back", timeout, script, |i| {
            granted.iter().any(|(g, _)| *g == i)
        });
        let (mut acks, mut answers) = (0, 0);
        let mut failures = Failures::default();
        while let Some((i, r)) = round2.next().await {
            match r as Result<i64, LockError> {
                Ok(1) => {
                    acks += 1;
                    answers += 1;
                }
                Ok(_) => answers += 1,
                Err(e) => {
                    tracing::debug!(instance = %self.instances[i].label, error = %lockcore::ErrorChain(&e), "redlock fence write-back failed on an instance");
                    failures.add(&self.instances[i].label, e);
                }
            }
            if acks >= q || acks + round2.len() < q {
                break;
            }
        }
        round2.detach();
        WriteBack {
            acks,
            answers,
            failures,
        }
    }
}

/// The token most instances reported (the written-back T), the highest among equals.
pub(crate) fn common_token(tokens: &[FencingToken]) -> Option<FencingToken> {
    let mut counts: HashMap<FencingToken, usize> = HashMap::new();
    for t in tokens {
        *counts.entry(*t).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|(t, n)| (*n, *t))
        .map(|(t, _)| t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_needs_a_majority_of_write_back_acknowledgements() {
        let round2 = |acks| WriteBack {
            acks,
            answers: 5,
            failures: Failures::default(),
        };
        assert!(!round2(0).acknowledged(3));
        assert!(!round2(1).acknowledged(3));
        assert!(!round2(2).acknowledged(3));
        assert!(round2(3).acknowledged(3));
        assert!(round2(5).acknowledged(3));
    }

    #[test]
    fn t_is_the_highest_token_granted() {
        let t = |v| FencingToken(v);
        assert_eq!(
            holders_token(&[(0, t(7)), (3, t(9)), (4, t(8))], &[], 2),
            Some(t(9))
        );
        assert_eq!(holders_token(&[], &[], 2), None);
    }

    #[test]
    fn a_re_grant_keeps_the_token_a_majority_carries_written_back() {
        let t = |v| FencingToken(v);
        let granted = [(0, t(7)), (1, t(7)), (2, t(9))];
        // Two of three marked copies of 7: the holder's token, not the late copy's 9.
        assert_eq!(holders_token(&granted, &[t(7), t(7)], 2), Some(t(7)));
        // One marked copy proves nothing: the highest.
        assert_eq!(holders_token(&granted, &[t(7)], 2), Some(t(9)));
        assert_eq!(settled_token(&[t(7), t(8)], 2), None);
        assert_eq!(settled_token(&[t(7), t(8), t(8)], 2), Some(t(8)));
    }

    #[test]
    fn common_token_prefers_the_written_back_one() {
        let t = |v| FencingToken(v);
        assert_eq!(common_token(&[t(5), t(7), t(5)]), Some(t(5)));
        assert_eq!(common_token(&[t(5), t(7)]), Some(t(7)));
        assert_eq!(common_token(&[]), None);
    }
}
