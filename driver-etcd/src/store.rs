//! What is sent to etcd: reads and transactions (each with endpoint failover), how their
//! answers are read, and a lock's queue as a transaction sees it: the range that reads it,
//! one place's key as a queue transaction found it, and which places hold.

use etcd_client::{
    Compare, CompareOp, GetOptions, GetResponse, KeyValue, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use lockcore::{Claim, FencingToken, LockError};

use crate::backend::EtcdBackend;
use crate::encoding::claim_of;

impl EtcdBackend {
    /// Reads `key` (with `opts`: a prefix, a sort, a limit…).
    pub(crate) async fn range(
        &self,
        key: &[u8],
        opts: GetOptions,
    ) -> Result<GetResponse, LockError> {
        self.endpoints
            .call("get", |mut c| {
                let (key, opts) = (key.to_vec(), opts.clone());
                async move { c.get(key, Some(opts)).await }
            })
            .await
    }

    /// The key-value at `key`, if any, and the revision of the read.
    #[cfg(test)]
    pub(crate) async fn get(&self, key: &[u8]) -> Result<(Option<KeyValue>, i64), LockError> {
        let mut r = self.range(key, GetOptions::new()).await?;
        let rev = r.header().map_or(0, |h| h.revision());
        Ok((r.take_kvs().into_iter().next(), rev))
    }

    /// Sends `txn` (guarded: the `when` compares decide what is applied).
    pub(crate) async fn txn(&self, what: &'static str, txn: Txn) -> Result<TxnResponse, LockError> {
        self.endpoints
            .call(what, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
    }
}

pub(crate) fn header_revision(resp: &TxnResponse) -> i64 {
    resp.header().map(|h| h.revision()).unwrap_or(0)
}

/// The fencing token of a hold: its key's create revision.
pub(crate) fn token_of(kv: &KeyValue) -> FencingToken {
    FencingToken(u64::try_from(kv.create_revision()).unwrap_or(0))
}

/// The key the delete of a transaction removed, as it was (asked `with_prev_key`).
pub(crate) fn deleted_kv(resp: &TxnResponse) -> Option<KeyValue> {
    resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Delete(d) => d.prev_kvs().first().cloned(),
        _ => None,
    })
}

/// The first key of the `n`th response of `resp`, if it is a range.
pub(crate) fn nth_first(resp: &TxnResponse, n: usize) -> Option<KeyValue> {
    nth_all(resp, n).into_iter().next()
}

/// The keys of the `n`th response of `resp`, if it is a range.
pub(crate) fn nth_all(resp: &TxnResponse, n: usize) -> Vec<KeyValue> {
    match resp.op_responses().into_iter().nth(n) {
        Some(TxnOpResponse::Get(mut g)) => g.take_kvs(),
        _ => Vec::new(),
    }
}

/// The range of a lock's whole queue, in queue order (by create revision).
pub(crate) fn queue_range() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}

/// The part of a lock's queue that shows whether a place claiming `claim` holds: the first
/// key for an exclusive claim, the whole queue for a share.
pub(crate) fn holding_range(claim: &Claim) -> GetOptions {
    queue_range().with_limit(if claim.is_exclusive() { 1 } else { 0 })
}

/// Deletes `own` if it is still the key created at revision `rev` (not a later one of the
/// same name).
pub(crate) fn delete_if_created_at(own: &[u8], rev: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(
            own.to_vec(),
            CompareOp::Equal,
            rev,
        )])
        .and_then([TxnOp::delete(own.to_vec(), None)])
}

/// The weights of the keys of `queue` created before revision `rev`.
pub(crate) fn used_before(queue: &[KeyValue], rev: i64) -> u64 {
    queue
        .iter()
        .filter(|kv| kv.create_revision() < rev)
        .fold(0, |sum, kv| {
            sum.saturating_add(claim_of(kv.value()).weight())
        })
}

/// Whether a place created at `rev` claiming `claim` holds, by the keys of `queue`: the
/// weights of every key before it, holding or waiting, leave room for it.
pub(crate) fn fits_at(queue: &[KeyValue], rev: i64, claim: &Claim) -> bool {
    claim.fits(used_before(queue, rev), 0)
}

/// The places of `queue` (in queue order) that hold: each fits with every key before it.
pub(crate) fn holders(queue: &[KeyValue]) -> Vec<&KeyValue> {
    let mut before = 0u64;
    let mut out = Vec::new();
    for kv in queue {
        let claim = claim_of(kv.value());
        if claim.fits(before, 0) {
            out.push(kv);
        }
        before = before.saturating_add(claim.weight());
    }
    out
}
