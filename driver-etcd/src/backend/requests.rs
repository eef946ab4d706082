//! The reads and transactions both layouts send (each with endpoint failover), how their
//! answers are read, and breaking a hold (the same for both layouts once the holder's key
//! is known).

use std::future::Future;

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};
use lockcore::{FencingToken, LockError, ReleaseOutcome};

use super::EtcdBackend;
use crate::capabilities::NAME;

impl EtcdBackend {
    /// The key-value at `key`, if any, and the revision of the read.
    pub(super) async fn get(&self, key: &[u8]) -> Result<(Option<KeyValue>, i64), LockError> {
        self.endpoints
            .call("get", |mut c| {
                let key = key.to_vec();
                async move {
                    let mut r = c.get(key, None).await?;
                    let rev = r.header().map(|h| h.revision()).unwrap_or(0);
                    Ok((r.take_kvs().into_iter().next(), rev))
                }
            })
            .await
    }

    /// Sends `txn` (guarded: the `when` compares decide what is applied).
    pub(super) async fn txn(&self, what: &'static str, txn: Txn) -> Result<TxnResponse, LockError> {
        self.endpoints
            .call(what, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
    }

    /// Breaks the hold of the key `holder` reads (the lock's key, or its queue's first):
    /// deletes it if it is still the same incarnation (its create revision), else reads
    /// again.
    pub(super) async fn force_release_holder<F, Fut>(
        &self,
        holder: F,
    ) -> Result<ReleaseOutcome, LockError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Option<KeyValue>, LockError>>,
    {
        for _ in 0..8 {
            let Some(kv) = holder().await? else {
                return Ok(ReleaseOutcome::NotHeld);
            };
            let txn = Txn::new()
                .when([Compare::create_revision(
                    kv.key().to_vec(),
                    CompareOp::Equal,
                    kv.create_revision(),
                )])
                .and_then([TxnOp::delete(kv.key().to_vec(), None)]);
            if self.txn("force release", txn).await?.succeeded() {
                // A holder's own lease has no key left now: revoke it, so that it is never
                // reused (the holder's renewals fail on the missing key anyway). A lease
                // that still carries keys (a client's shared renewal lease) keeps them.
                if kv.lease() != 0 {
                    let _ = self.leases.revoke_if_unused(kv.lease()).await;
                }
                return Ok(ReleaseOutcome::Released);
            }
        }
        Err(LockError::unavailable(
            NAME,
            "the lock kept changing hands during force_release",
        ))
    }
}

pub(super) fn header_revision(resp: &TxnResponse) -> i64 {
    resp.header().map(|h| h.revision()).unwrap_or(0)
}

/// The key-value the `or_else` get of a failed transaction returned.
pub(super) fn failed_get(resp: &TxnResponse) -> Option<KeyValue> {
    resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
        _ => None,
    })
}

/// The fencing token of a hold: its key's create revision.
pub(super) fn token_of(kv: &KeyValue) -> FencingToken {
    FencingToken(u64::try_from(kv.create_revision()).unwrap_or(0))
}

/// The lease of the key the delete of a transaction removed (asked `with_prev_key`).
pub(super) fn deleted_lease(resp: &TxnResponse) -> Option<i64> {
    deleted_kv(resp).map(|kv| kv.lease())
}

/// The key the delete of a transaction removed, as it was (asked `with_prev_key`).
pub(super) fn deleted_kv(resp: &TxnResponse) -> Option<KeyValue> {
    resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Delete(d) => d.prev_kvs().first().cloned(),
        _ => None,
    })
}

/// The first key of the `n`th response of `resp`, if it is a range.
pub(super) fn nth_first(resp: &TxnResponse, n: usize) -> Option<KeyValue> {
    nth_all(resp, n).into_iter().next()
}

/// The keys of the `n`th response of `resp`, if it is a range.
pub(super) fn nth_all(resp: &TxnResponse, n: usize) -> Vec<KeyValue> {
    match resp.op_responses().into_iter().nth(n) {
        Some(TxnOpResponse::Get(mut g)) => g.take_kvs(),
        _ => Vec::new(),
    }
}
