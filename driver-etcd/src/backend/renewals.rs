//! Batched renewals (plain layout): one keep-alive per shared lease and one transaction
//! per [`MAX_TXN_OPS`] holds (per [`MAX_NESTED_TXNS`] on a hold's first renewal, which
//! moves it), whatever the number of holds.
//!
//! A hold is granted on a lease of its own. Its first batched renewal with the hold's own
//! TTL (the watchdog's) moves its key onto the backend's shared lease for that TTL (a put that keeps the value, guarded by the
//! holder's value and its own lease: a released or re-taken key is never touched); from
//! then on, the shared lease's keep-alive moves its end and a read-only transaction of
//! gets proves each key is still this owner's, on the shared lease. See
//! `leases/shared.rs` for what keeps an unrenewed key from living on.

use std::collections::BTreeMap;
use std::time::Instant;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};
use futures_util::{StreamExt, TryStreamExt};
use lockcore::driver::{ExtendOutcome, Renewal};
use lockcore::{FencingToken, LockError};

use super::leases::{ttl_secs, LeaseState, MAX_NESTED_TXNS, MAX_TXN_OPS};
use super::requests::{header_revision, token_of};
use super::EtcdBackend;
use crate::encoding::{held_by, holder_value};

/// How many of a batch's transactions are in flight at once.
const TXNS_IN_FLIGHT: usize = 4;

type Outcomes = Vec<Option<Result<ExtendOutcome, LockError>>>;

impl EtcdBackend {
    /// Renews `renewals` in one keep-alive per shared lease and one transaction per
    /// [`MAX_TXN_OPS`] keys; an outcome per renewal, in order.
    pub(super) async fn plain_renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        let mut out: Outcomes = renewals.iter().map(|_| None).collect();
        let mut by_secs: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for (i, r) in renewals.iter().enumerate() {
            match self.caps.effective_ttl(r.ttl) {
                Ok(ttl) => by_secs.entry(ttl_secs(ttl)).or_default().push(i),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        for (secs, batch) in by_secs {
            let started = Instant::now();
            let shared = self.leases.shared_lease(secs).await?;
            let mut seen = Vec::new();
            let mut unseen = Vec::new();
            let mut moves = Vec::new();
            let mut singles = Vec::new();
            for i in batch {
                let r = &renewals[i];
                match self.leases.held(r.key, r.owner) {
                    // Already on the shared lease, seen unchanged at a known revision: a
                    // compare proves it still is (a missing key's mod revision compares as
                    // 0, hence only known revisions).
                    Some(h) if h.lease.id == shared.id && h.rev > 0 => {
                        seen.push((i, Some((h.rev, h.token))))
                    }
                    // On the shared lease at an unknown revision: read the key.
                    Some(h) if h.lease.id == shared.id => unseen.push((i, None)),
                    // On its own lease of this TTL: move the key onto the shared one.
                    Some(h) if h.lease.asked_for(secs) => moves.push((i, h.lease)),
                    // On a lease of another TTL (an explicit extend asking a TTL other
                    // than the hold's): a move would give it the shared lease's TTL,
                    // which may shorten it. Its own lease is kept alive instead (an etcd
                    // lease keeps the TTL it was granted with).
                    Some(_) => singles.push(i),
                    // Not known to this backend (made by another, or its record swept):
                    // renewed alone.
                    None => singles.push(i),
                }
            }
            let checks: Vec<_> = seen
                .chunks(MAX_TXN_OPS)
                .chain(unseen.chunks(MAX_TXN_OPS))
                .map(|chunk| self.check_chunk(renewals, chunk))
                .collect();
            let moves: Vec<_> = moves
                .chunks(MAX_NESTED_TXNS)
                .map(|chunk| self.move_chunk(renewals, chunk, shared))
                .collect();
            let checked = futures_util::stream::iter(checks)
                .buffered(TXNS_IN_FLIGHT)
                .try_collect::<Vec<_>>();
            let moved = futures_util::stream::iter(moves)
                .buffered(TXNS_IN_FLIGHT)
                .try_collect::<Vec<_>>();
            let (checked, moved) = tokio::join!(checked, moved);
            for (i, found) in checked?.into_iter().flatten() {
                let r = &renewals[i];
                let renewed = match found {
                    Checked::Unchanged(token) => {
                        Some(ExtendOutcome::Extended(shared.grant(token, started)))
                    }
                    Checked::Read(kv) => kv.and_then(|kv| self.on_shared(r, &kv, shared, started)),
                };
                out[i] = Some(Ok(renewed.unwrap_or_else(|| {
                    self.leases.take_hold(r.key, r.owner);
                    ExtendOutcome::NotHeld
                })));
            }
            for (i, old, answer) in moved?.into_iter().flatten() {
                let r = &renewals[i];
                let renewed = match answer {
                    Moved::Done(kv, rev) => {
                        let token = token_of(&kv);
                        self.leases
                            .set_shared_hold(r.key, r.owner, shared, rev, token);
                        // Its own lease has no key left: kept for a later acquisition,
                        // or left to expire.
                        self.leases.offer_spare(old);
                        Some(ExtendOutcome::Extended(shared.grant(token, started)))
                    }
                    // Moved by an earlier try whose answer was lost?
                    Moved::Refused(Some(kv)) => match self.on_shared(r, &kv, shared, started) {
                        Some(renewed) => Some(renewed),
                        None if held_by(kv.value(), r.owner.token()) && kv.lease() == old.id => {
                            // Ours under another label: renewed alone, on its own lease.
                            singles.push(i);
                            continue;
                        }
                        None => None,
                    },
                    Moved::Refused(None) => None,
                };
                out[i] = Some(Ok(renewed.unwrap_or_else(|| {
                    self.leases.take_hold(r.key, r.owner);
                    ExtendOutcome::NotHeld
                })));
            }
            let alone = singles
                .iter()
                .map(|&i| self.plain_extend(renewals[i].key, renewals[i].owner));
            for (i, outcome) in singles
                .iter()
                .zip(futures_util::future::join_all(alone).await)
            {
                out[*i] = Some(outcome);
            }
        }
        Ok(out
            .into_iter()
            .map(|o| o.unwrap_or(Ok(ExtendOutcome::NotHeld)))
            .collect())
    }

    /// The renewal of `r` if `kv`, its key as read, is this owner's on `shared`: the key's
    /// revision is recorded for the next batch's compare.
    fn on_shared(
        &self,
        r: &Renewal<'_>,
        kv: &KeyValue,
        shared: LeaseState,
        started: Instant,
    ) -> Option<ExtendOutcome> {
        if !held_by(kv.value(), r.owner.token()) || kv.lease() != shared.id {
            return None;
        }
        let token = token_of(kv);
        self.leases
            .set_shared_hold(r.key, r.owner, shared, kv.mod_revision(), token);
        Some(ExtendOutcome::Extended(shared.grant(token, started)))
    }

    /// Proves the keys of `chunk` still this backend's holds: where every key's mod
    /// revision is known, one transaction of compares proves them unchanged, and nothing is
    /// read; if one compare fails (or a revision is unknown), every key of the chunk is read
    /// and judged on its own.
    async fn check_chunk(
        &self,
        renewals: &[Renewal<'_>],
        chunk: &[(usize, Option<(i64, FencingToken)>)],
    ) -> Result<Vec<(usize, Checked)>, LockError> {
        if let Some(seen) = chunk.iter().map(|&(_, s)| s).collect::<Option<Vec<_>>>() {
            let unchanged = chunk.iter().zip(&seen).map(|(&(i, _), &(rev, _))| {
                Compare::mod_revision(self.etcd_key(renewals[i].key), CompareOp::Equal, rev)
            });
            let txn = Txn::new().when(unchanged.collect::<Vec<_>>());
            if self.txn("renew", txn).await?.succeeded() {
                return Ok(chunk
                    .iter()
                    .zip(seen)
                    .map(|(&(i, _), (_, token))| (i, Checked::Unchanged(token)))
                    .collect());
            }
        }
        let gets = chunk
            .iter()
            .map(|&(i, _)| TxnOp::get(self.etcd_key(renewals[i].key), None));
        let resp = self
            .txn("renew", Txn::new().and_then(gets.collect::<Vec<_>>()))
            .await?;
        let mut found = resp.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
            _ => None,
        });
        Ok(chunk
            .iter()
            .map(|&(i, _)| (i, Checked::Read(found.next().flatten())))
            .collect())
    }

    /// Moves the keys of `chunk` onto `shared` in one transaction of guarded puts.
    async fn move_chunk(
        &self,
        renewals: &[Renewal<'_>],
        chunk: &[(usize, LeaseState)],
        shared: LeaseState,
    ) -> Result<Vec<(usize, LeaseState, Moved)>, LockError> {
        let puts = chunk.iter().map(|&(i, old)| {
            let k = self.etcd_key(renewals[i].key);
            TxnOp::txn(
                Txn::new()
                    .when([
                        Compare::value(
                            k.clone(),
                            CompareOp::Equal,
                            holder_value(renewals[i].owner),
                        ),
                        Compare::lease(k.clone(), CompareOp::Equal, old.id),
                    ])
                    .and_then([TxnOp::put(
                        k.clone(),
                        Vec::new(),
                        Some(
                            PutOptions::new()
                                .with_lease(shared.id)
                                .with_ignore_value()
                                .with_prev_key(),
                        ),
                    )])
                    .or_else([TxnOp::get(k, None)]),
            )
        });
        let resp = self
            .txn("renew", Txn::new().and_then(puts.collect::<Vec<_>>()))
            .await?;
        // Every put of one transaction leaves its key at the transaction's revision.
        let rev = header_revision(&resp);
        let mut answers = resp.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Txn(t) => {
                let kv = t.op_responses().into_iter().find_map(|r| match r {
                    TxnOpResponse::Put(mut p) => p.take_prev_key(),
                    TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
                    _ => None,
                });
                match (t.succeeded(), kv) {
                    (true, Some(kv)) => Moved::Done(kv, rev),
                    (_, kv) => Moved::Refused(kv),
                }
            }
            _ => Moved::Refused(None),
        });
        Ok(chunk
            .iter()
            .map(|&(i, old)| (i, old, answers.next().unwrap_or(Moved::Refused(None))))
            .collect())
    }
}

/// What a check found of one key.
enum Checked {
    /// Unchanged since it was last seen this hold's (whose token it carries).
    Unchanged(FencingToken),
    /// The key as it is, if any.
    Read(Option<KeyValue>),
}

/// The answer to one guarded move.
enum Moved {
    /// Moved, at this mod revision; the key as it was before.
    Done(KeyValue, i64),
    /// Not moved; the key as it is, if any.
    Refused(Option<KeyValue>),
}

#[cfg(test)]
mod tests {
    //! Against the etcd of `DISTLOCK_TEST_ETCD_URL` (`scripts/test.sh` starts one): what a
    //! failed release leaves on the shared lease.

    use std::time::Duration;

    use lockcore::driver::{AcquireOutcome, LockBackendExt};
    use lockcore::{LockBackend, LockKey, Owner};

    use super::*;
    use crate::EtcdConfig;

    const TTL: Duration = Duration::from_secs(10);

    fn backend() -> std::sync::Arc<EtcdBackend> {
        let url = match std::env::var("DISTLOCK_TEST_ETCD_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => panic!(
                "DISTLOCK_TEST_ETCD_URL is not set: run `scripts/servers.sh start` and the tests \
                 through `scripts/test.sh` (or source target/test-servers.env)"
            ),
        };
        let token = lockcore::driver::OwnerToken::generate().to_hex();
        let cfg = EtcdConfig::parse(&url)
            .and_then(|c| c.with_namespace(&format!("distlock-test/{}/", &token[..12])))
            .unwrap();
        EtcdBackend::new(cfg).unwrap()
    }

    /// Holds on `names` (one owner each), each on a lease of its own: keys, owners, tokens.
    async fn holds(
        backend: &EtcdBackend,
        names: [&str; 3],
    ) -> (Vec<LockKey>, Vec<Owner>, Vec<FencingToken>) {
        let keys: Vec<LockKey> = names.iter().map(|k| LockKey::new(*k).unwrap()).collect();
        let owners: Vec<Owner> = keys.iter().map(|_| Owner::new("holder")).collect();
        let mut tokens = Vec::new();
        for (k, o) in keys.iter().zip(&owners) {
            match backend.try_acquire(k, o, TTL).await.unwrap() {
                AcquireOutcome::Acquired(g) => tokens.push(g.token),
                other => panic!("{k}: {other:?}"),
            }
        }
        (keys, owners, tokens)
    }

    /// Writes "someone else" into `key`, on the lease `lease`, behind the backend's back.
    async fn put_behind_the_back(backend: &EtcdBackend, key: &LockKey, lease: i64) {
        let k = backend.etcd_key(key);
        backend
            .endpoints
            .call("put", |mut c| {
                let k = k.clone();
                async move {
                    c.put(
                        k,
                        b"someone else".to_vec(),
                        Some(PutOptions::new().with_lease(lease)),
                    )
                    .await
                }
            })
            .await
            .unwrap();
    }

    /// A hold on the shared lease is proven by a compare of its key's mod revision, as
    /// recorded by the batch that moved it: a key changed since (another value on the same
    /// lease and create revision, or deleted and taken by another owner) answers `NotHeld`,
    /// alone in its chunk.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_changed_behind_a_compared_hold_answers_not_held_alone() {
        let backend = backend();
        let (keys, owners, tokens) = holds(&backend, ["overwritten", "retaken", "untouched"]).await;
        let all: Vec<Renewal<'_>> = keys
            .iter()
            .zip(&owners)
            .map(|(k, o)| Renewal::new(k, o, TTL))
            .collect();
        for round in ["moves", "compares"] {
            let outcomes = backend.renew(&all).await.unwrap();
            for ((k, token), outcome) in keys.iter().zip(&tokens).zip(&outcomes) {
                match outcome {
                    Ok(ExtendOutcome::Extended(g)) => {
                        assert_eq!(g.token, *token, "{k}: another token ({round})")
                    }
                    other => panic!("{k}: {other:?} ({round})"),
                }
            }
            for (k, o) in keys.iter().zip(&owners) {
                let (kv, _) = backend.get(&backend.etcd_key(k)).await.unwrap();
                let held = backend.leases.held(k, o).unwrap();
                assert_eq!(
                    held.rev,
                    kv.unwrap().mod_revision(),
                    "{k}: the recorded revision is not the key's ({round})"
                );
            }
        }
        let shared = backend.leases.hold(&keys[0], &owners[0]).unwrap().id;
        assert!(backend.leases.is_shared(shared));
        // Behind the holders' backs, one at a time: another value on the same key and lease
        // (its create revision unchanged), then a key released by force and taken by another
        // owner.
        put_behind_the_back(&backend, &keys[0], shared).await;
        let outcomes = backend.renew(&all).await.unwrap();
        assert!(
            matches!(outcomes[0], Ok(ExtendOutcome::NotHeld)),
            "a key overwritten on the shared lease was renewed: {:?}",
            outcomes[0]
        );
        for i in [1, 2] {
            assert!(
                matches!(&outcomes[i], Ok(ExtendOutcome::Extended(g)) if g.token == tokens[i]),
                "an untouched hold lost its renewal with its chunk: {:?}",
                outcomes[i]
            );
        }
        backend.force_release(&keys[1]).await.unwrap();
        let thief = Owner::new("thief");
        assert!(matches!(
            backend.try_acquire(&keys[1], &thief, TTL).await.unwrap(),
            AcquireOutcome::Acquired(_)
        ));
        let outcomes = backend.renew(&all[1..]).await.unwrap();
        assert!(
            matches!(outcomes[0], Ok(ExtendOutcome::NotHeld)),
            "a key taken by another owner was renewed: {:?}",
            outcomes[0]
        );
        assert!(
            matches!(&outcomes[1], Ok(ExtendOutcome::Extended(g)) if g.token == tokens[2]),
            "the untouched hold lost its renewal with its chunk: {:?}",
            outcomes[1]
        );
        assert!(backend.leases.held(&keys[0], &owners[0]).is_none());
        backend.force_release(&keys[0]).await.unwrap();
        backend.release(&keys[1], &thief).await.unwrap();
        backend.release(&keys[2], &owners[2]).await.unwrap();
        backend.shutdown().await;
    }

    /// A key on the shared lease whose release failed would live on with the other holds'
    /// renewals: it is deleted before the shared lease is kept alive again — unless it was
    /// taken since (another value): then it is left alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_whose_release_failed_is_deleted_before_the_shared_lease_is_kept_alive() {
        let backend = backend();
        let (keys, owners, _) = holds(&backend, ["orphan", "kept", "retaken"]).await;
        let all: Vec<Renewal<'_>> = keys
            .iter()
            .zip(&owners)
            .map(|(k, o)| Renewal::new(k, o, TTL))
            .collect();
        let moved = backend.renew(&all).await.unwrap();
        assert!(moved
            .iter()
            .all(|o| matches!(o, Ok(ExtendOutcome::Extended(_)))));
        let shared = backend.leases.hold(&keys[0], &owners[0]).unwrap().id;
        assert!(backend.leases.is_shared(shared));
        // Two releases failed (as a store that did not answer would make them): both keys
        // stay on the shared lease. The third key is then taken by someone else.
        for i in [0, 2] {
            backend
                .leases
                .orphan(shared, backend.etcd_key(&keys[i]), holder_value(&owners[i]));
            backend.leases.take_hold(&keys[i], &owners[i]);
        }
        put_behind_the_back(&backend, &keys[2], shared).await;
        let retaken = backend.etcd_key(&keys[2]);
        // The next batch, for the one hold left, deletes the orphan first.
        let kept = backend
            .renew(&[Renewal::new(&keys[1], &owners[1], TTL)])
            .await
            .unwrap();
        assert!(matches!(kept[0], Ok(ExtendOutcome::Extended(_))));
        let (orphan, _) = backend.get(&backend.etcd_key(&keys[0])).await.unwrap();
        assert!(
            orphan.is_none(),
            "a key whose release failed lived on with the shared lease"
        );
        let (other, _) = backend.get(&retaken).await.unwrap();
        assert_eq!(
            other.map(|kv| kv.value().to_vec()),
            Some(b"someone else".to_vec()),
            "an orphan's key taken since was deleted"
        );
        let (still, _) = backend.get(&backend.etcd_key(&keys[1])).await.unwrap();
        assert!(
            still.is_some(),
            "the renewed hold's key went with the orphan"
        );
        backend.force_release(&keys[2]).await.unwrap();
        backend.release(&keys[1], &owners[1]).await.unwrap();
        backend.shutdown().await;
    }
}
