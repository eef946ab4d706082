//! Renewal: the watchdog's batches, one script per batch (per hash slot on a cluster).

use std::collections::BTreeMap;
use std::time::Duration;

use lockcore::driver::{ExtendOutcome, Grant, Renewal};
use lockcore::LockError;
use redis::Value;

use crate::backend::RedisBackend;
use crate::error;
use crate::names;
use crate::store::{self, as_token, ttl_millis};

impl RedisBackend {
    /// The batch renewal: one [`EXTEND_MANY`](crate::store::EXTEND_MANY) over every renewal
    /// whose TTL is valid (on a cluster, one per hash slot among them, sent together); the
    /// others answer alone. One answer per renewal, in order; the whole batch's error when
    /// one request carried every renewal and failed.
    pub(crate) async fn renew_batch(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        let ttls: Vec<Result<u64, LockError>> =
            renewals.iter().map(|r| ttl_millis(r.ttl)).collect();
        // The renewals of each batch, by hash slot (all in slot 0 on one server).
        let mut batches: BTreeMap<u16, Vec<(usize, u64)>> = BTreeMap::new();
        let mut name = String::new();
        for (i, ttl) in ttls.iter().enumerate() {
            let Ok(ttl_ms) = ttl else { continue };
            let slot = if self.commands.is_cluster() {
                name.clear();
                names::write_lock(&mut name, &self.prefix, renewals[i].key);
                names::slot(&name)
            } else {
                0
            };
            batches.entry(slot).or_default().push((i, *ttl_ms));
        }
        let sent = batches.values().map(|batch| {
            let items: Vec<(&Renewal<'_>, u64)> = batch
                .iter()
                .map(|&(i, ttl_ms)| (&renewals[i], ttl_ms))
                .collect();
            async move { self.extend_batch(&items).await }
        });
        let mut replies = futures_util::future::join_all(sent).await;
        if let [Err(_)] = replies.as_slice() {
            // One request carried every renewal: its failure is the whole batch's.
            if let Some(Err(e)) = replies.pop() {
                return Err(e);
            }
        }
        // Each renewal with a valid TTL is in one batch, whose answer replaces this.
        let mut out: Vec<Result<ExtendOutcome, LockError>> = ttls
            .into_iter()
            .map(|ttl| ttl.map(|_| ExtendOutcome::NotHeld))
            .collect();
        for (batch, reply) in batches.values().zip(&replies) {
            for (n, &(i, ttl_ms)) in batch.iter().enumerate() {
                out[i] = match reply.as_ref().map(|values| values.get(n)) {
                    Err(e) => Err(error::copy(e)),
                    Ok(Some(Value::Int(0))) => Ok(ExtendOutcome::NotHeld),
                    Ok(Some(token)) => as_token(token)
                        .map(|token| {
                            ExtendOutcome::Extended(Grant::new(
                                token,
                                Duration::from_millis(ttl_ms),
                            ))
                        })
                        .ok_or_else(|| error::unexpected("extend token")),
                    Ok(None) => Err(error::unexpected("extend reply")),
                };
            }
        }
        Ok(out)
    }

    /// One `EXTEND_MANY` over `items` (renewal, TTL in ms), whose locks a cluster must hold
    /// in one slot: one answer per item, in order.
    async fn extend_batch(&self, items: &[(&Renewal<'_>, u64)]) -> Result<Vec<Value>, LockError> {
        // Every key and argument written into the command's one buffer: a batch of 1,024
        // renewals otherwise allocates about 9,000 strings (a profile at 100,000 holds spent
        // half its time in malloc and free).
        let script = self.lua(&store::EXTEND_MANY);
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
        let reply: Vec<Value> = self.commands.evalsha("extend", script, &evalsha).await?;
        if reply.len() != items.len() {
            return Err(error::unexpected("extend reply"));
        }
        Ok(reply)
    }
}
