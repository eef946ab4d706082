//! The [`LockBackend`] operations: each one Lua script, run by [`RedisBackend`].

use std::time::Duration;

use async_trait::async_trait;
use lockcore::driver::{
    AcquireOutcome, Capabilities, ClaimRequest, ExtendOutcome, Grant, ReleaseNotifier, Renewal,
    WaitHint, STARVING_MARK_TTL,
};
use lockcore::{
    Claim, FencingToken, LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseOutcome,
};
use redis::Value;

use crate::backend::RedisBackend;
use crate::capabilities::{ttl_millis, CAPABILITIES, UNFENCED_CAPABILITIES};
use crate::error::{self, NAME};
use crate::names;
use crate::reply::{acquire_outcome, as_token, inspected};
use crate::scripts;

#[async_trait]
impl LockBackend for RedisBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        if self.fencing {
            CAPABILITIES
        } else {
            UNFENCED_CAPABILITIES
        }
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        if request.claim.is_exclusive() {
            self.acquire(request).await
        } else {
            self.claim_shared(request).await
        }
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        let names = self.names(key);
        let script = self.lua(&scripts::RELEASE);
        let call = scripts::release_call(script, &names, &owner.token().hex_digits());
        let released: i64 = self.bounded_evalsha("release", script, &call).await?;
        Ok(match released {
            0 => ReleaseOutcome::NotHeld,
            announced => {
                // Unannounced: no waiter of another client watches this lock (each would
                // have marked it), but one of ours may sleep on it since an earlier holder.
                if announced == 1 {
                    self.waiters.wake_local(key);
                }
                ReleaseOutcome::Released
            }
        })
    }

    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        // One script over every renewal whose TTL is valid (on a cluster, one per hash slot
        // among them, sent together); the others answer alone.
        let ttls: Vec<Result<u64, LockError>> =
            renewals.iter().map(|r| ttl_millis(r.ttl)).collect();
        let valid: Vec<usize> = (0..renewals.len()).filter(|&i| ttls[i].is_ok()).collect();
        let batches: Vec<Vec<usize>> = if valid.is_empty() {
            Vec::new()
        } else if self.conn.is_cluster() {
            let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
            let mut name = String::new();
            for &i in &valid {
                name.clear();
                names::write_lock(&mut name, &self.prefix, renewals[i].key);
                by_slot.entry(names::slot(&name)).or_default().push(i);
            }
            by_slot.into_values().collect()
        } else {
            vec![valid]
        };
        let sent = batches.iter().map(|batch| {
            let items: Vec<(&Renewal<'_>, u64)> = batch
                .iter()
                .filter_map(|&i| Some((&renewals[i], *ttls[i].as_ref().ok()?)))
                .collect();
            async move { self.extend_batch(&items).await }
        });
        let replies = futures_util::future::join_all(sent).await;
        // Which batch, and which place in it, answers for each renewal.
        let mut place = vec![None; renewals.len()];
        for (b, batch) in batches.iter().enumerate() {
            for (n, &i) in batch.iter().enumerate() {
                place[i] = Some((b, n));
            }
        }
        if let [Err(_)] = replies.as_slice() {
            // One request carried every renewal: its failure is the whole batch's.
            if let Some(Err(e)) = replies.into_iter().next() {
                return Err(e);
            }
            return Err(error::unexpected("extend reply"));
        }
        Ok(ttls
            .into_iter()
            .zip(place)
            .map(|(ttl, place)| {
                let ttl_ms = ttl?;
                let (b, n) = place.ok_or_else(|| error::unexpected("extend batch"))?;
                let answer = match replies.get(b) {
                    Some(Ok(values)) => values.get(n),
                    Some(Err(e)) => return Err(error::copy(e)),
                    None => None,
                };
                match answer {
                    Some(Value::Int(0)) => Ok(ExtendOutcome::NotHeld),
                    Some(token) => {
                        let token =
                            as_token(token).ok_or_else(|| error::unexpected("extend token"))?;
                        Ok(ExtendOutcome::Extended(Grant::new(
                            token,
                            Duration::from_millis(ttl_ms),
                        )))
                    }
                    None => Err(error::unexpected("extend reply")),
                }
            })
            .collect())
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        let names = self.names(key);
        let mut invocation = self.lua(&scripts::INSPECT_ALL).key(&names.lock);
        invocation.key(names.leases()).key(names.claims());
        let reply: Vec<Vec<Value>> = self.bounded_script("inspect all", &invocation).await?;
        let mut leases = reply
            .iter()
            .map(|lease| inspected(lease).ok_or_else(|| error::unexpected("inspect lease")))
            .collect::<Result<Vec<_>, _>>()?;
        leases.sort_by_key(|lease| lease.token);
        Ok(leases)
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let names = self.names(key);
        // Order matters: in-process interest first, then the server subscription, then
        // the re-check, so a release at any point after the failed attempt wakes us.
        // The re-check marks the lock, so that its release publishes (a release of a lock
        // nobody watches does not).
        let subscription = self.waiters.subscribe_local(key, place);
        let _registration = self.waiters.register(key, &names.channel()).await?;
        // A claim refused by shared leases passes the change stamp its refusal saw: the
        // re-check answers "free" when anything was released since, and marks the leases
        // so that later releases publish.
        let mut watch = self.lua(&scripts::WATCH).key(&names.lock);
        if let Some(rev) = hint.revision() {
            watch.key(names.leases()).key(names.claims()).arg(rev);
        }
        let pttl: i64 = self.bounded_script("watch", &watch).await?;
        let wait = match pttl {
            -2 => return Ok(()),
            // No expiry should never happen to a distlock key; wait the caller's bound.
            -1 => max_wait,
            ms => max_wait.min(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        };
        let _ = tokio::time::timeout(wait, subscription.released()).await;
        Ok(())
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        let names = self.names(key);
        let mut invocation = self.lua(&scripts::FORCE_RELEASE).key(&names.lock);
        invocation
            .key(names.leases())
            .key(names.claims())
            .arg(names.channel());
        let released: i64 = self.bounded_script("force release", &invocation).await?;
        Ok(if released == 1 {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        let names = self.names(key);
        let mut invocation = self.lua(&scripts::ABANDON).key(&names.lock);
        invocation
            .key(names.leases())
            .key(names.claims())
            .arg(owner.token().to_hex());
        let removed: i64 = self.bounded_script("abandon", &invocation).await?;
        if removed == 1 {
            // Unannounced: no other client watches, but a waiter of ours may have been
            // held back by the reservation.
            self.waiters.wake_local(key);
        }
        Ok(())
    }

    fn notifier(&self) -> Option<&ReleaseNotifier> {
        Some(self.waiters.notifier())
    }

    async fn shutdown(&self) {
        self.waiters.shutdown().await;
    }
}

impl RedisBackend {
    /// The exclusive claim: the unfenced `SET NX PX`, or [`scripts::ACQUIRE`],
    /// which a request that has waited long (`request.waited`) asks to mark the key as its
    /// next turn.
    async fn acquire(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let ClaimRequest {
            key, owner, ttl, ..
        } = *request;
        let ttl_ms = ttl_millis(ttl)?;
        let names = self.names(key);
        if !self.fencing {
            return self.acquire_unfenced(key, owner, ttl_ms).await;
        }
        let mut invocation = scripts::grant_call(
            self.lua(&scripts::ACQUIRE),
            &names,
            &owner.token().to_hex(),
            ttl_ms,
            owner.label(),
            None,
        );
        if let Some(waited) = request.waited {
            // A long wait asks to be next (see `scripts::ACQUIRE`).
            let mark_ms = ttl_ms.min(ttl_millis(STARVING_MARK_TTL)?);
            let waited_us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
            invocation.arg("").arg(waited_us).arg(mark_ms);
        }
        let reply: Vec<Value> = self.bounded_script("acquire", &invocation).await?;
        acquire_outcome(
            &reply,
            key,
            &Claim::exclusive(),
            Duration::from_millis(ttl_ms),
        )
    }

    /// A shared claim (read-write lock or semaphore): [`scripts::CLAIM`], in the plain
    /// fenced layout only.
    async fn claim_shared(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let ClaimRequest {
            key,
            owner,
            ttl,
            claim,
            ..
        } = *request;
        if !self.fencing {
            return Err(LockError::claims_unsupported(
                "redis (fencing=false)",
                &claim,
            ));
        }
        let ttl_ms = ttl_millis(ttl)?;
        let names = self.names(key);
        let invocation = scripts::grant_call(
            self.lua(&scripts::CLAIM),
            &names,
            &owner.token().to_hex(),
            ttl_ms,
            owner.label(),
            Some(&claim),
        );
        let reply: Vec<Value> = self.bounded_script("claim", &invocation).await?;
        acquire_outcome(&reply, key, &claim, Duration::from_millis(ttl_ms))
    }

    /// One `EXTEND_MANY` over `items` (renewal, TTL in ms), whose locks a cluster must hold
    /// in one slot: one answer per item, in order.
    async fn extend_batch(&self, items: &[(&Renewal<'_>, u64)]) -> Result<Vec<Value>, LockError> {
        // Every key and argument written into the command's one buffer: a batch of 1,024
        // renewals otherwise allocates about 9,000 strings (a profile at 100,000 holds spent
        // half its time in malloc and free).
        let script = self.lua(&scripts::EXTEND_MANY);
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(script.get_hash()).arg(items.len() * 3);
        let mut name = String::new();
        for (renewal, _) in items {
            name.clear();
            names::write_lock(&mut name, &self.prefix, renewal.key);
            evalsha.arg(name.as_str());
            let lock = name.len();
            name.push_str(":leases");
            evalsha.arg(name.as_str());
            name.truncate(lock);
            name.push_str(":claims");
            evalsha.arg(name.as_str());
        }
        for (renewal, ttl_ms) in items {
            evalsha
                .arg(&renewal.owner.token().hex_digits()[..])
                .arg(*ttl_ms);
        }
        let reply: Vec<Value> = self.bounded_evalsha("extend", script, &evalsha).await?;
        if reply.len() != items.len() {
            return Err(error::unexpected("extend reply"));
        }
        Ok(reply)
    }

    /// An unfenced grant: the plain `SET NX PX`, and the light script only where it is
    /// refused (to re-grant to the same owner, or read the holder's remaining TTL).
    async fn acquire_unfenced(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl_ms: u64,
    ) -> Result<AcquireOutcome, LockError> {
        let names = self.names(key);
        let owner_hex = owner.token().to_hex();
        let set = scripts::unfenced_set(&names.lock, &owner_hex, ttl_ms, owner.label());
        let ttl = Duration::from_millis(ttl_ms);
        let reply: Value = self.bounded_command("acquire", &set).await?;
        if reply != Value::Nil {
            return Ok(AcquireOutcome::Acquired(Grant::new(FencingToken(0), ttl)));
        }
        let fallback = scripts::unfenced_fallback(&names.lock, &owner_hex, ttl_ms, owner.label());
        let reply: Vec<Value> = self.bounded_script("acquire", &fallback).await?;
        acquire_outcome(&reply, key, &Claim::exclusive(), ttl)
    }
}
