//! Batched renewals: one keep-alive per shared lease and one transaction per
//! [`MAX_TXN_OPS`] holds (per [`MAX_NESTED_TXNS`] on a hold's first renewal, which moves
//! it), whatever the number of holds.
//!
//! A place is created on a lease of its own. Its first batched renewal with the hold's own
//! TTL (the watchdog's) moves it onto the backend's shared lease for that TTL (a put that
//! keeps the value, guarded by the holder's value and its own lease: a released or
//! re-taken place is never touched); from then on, the shared lease's keep-alive moves its
//! end and a read-only transaction proves each place still this owner's, the same key
//! (create revision), on the shared lease: a compare of each place's mod revision where the
//! revision the last batch saw is known, gets otherwise. A place that holds keeps holding while it
//! is there: the keys before it can only leave. See `leases/shared.rs` for what keeps an
//! unrenewed place from living on.

use std::collections::BTreeMap;
use std::time::Instant;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};
use futures_util::{StreamExt, TryStreamExt};
use lockcore::driver::{ExtendOutcome, Renewal};
use lockcore::LockError;

use crate::backend::EtcdBackend;
use crate::capabilities::CAPABILITIES;
use crate::encoding::{claim_value, held_by};
use crate::leases::{ttl_secs, LeaseState, MAX_NESTED_TXNS, MAX_TXN_OPS};
use crate::places::Place;
use crate::store::{header_revision, token_of};

/// How many of a batch's transactions are in flight at once.
const TXNS_IN_FLIGHT: usize = 4;

type Outcomes = Vec<Option<Result<ExtendOutcome, LockError>>>;

/// A held place of a renewal, as this backend knows it: the renewal's index, the place,
/// and its etcd key.
type Known = (usize, Place, Vec<u8>);

impl EtcdBackend {
    /// Renews `renewals` in one keep-alive per shared lease and one transaction per
    /// [`MAX_TXN_OPS`] places; an outcome per renewal, in order.
    pub(crate) async fn renew_batch(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        let mut out: Outcomes = renewals.iter().map(|_| None).collect();
        let mut by_secs: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for (i, r) in renewals.iter().enumerate() {
            match CAPABILITIES.effective_ttl(r.ttl) {
                Ok(ttl) => by_secs.entry(ttl_secs(ttl)).or_default().push(i),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        for (secs, batch) in by_secs {
            let started = Instant::now();
            let shared = self.leases.shared_lease(secs).await?;
            let mut checks: Vec<Known> = Vec::new();
            let mut moves: Vec<Known> = Vec::new();
            let mut singles = Vec::new();
            for i in batch {
                let r = &renewals[i];
                let Some(place) = self
                    .place(r.key, r.owner.token())
                    .filter(|p| p.held && p.rev > 0)
                else {
                    // Not known to this backend as held: renewed alone, which looks it up.
                    singles.push(i);
                    continue;
                };
                let own = self.place_key(r.key, &place);
                match place.lease {
                    // On the shared lease: a read proves it still is.
                    Some(l) if l.id == shared.id => checks.push((i, place, own)),
                    // On its own lease of this TTL: moved onto the shared one.
                    Some(l) if l.asked_for(secs) => moves.push((i, place, own)),
                    // On a lease of another TTL (an explicit extend asking a TTL other than
                    // the hold's): a move would give it the shared lease's TTL, which may
                    // shorten it. Its own lease is kept alive instead (an etcd lease keeps
                    // the TTL it was granted with).
                    _ => singles.push(i),
                }
            }
            let checks: Vec<_> = checks
                .chunks(MAX_TXN_OPS)
                .map(|chunk| self.check_chunk(chunk))
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
            for ((i, place, _), found) in checked?.into_iter().flatten() {
                let r = &renewals[i];
                out[i] = Some(Ok(match found {
                    Checked::Unchanged => self.on_shared(r, place, None, shared, started),
                    Checked::Read(Some(kv)) => self.on_shared(r, place, Some(kv), shared, started),
                    Checked::Read(None) => ExtendOutcome::NotHeld,
                }));
            }
            for ((i, place, _), answer) in moved?.into_iter().flatten() {
                let r = &renewals[i];
                let old = place.lease;
                let renewed = match answer {
                    Moved::Done(at) => {
                        // Its own lease has no key left: kept for a later acquisition, or
                        // left to expire.
                        if let Some(old) = old {
                            self.leases.put_spare(old);
                        }
                        self.on_shared(r, Place { seen: at, ..place }, None, shared, started)
                    }
                    // Moved by an earlier try whose answer was lost?
                    Moved::Refused(Some(kv)) if kv.lease() == shared.id => {
                        self.on_shared(r, place, Some(kv), shared, started)
                    }
                    // Ours under another label (the value compared differs): renewed alone,
                    // on its own lease.
                    Moved::Refused(Some(kv))
                        if held_by(kv.value(), r.owner.token())
                            && old.is_some_and(|l| l.id == kv.lease()) =>
                    {
                        singles.push(i);
                        continue;
                    }
                    Moved::Refused(_) => ExtendOutcome::NotHeld,
                };
                out[i] = Some(Ok(renewed));
            }
            let alone = singles
                .iter()
                .map(|&i| self.extend_place(renewals[i].key, renewals[i].owner));
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

    /// The renewal of a place on `shared`: extended if `kv` (the place as read; `None`:
    /// just moved by this batch, or proven unchanged) is the same key, this owner's, on
    /// `shared`; the revision it was seen at is kept for the next batch's compare.
    fn on_shared(
        &self,
        r: &Renewal<'_>,
        place: Place,
        kv: Option<KeyValue>,
        shared: LeaseState,
        started: Instant,
    ) -> ExtendOutcome {
        let same = kv.as_ref().is_none_or(|kv| {
            held_by(kv.value(), r.owner.token())
                && kv.lease() == shared.id
                && kv.create_revision() == place.rev
        });
        if !same {
            return ExtendOutcome::NotHeld;
        }
        let token = kv.as_ref().map_or_else(|| place.token(), token_of);
        let seen = kv.as_ref().map_or(place.seen, KeyValue::mod_revision);
        self.places().set(
            r.key,
            Place {
                lease: Some(shared),
                seen,
                ..place
            },
        );
        ExtendOutcome::Extended(shared.grant(token, started))
    }

    /// Proves the places of `chunk` still this backend's holds: where every place's mod
    /// revision is known, one transaction of compares proves them unchanged and nothing is
    /// read (a missing key's mod revision compares as 0, hence only known revisions); if a
    /// compare fails, or a revision is unknown, every place of the chunk is read and judged
    /// on its own.
    async fn check_chunk(&self, chunk: &[Known]) -> Result<Vec<(Known, Checked)>, LockError> {
        if chunk.iter().all(|(_, place, _)| place.seen > 0) {
            let unchanged = chunk.iter().map(|(_, place, own)| {
                Compare::mod_revision(own.clone(), CompareOp::Equal, place.seen)
            });
            let txn = Txn::new().when(unchanged.collect::<Vec<_>>());
            if self.txn("renew", txn).await?.succeeded() {
                return Ok(chunk
                    .iter()
                    .map(|k| (k.clone(), Checked::Unchanged))
                    .collect());
            }
        }
        let gets = chunk
            .iter()
            .map(|(_, _, own)| TxnOp::get(own.clone(), None));
        let resp = self
            .txn("renew", Txn::new().and_then(gets.collect::<Vec<_>>()))
            .await?;
        let mut found = resp.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
            _ => None,
        });
        Ok(chunk
            .iter()
            .map(|k| (k.clone(), Checked::Read(found.next().flatten())))
            .collect())
    }

    /// Moves the places of `chunk` onto `shared` in one transaction of guarded puts.
    async fn move_chunk(
        &self,
        renewals: &[Renewal<'_>],
        chunk: &[Known],
        shared: LeaseState,
    ) -> Result<Vec<(Known, Moved)>, LockError> {
        let puts = chunk.iter().map(|(i, place, own)| {
            let old = place.lease.map_or(0, |l| l.id);
            let value = claim_value(renewals[*i].owner, &place.claim);
            TxnOp::txn(
                Txn::new()
                    .when([
                        Compare::value(own.clone(), CompareOp::Equal, value),
                        Compare::lease(own.clone(), CompareOp::Equal, old),
                    ])
                    .and_then([TxnOp::put(
                        own.clone(),
                        Vec::new(),
                        Some(PutOptions::new().with_lease(shared.id).with_ignore_value()),
                    )])
                    .or_else([TxnOp::get(own.clone(), None)]),
            )
        });
        let resp = self
            .txn("renew", Txn::new().and_then(puts.collect::<Vec<_>>()))
            .await?;
        // Every put of one transaction leaves its key at the transaction's revision.
        let at = header_revision(&resp);
        let mut answers = resp.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Txn(t) if t.succeeded() => Moved::Done(at),
            TxnOpResponse::Txn(t) => {
                Moved::Refused(t.op_responses().into_iter().find_map(|r| match r {
                    TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
                    _ => None,
                }))
            }
            _ => Moved::Refused(None),
        });
        Ok(chunk
            .iter()
            .map(|k| (k.clone(), answers.next().unwrap_or(Moved::Refused(None))))
            .collect())
    }
}

/// What a check found of one place.
enum Checked {
    /// Unchanged since a batch last saw it this owner's on the shared lease.
    Unchanged,
    /// The place as it is, if any.
    Read(Option<KeyValue>),
}

/// The answer to one guarded move.
enum Moved {
    /// Moved, at this mod revision.
    Done(i64),
    /// Not moved; the place as it is, if any.
    Refused(Option<KeyValue>),
}

#[cfg(test)]
mod tests {
    //! Against the etcd of `DISTLOCK_TEST_ETCD_URL` (`scripts/test.sh` starts one): what a
    //! changed place and a failed release do to the shared lease.

    use std::time::Duration;

    use lockcore::driver::{AcquireOutcome, LockBackendExt};
    use lockcore::{FencingToken, LockBackend, LockKey, Owner};

    use super::*;
    use crate::encoding::holder_value;
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
            match LockBackendExt::try_acquire(backend, k, o, TTL)
                .await
                .unwrap()
            {
                AcquireOutcome::Acquired(g) => tokens.push(g.token),
                other => panic!("{k}: {other:?}"),
            }
        }
        (keys, owners, tokens)
    }

    /// The etcd key of `owner`'s place in `key`'s queue.
    fn own_key(backend: &EtcdBackend, key: &LockKey, owner: &Owner) -> Vec<u8> {
        let place = backend.place(key, owner.token()).unwrap();
        backend.place_key(key, &place)
    }

    /// Writes "someone else" into `key`, on the lease `lease`, behind the backend's back.
    async fn put_behind_the_back(backend: &EtcdBackend, key: Vec<u8>, lease: i64) {
        backend
            .endpoints
            .call("put", |mut c| {
                let k = key.clone();
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

    /// A place on the shared lease is proven by a read of it: a place changed since
    /// (another value on the same lease and create revision, or deleted and taken by
    /// another owner) answers `NotHeld`, alone in its chunk.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_place_changed_behind_a_renewed_hold_answers_not_held_alone() {
        let backend = backend();
        let (keys, owners, tokens) = holds(&backend, ["overwritten", "retaken", "untouched"]).await;
        let all: Vec<Renewal<'_>> = keys
            .iter()
            .zip(&owners)
            .map(|(k, o)| Renewal::new(k, o, TTL))
            .collect();
        let mut shared = 0;
        for round in ["moves", "checks"] {
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
                let (kv, _) = backend.get(&own_key(&backend, k, o)).await.unwrap();
                let lease = kv.unwrap().lease();
                assert!(backend.leases.is_shared(lease), "{k}: not moved ({round})");
                shared = lease;
            }
        }
        // Behind the holders' backs, one at a time: another value on the same place and
        // lease (its create revision unchanged), then a lock released by force and taken
        // by another owner.
        put_behind_the_back(&backend, own_key(&backend, &keys[0], &owners[0]), shared).await;
        let outcomes = backend.renew(&all).await.unwrap();
        assert!(
            matches!(outcomes[0], Ok(ExtendOutcome::NotHeld)),
            "a place overwritten on the shared lease was renewed: {:?}",
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
        let (left, _) = backend
            .get(&own_key(&backend, &keys[2], &owners[2]))
            .await
            .unwrap();
        assert!(
            left.is_some(),
            "breaking one hold on the shared lease took the others with it"
        );
        let thief = Owner::new("thief");
        assert!(matches!(
            LockBackendExt::try_acquire(&*backend, &keys[1], &thief, TTL)
                .await
                .unwrap(),
            AcquireOutcome::Acquired(_)
        ));
        let outcomes = backend.renew(&all[1..]).await.unwrap();
        assert!(
            matches!(outcomes[0], Ok(ExtendOutcome::NotHeld)),
            "a lock taken by another owner was renewed: {:?}",
            outcomes[0]
        );
        assert!(
            matches!(&outcomes[1], Ok(ExtendOutcome::Extended(g)) if g.token == tokens[2]),
            "the untouched hold lost its renewal with its chunk: {:?}",
            outcomes[1]
        );
        backend.force_release(&keys[0]).await.unwrap();
        backend.release(&keys[1], &thief).await.unwrap();
        backend.release(&keys[2], &owners[2]).await.unwrap();
        backend.shutdown().await;
    }

    /// A place on the shared lease whose release failed would live on with the other
    /// holds' renewals: it is deleted before the shared lease is kept alive again —
    /// unless it was taken since (another value): then it is left alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_place_whose_release_failed_is_deleted_before_the_shared_lease_is_kept_alive() {
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
        let places: Vec<Vec<u8>> = keys
            .iter()
            .zip(&owners)
            .map(|(k, o)| own_key(&backend, k, o))
            .collect();
        let shared = backend
            .place(&keys[0], owners[0].token())
            .unwrap()
            .lease
            .unwrap()
            .id;
        assert!(backend.leases.is_shared(shared));
        // Two releases failed (as a store that did not answer would make them): both
        // places stay on the shared lease. The third place is then written by someone else.
        for i in [0, 2] {
            backend
                .leases
                .orphan(shared, places[i].clone(), holder_value(&owners[i]));
            backend.places().take(&keys[i], owners[i].token());
        }
        put_behind_the_back(&backend, places[2].clone(), shared).await;
        // The next batch, for the one hold left, deletes the orphan first.
        let kept = backend
            .renew(&[Renewal::new(&keys[1], &owners[1], TTL)])
            .await
            .unwrap();
        assert!(matches!(kept[0], Ok(ExtendOutcome::Extended(_))));
        let (orphan, _) = backend.get(&places[0]).await.unwrap();
        assert!(
            orphan.is_none(),
            "a place whose release failed lived on with the shared lease"
        );
        let (other, _) = backend.get(&places[2]).await.unwrap();
        assert_eq!(
            other.map(|kv| kv.value().to_vec()),
            Some(b"someone else".to_vec()),
            "an orphan's place written since was deleted"
        );
        let (still, _) = backend.get(&places[1]).await.unwrap();
        assert!(
            still.is_some(),
            "the renewed hold's place went with the orphan"
        );
        backend.force_release(&keys[2]).await.unwrap();
        backend.release(&keys[1], &owners[1]).await.unwrap();
        backend.shutdown().await;
    }

    /// The shared lease carries every renewed hold of its TTL: a released hold's place
    /// leaves it, but the lease never becomes a spare (spares are revoked at shutdown and
    /// given to new places), so the other holds keep it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_shared_lease_outlives_a_release_and_the_backends_spares() {
        let backend = backend();
        let (keys, owners, _) = holds(&backend, ["released", "kept", "other"]).await;
        let all: Vec<Renewal<'_>> = keys
            .iter()
            .zip(&owners)
            .map(|(k, o)| Renewal::new(k, o, TTL))
            .collect();
        let moved = backend.renew(&all).await.unwrap();
        assert!(moved
            .iter()
            .all(|o| matches!(o, Ok(ExtendOutcome::Extended(_)))));
        let kept = own_key(&backend, &keys[1], &owners[1]);
        backend.release(&keys[0], &owners[0]).await.unwrap();
        backend.shutdown().await;
        let (still, _) = backend.get(&kept).await.unwrap();
        assert!(
            still.is_some(),
            "a hold on the shared lease went with a released hold's spares"
        );
        let lease = still.unwrap().lease();
        let mut raw = etcd_client::Client::connect(backend.config().endpoints.clone(), None)
            .await
            .unwrap();
        raw.lease_revoke(lease).await.unwrap();
    }
}
