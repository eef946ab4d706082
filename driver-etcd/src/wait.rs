//! Waiting in a lock's queue until the keys before our place have left room for it (for an
//! exclusive place: until every key before it is gone), keeping our own lease (and so our
//! place) alive meanwhile.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use lockcore::driver::{OwnerToken, WaitHint};
use lockcore::{LockError, LockKey};

use crate::backend::EtcdBackend;
use crate::leases::LeaseState;
use crate::places::{Blockers, Place};
use crate::store::queue_range;

/// How often a waiter's lease is refreshed, as a fraction of its TTL (lockcore's watchdog
/// renews holders at the same rate).
const REFRESH_FRACTION: u32 = 3;

/// The pause before a failed refresh of a waiter's lease is tried again.
const REFRESH_RETRY: Duration = Duration::from_millis(100);

impl EtcdBackend {
    /// Waits until our place may hold (see the module docs), keeping our own lease alive
    /// meanwhile.
    pub(crate) async fn wait_for_turn(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let deadline = tokio::time::Instant::now() + max_wait;
        let place = hint
            .revision()
            .and_then(|rev| self.places().by_rev(key, rev).cloned())
            .filter(|p| !p.held);
        match place.and_then(|p| p.blockers.clone().map(|b| (p, b))) {
            Some((place, blockers)) => self.wait_for_room(key, &place, &blockers, deadline).await,
            // No place of ours at that revision: a refused set's, which left none (`sets`).
            // (A waiting place of ours created at that very revision is taken for the
            // hint's: that wait ends when the place holds, and the set's next refusal names
            // a later revision.)
            None if hint
                .revision()
                .is_some_and(|rev| self.places().by_rev(key, rev).is_none()) =>
            {
                let from = hint.revision().unwrap_or(0);
                self.wait_for_deletion(key, from, deadline).await
            }
            None => {
                // A place of ours that holds, or does not wait: nothing to watch. Come
                // back soon rather than sleep through a release.
                let soon = tokio::time::Instant::now() + Duration::from_millis(50);
                tokio::time::sleep_until(deadline.min(soon)).await;
                Ok(())
            }
        }
    }

    /// Waits, on a watch of the queue's deletions, until the keys before a place have left
    /// room for it (or the place itself is gone).
    pub(crate) async fn wait_for_room(
        &self,
        key: &LockKey,
        place: &Place,
        blockers: &Blockers,
        deadline: tokio::time::Instant,
    ) -> Result<(), LockError> {
        let prefix = self.etcd_key(key);
        let own = self.place_key(key, place);
        let mut before: HashMap<Vec<u8>, u64> = blockers.keys.iter().cloned().collect();
        // No watch before the deadline, or the store cancelled it at once: look again.
        let listening = tokio::time::timeout_at(deadline, self.queue_watches.subscribe(&prefix));
        let (mut waiter, from) = match listening.await.unwrap_or(Ok(None))? {
            None => return Ok(()),
            Some(waiter) if waiter.delivered > blockers.seen => {
                // Deletions passed on before we listened: the keys that left are missing
                // from a new read (a name seen twice is removed once: a set), which also
                // shows whether our place is still there.
                let (still, present, at) = self.keys_up_to(&prefix, place.rev, &own).await?;
                if !present {
                    // Gone (lease expired or revoked): the next attempt queues again.
                    return Ok(());
                }
                before.retain(|k, _| still.contains(k));
                (waiter, at)
            }
            Some(waiter) => (waiter, blockers.seen),
        };
        // From here our place is known to be there at the watch's first revision, and the
        // watch reports its deletion as it reports the others'.
        let fits = |before: &HashMap<Vec<u8>, u64>| {
            let used = before.values().fold(0u64, |s, w| s.saturating_add(*w));
            place.claim.fits(used, 0)
        };
        if fits(&before) {
            self.places().room_made(key, &place.owner, place.rev);
            return Ok(());
        }
        let Some(lease) = place.lease else {
            return Ok(());
        };
        let refresh = self.keep_place_alive(key, &place.owner, place.rev, lease);
        tokio::pin!(refresh);
        loop {
            tokio::select! {
                biased;
                deleted = waiter.deleted_after(from) => match deleted {
                    Some(deleted) => {
                        if deleted.contains(&own) {
                            // Our place is gone (lease expired or revoked): the next
                            // attempt queues again.
                            return Ok(());
                        }
                        for k in deleted {
                            before.remove(&k);
                        }
                        if fits(&before) {
                            // Every deletion up to this one reported, ours not among them:
                            // at this revision our place was there and held.
                            self.places().room_made(key, &place.owner, place.rev);
                            return Ok(());
                        }
                    }
                    None => return Ok(()),
                },
                _ = &mut refresh => return Ok(()),
                _ = tokio::time::sleep_until(deadline) => return Ok(()),
            }
        }
    }

    /// Waits, with no place of ours in `key`'s queue (a refused set), for a deletion in the
    /// queue after revision `from`, when the set's claim was refused: a release that may
    /// have made room. A wake-up may be spurious; the caller claims again.
    pub(crate) async fn wait_for_deletion(
        &self,
        key: &LockKey,
        from: i64,
        deadline: tokio::time::Instant,
    ) -> Result<(), LockError> {
        let prefix = self.etcd_key(key);
        let listening = tokio::time::timeout_at(deadline, self.queue_watches.subscribe(&prefix));
        let Some(mut waiter) = listening.await.unwrap_or(Ok(None))? else {
            return Ok(());
        };
        let mut from = from;
        if waiter.delivered > from {
            // Deletions between `from` and the watch's start were not passed on: the queue
            // as it was at `from` and as it is now tell whether one of its keys went.
            let keys = || queue_range().with_keys_only();
            let (then, now) = tokio::join!(
                self.range(&prefix, keys().with_revision(from)),
                self.range(&prefix, keys())
            );
            let (Ok(then), now) = (then, now?) else {
                // `from` compacted away: claim again.
                return Ok(());
            };
            let here: HashSet<(&[u8], i64)> = now
                .kvs()
                .iter()
                .map(|kv| (kv.key(), kv.create_revision()))
                .collect();
            if then
                .kvs()
                .iter()
                .any(|kv| !here.contains(&(kv.key(), kv.create_revision())))
            {
                return Ok(());
            }
            from = now.header().map_or(from, |h| h.revision());
        }
        tokio::select! {
            _ = waiter.deleted_after(from) => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
        Ok(())
    }

    /// The names of the keys of the queue at `prefix` created before revision `rev`,
    /// whether the place `own` created at `rev` is still there, and the revision of the
    /// read.
    pub(crate) async fn keys_up_to(
        &self,
        prefix: &[u8],
        rev: i64,
        own: &[u8],
    ) -> Result<(HashSet<Vec<u8>>, bool, i64), LockError> {
        let opts = queue_range().with_max_create_revision(rev).with_keys_only();
        let r = self.range(prefix, opts).await?;
        let at = r.header().map_or(0, |h| h.revision());
        let present = r
            .kvs()
            .iter()
            .any(|kv| kv.key() == own && kv.create_revision() == rev);
        let before = r
            .kvs()
            .iter()
            .filter(|kv| kv.create_revision() < rev)
            .map(|kv| kv.key().to_vec())
            .collect();
        Ok((before, present, at))
    }

    /// Keeps the lease of a waiting place alive (every TTL/3): its place must outlive the
    /// wait. Ends when the lease is gone (revoked, expired), and our key with it.
    pub(crate) async fn keep_place_alive(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        rev: i64,
        mut lease: LeaseState,
    ) {
        loop {
            let at = lease.refreshed + lease.ttl() / REFRESH_FRACTION;
            tokio::time::sleep_until(at.into()).await;
            let started = Instant::now();
            match self.leases.keep_alive(lease.id).await {
                Ok(true) => {
                    lease.refreshed = started;
                    self.places().refreshed(key, owner, rev, lease.id, started);
                }
                // Gone: so is our key. The next attempt queues again.
                Ok(false) => return,
                Err(e) => {
                    tracing::debug!(key = %key, error = %lockcore::ErrorChain(&e), "etcd: cannot refresh a waiter's lease");
                    tokio::time::sleep(REFRESH_RETRY).await;
                }
            }
        }
    }
}
