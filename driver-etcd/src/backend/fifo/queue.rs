//! A lock's queue as a transaction sees it: the range that reads it, one place's key as a
//! queue transaction found it, and which places hold.

use std::time::Instant;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnResponse,
};
use lockcore::Claim;

use super::places::Place;
use crate::backend::leases::LeaseState;
use crate::encoding::claim_of;

/// The range of a lock's whole queue, sorted by create revision (`limit` 0: every key).
pub(super) fn queue_range(order: SortOrder, limit: i64) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, order)
        .with_limit(limit)
}

/// A queue transaction: put the place `own` bound to `lease` if it is absent, then read
/// `after_put`; else read the place, then `present`. Either way the first answer is the
/// place (what `EtcdBackend::enter_queue` looks at).
pub(super) fn place_txn(
    own: &[u8],
    value: &[u8],
    lease: i64,
    after_put: impl IntoIterator<Item = TxnOp>,
    present: impl IntoIterator<Item = TxnOp>,
) -> Txn {
    let put = TxnOp::put(
        own.to_vec(),
        value.to_vec(),
        Some(PutOptions::new().with_lease(lease)),
    );
    Txn::new()
        .when([Compare::create_revision(own.to_vec(), CompareOp::Equal, 0)])
        .and_then([put].into_iter().chain(after_put).collect::<Vec<_>>())
        .or_else(
            [TxnOp::get(own.to_vec(), None)]
                .into_iter()
                .chain(present)
                .collect::<Vec<_>>(),
        )
}

/// A place's key as one queue transaction saw it (see `EtcdBackend::enter_queue`).
pub(super) struct Entered {
    pub(super) resp: TxnResponse,
    /// Whether the transaction created the key.
    pub(super) created: bool,
    /// The key's create revision: its position in the queue, and its token once granted.
    pub(super) rev: i64,
    /// The revision the place was known at before the transaction (0: unknown).
    pub(super) known_rev: i64,
    /// What the key claims (as stored, when it was already there).
    pub(super) claim: Claim,
    pub(super) lease: LeaseState,
    /// When the transaction was sent: a grant's validity counts from here.
    pub(super) started: Instant,
    /// The place, as reserved before the transaction.
    pub(super) place: Place,
    /// The place's etcd key.
    pub(super) own: Vec<u8>,
}

/// The weights of the keys of `queue` created before revision `rev`.
pub(super) fn used_before(queue: &[KeyValue], rev: i64) -> u64 {
    queue
        .iter()
        .filter(|kv| kv.create_revision() < rev)
        .fold(0, |sum, kv| {
            sum.saturating_add(claim_of(kv.value()).weight())
        })
}

/// Whether a place created at `rev` claiming `claim` holds, by the keys of `queue`: the
/// weights of every key before it, holding or waiting, leave room for it.
pub(super) fn fits_at(queue: &[KeyValue], rev: i64, claim: &Claim) -> bool {
    claim.fits(used_before(queue, rev), 0)
}

/// The places of `queue` (in queue order) that hold: each fits with every key before it.
pub(super) fn holders(queue: &[KeyValue]) -> Vec<&KeyValue> {
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
