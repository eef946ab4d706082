//! An acquisition: round 1, the grant on every instance at once; with fencing, round 2,
//! the write-back of T (see [`crate::fencing`]); a lease only with a majority within its
//! validity (see [`crate::quorum`]); and a failed attempt undone everywhere.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use driver_redis::__redlock as support;
use driver_redis::redis::{Cmd, ScriptInvocation, Value};
use futures_util::stream::StreamExt;
use lockcore::driver::{
    jitter, AcquireOutcome, ClaimRequest, Contention, Grant, WaitHint, STARVING_MARK_TTL,
};
use lockcore::{Claim, FencingToken, LockError, LockKey};

use crate::fencing::{holders_token, settled_token, write_back_script};
use crate::quorum::{decided, time_until_at_most, valid_until};
use crate::rounds::{Failures, Round};
use crate::store::Inner;

/// What round 1 of an acquisition sends to each instance: with fencing on, the grant
/// script with its fence bump; with fencing off, a plain `SET NX PX` first (`set`), and the
/// script (driver-redis's `ACQUIRE_UNFENCED`) only where it is refused.
struct GrantRequest {
    set: Option<Cmd>,
    script: ScriptInvocation<'static>,
}

enum Acquired {
    /// Granted, with the token, and whether it is a copy the fencing write-back already
    /// marked (a same-owner re-grant of a settled hold).
    Granted(FencingToken, bool),
    /// Held: the holder's remaining TTL, and the change stamp (`rev`) of the instance's
    /// shared leases when they (not an exclusive lock) refused the claim.
    Held(Option<Duration>, Option<i64>),
}

/// An instance's answer to the grant script, for `claim` on `key`: a capacity mismatch is
/// an error (a `Config` one, which the round reports rather than a quorum failure).
fn parse_acquire(reply: &[Value], key: &LockKey, claim: &Claim) -> Result<Acquired, LockError> {
    match support::acquire_outcome(reply, key, claim, Duration::ZERO)? {
        AcquireOutcome::Acquired(grant) => Ok(Acquired::Granted(
            grant.token,
            reply.get(1).is_some_and(support::written_back),
        )),
        AcquireOutcome::Held(held) => Ok(Acquired::Held(held.remaining_ttl, held.hint.revision())),
    }
}

impl Inner {
    /// Round 1 of an acquisition on instance `i`: the grant script; or, with fencing off,
    /// a plain `SET NX PX` first — one command, no script — and the light script only when
    /// it is refused, to re-grant to the same owner or report the holder's remaining TTL.
    fn grant(
        self: &Arc<Self>,
        i: usize,
        timeout: Duration,
        request: Arc<GrantRequest>,
        target: Arc<(LockKey, Claim)>,
    ) -> (
        usize,
        impl Future<Output = (usize, Result<Acquired, LockError>)> + Send + 'static,
    ) {
        let inner = self.clone();
        let answer = async move {
            let result = async {
                let backend = inner.instance(i, timeout).await?;
                if let Some(set) = &request.set {
                    let reply: Value = backend.run_command("acquire", set).await?;
                    if reply != Value::Nil {
                        return Ok(Acquired::Granted(FencingToken(0), false));
                    }
                }
                let reply: Vec<Value> = backend.run_script("acquire", &request.script).await?;
                parse_acquire(&reply, &target.0, &target.1)
            }
            .await;
            (i, result)
        };
        (i, answer)
    }

    /// Undoes a failed attempt: releases where it was granted, waiting for those answers,
    /// and where it went unanswered, in the background (a grant sent but not yet answered
    /// runs before the release queued behind it on the same connection). An instance that
    /// answered "held by another" granted nothing and is left alone: under contention a
    /// failed attempt costs no release round.
    async fn abandon(
        self: &Arc<Self>,
        names: &support::Names,
        owner_hex: &str,
        timeout: Duration,
        answered: &[bool],
        granted: &[(usize, FencingToken)],
    ) {
        let granted_on = |i: usize| granted.iter().any(|(g, _)| *g == i);
        if granted.is_empty() && answered.iter().all(|a| *a) {
            return;
        }
        self.release_on(
            names,
            owner_hex,
            &self.nonces.next(),
            true,
            timeout,
            |i| granted_on(i) || !answered[i],
            |results, _| results.iter().filter(|(i, _)| granted_on(*i)).count() >= granted.len(),
        )
        .await;
    }

    /// A short random back-off after a split vote or a grant that came too late, so that
    /// contenders do not collide again at once.
    fn retry_soon(&self, attempt: Duration) -> AcquireOutcome {
        let backoff = Duration::from_millis(1) + jitter(attempt * 2 + Duration::from_millis(2));
        AcquireOutcome::Held(
            Contention::new(Some(backoff)).with_hint(WaitHint::retry_after(backoff)),
        )
    }

    /// One attempt to take `claim` on `key` for `owner`: the grant round, the write-back
    /// round with fencing, and the lease if a majority granted within its validity. An
    /// exclusive claim runs the lock's grant script (a plain `SET NX PX` first when fencing
    /// is off), a shared one driver-redis's claim script (fencing is then always on: shared
    /// claims are declared only with fencing, see `docs/redlock.md`). An exclusive claim
    /// that has waited long ([`ClaimRequest::waited`]) asks every instance to mark the key.
    pub(crate) async fn claim(
        self: &Arc<Self>,
        request: &ClaimRequest<'_>,
    ) -> Result<AcquireOutcome, LockError> {
        let ClaimRequest {
            key,
            owner,
            ttl,
            claim,
            ..
        } = *request;
        let ttl_ms = support::ttl_millis(ttl)?;
        let applied = Duration::from_millis(ttl_ms);
        let timeout = self.timeout_for(applied);
        let names = support::names(&self.prefix, key);
        let owner_hex = owner.token().to_hex();
        let n = self.instances.len();
        let q = self.quorum;
        let started = Instant::now();
        let valid_until = valid_until(started, applied);

        // Round 1: the grant on every instance at once — the script with the fence bump
        // when fencing is on, else a plain `SET NX PX` with the light script (no fence key,
        // no `TIME`) as its fallback.
        let request = Arc::new(if self.fencing || !claim.is_exclusive() {
            let (script, shared) = if claim.is_exclusive() {
                (&*support::ACQUIRE, None)
            } else {
                (&*support::CLAIM, Some(&claim))
            };
            let mut inv =
                support::grant_call(script, &names, &owner_hex, ttl_ms, owner.label(), shared);
            // A long wait asks every instance to mark the key as its next turn (the
            // arrival each instance records is on its own clock, so they agree on the
            // order of two waiters).
            let starving = request.waited.filter(|_| claim.is_exclusive());
            if !self.time_floor {
                inv.arg("nofloor");
            } else if starving.is_some() {
                inv.arg("");
            }
            if let Some(waited) = starving {
                let mark_ms = ttl_ms.min(support::ttl_millis(STARVING_MARK_TTL)?);
                inv.arg(u64::try_from(waited.as_micros()).unwrap_or(u64::MAX))
                    .arg(mark_ms);
            }
            GrantRequest {
                set: None,
                script: inv,
            }
        } else {
            let (lock, label) = (&names.lock, owner.label());
            GrantRequest {
                set: Some(support::unfenced_set(lock, &owner_hex, ttl_ms, label)),
                script: support::unfenced_fallback(lock, &owner_hex, ttl_ms, label),
            }
        });
        let target = Arc::new((key.clone(), claim));
        let mut round = Round::new(
            "acquire",
            timeout,
            n,
            (0..n).map(|i| self.grant(i, timeout, request.clone(), target.clone())),
        );
        let mut granted: Vec<(usize, FencingToken)> = Vec::with_capacity(n);
        // The tokens of the granting copies the write-back had marked: a re-grant of the
        // owner's settled hold.
        let mut settled: Vec<FencingToken> = Vec::new();
        let mut held: Vec<Option<Duration>> = Vec::new();
        // The largest change stamp of the instances whose shared leases refused us: a
        // waiter counts a stamp above it as a change (see `wait.rs`).
        let mut stamp: Option<i64> = None;
        let mut answered = vec![false; n];
        let mut failures = Failures::default();
        while let Some((i, r)) = round.next().await {
            match r {
                Ok(Acquired::Granted(t, written_back)) => {
                    answered[i] = true;
                    granted.push((i, t));
                    if written_back {
                        settled.push(t);
                    }
                }
                Ok(Acquired::Held(pttl, rev)) => {
                    answered[i] = true;
                    held.push(pttl);
                    stamp = stamp.max(rev);
                }
                Err(e) => {
                    tracing::debug!(instance = %self.instances[i].label, error = %lockcore::ErrorChain(&e), "redlock acquire failed on an instance");
                    failures.add(&self.instances[i].label, e);
                }
            }
            // A re-grant of a settled hold whose first grants mix marked copies with copies
            // not written back yet (granted late, their write-back still on its way) hears
            // the rest too: with a majority of marked copies it keeps the holder's token.
            let unsettled = !round.is_empty()
                && granted.len() >= q
                && !settled.is_empty()
                && settled.len() + round.len() >= q
                && settled_token(&settled, q).is_none();
            if !unsettled && decided(granted.len(), granted.len() + held.len(), round.len(), q) {
                break;
            }
        }

        if granted.len() < q {
            // Released everywhere, stragglers included. Their requests are dropped, not left
            // to finish: whatever of them was sent queues before the release on the same
            // connection, and nothing is sent after it (an unfenced grant's fallback script
            // or a retry on a broken connection would otherwise land after the release and
            // stay until its TTL).
            drop(round);
            self.abandon(&names, &owner_hex, timeout, &answered, &granted)
                .await;
            let got = granted.len() + held.len();
            if got < q {
                return Err(self.too_few(got, failures));
            }
            if held.len() > n - q {
                // Another owner (or several) keeps a majority from us until enough of its
                // holds expire or are released.
                let remaining = time_until_at_most(held, n - q);
                let hint = stamp.map_or(WaitHint::none(), WaitHint::at_revision);
                return Ok(AcquireOutcome::Held(
                    Contention::new(remaining).with_hint(hint),
                ));
            }
            return Ok(self.retry_soon(started.elapsed()));
        }

        let token =
            holders_token(&granted, &settled, q).ok_or_else(|| support::unexpected("no grants"))?;
        if self.fencing {
            // Round 2: T = max over the grants, written back to every granter, so that any
            // later majority shares an instance whose fence is at least T.
            let round2 = self
                .write_back(&names, &owner_hex, token, timeout, &granted)
                .await;
            if !round2.acknowledged(q) {
                drop(round);
                self.abandon(&names, &owner_hex, timeout, &answered, &granted)
                    .await;
                if round2.answers < q {
                    return Err(self.too_few(round2.answers, round2.failures));
                }
                // The lock vanished from instances between the rounds (expired or broken):
                // start over.
                return Ok(self.retry_soon(started.elapsed()));
            }
        }
        if Instant::now() >= valid_until {
            drop(round);
            self.abandon(&names, &owner_hex, timeout, &answered, &granted)
                .await;
            tracing::debug!(key = %key, elapsed = ?started.elapsed(), "redlock grant came too late to be valid");
            return Ok(self.retry_soon(started.elapsed()));
        }
        if self.fencing && !round.is_empty() {
            // Instances that grant after the majority get T written back too: their fence
            // rises to T, and their copy carries T marked unless its own token is above T
            // (a later `TIME` read, the usual case): that copy stays unmarked, and readers
            // and re-grants go by the marked copies (see `holders_token`).
            let inner = self.clone();
            let write_back = Arc::new(write_back_script(&names, &owner_hex, token));
            let mut late = round.into_pending();
            tokio::spawn(async move {
                while let Some((i, r)) = late.next().await {
                    if matches!(r, Ok(Acquired::Granted(..))) {
                        let _ = inner
                            .op::<i64>(i, timeout, "fence write-back", write_back.clone())
                            .1
                            .await;
                    }
                }
            });
        }
        // Without fencing, the requests still unanswered are dropped: each was either sent
        // (its grant is ours, undone by our release or its TTL) or never will be.
        Ok(AcquireOutcome::Acquired(
            Grant::new(token, applied).with_valid_until(valid_until),
        ))
    }
}
