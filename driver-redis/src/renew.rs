//! Renewal: the watchdog's batches, one script per batch (per hash slot on a cluster).

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
        let valid: Vec<usize> = (0..renewals.len()).filter(|&i| ttls[i].is_ok()).collect();
        let batches: Vec<Vec<usize>> = if valid.is_empty() {
            Vec::new()
        } else if self.commands.is_cluster() {
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
