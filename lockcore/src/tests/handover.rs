//! Hand-overs: a released permit or read lease goes to the client's next waiting request in
//! the release's own request to the store; what the store refuses, what a failure or a
//! waiter gone midway leaves.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::memory::MemoryBackend;
use crate::*;

const BOUND: Duration = Duration::from_secs(10);

/// The memory store, counting what reaches it, with a hand-over that can be held back or
/// made to fail after it was applied.
#[derive(Debug, Default)]
struct Handing {
    inner: Arc<MemoryBackend>,
    /// Declares [`Capabilities::hand_over`].
    hand_over: bool,
    claims: AtomicUsize,
    hand_overs: AtomicUsize,
    releases: AtomicUsize,
    /// A request is waiting for a release.
    waiting: Notify,
    /// Each hand-over, once applied, waits for `go` before answering.
    hold_back: AtomicBool,
    applied: Notify,
    go: Notify,
    /// Each hand-over is applied, then answered with an error (its answer lost).
    fail: AtomicBool,
}

fn handing(hand_over: bool) -> Arc<Handing> {
    Arc::new(Handing {
        inner: MemoryBackend::new(),
        hand_over,
        ..Default::default()
    })
}

#[async_trait::async_trait]
impl LockBackend for Handing {
    fn name(&self) -> &'static str {
        "handing"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().with_hand_over(self.hand_over)
    }
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        self.inner.try_acquire(key, owner, ttl).await
    }
    async fn try_claim(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
        claim: Claim,
    ) -> Result<AcquireOutcome, LockError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.try_claim(key, owner, ttl, claim).await
    }
    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.inner.release(key, owner).await
    }
    async fn release_and_claim(
        &self,
        key: &LockKey,
        owner: &Owner,
        next: &Owner,
        ttl: Duration,
        claim: Claim,
    ) -> Result<(ReleaseOutcome, Result<AcquireOutcome, LockError>), LockError> {
        self.hand_overs.fetch_add(1, Ordering::SeqCst);
        let answer = self
            .inner
            .release_and_claim(key, owner, next, ttl, claim)
            .await;
        if self.hold_back.load(Ordering::SeqCst) {
            self.applied.notify_one();
            self.go.notified().await;
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(LockError::unavailable("handing", "the answer was lost"));
        }
        answer
    }
    async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        self.inner.extend(key, owner, ttl).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.inner.inspect(key).await
    }
    async fn inspect_all(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        self.inner.inspect_all(key).await
    }
    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        max: Duration,
    ) -> Result<(), LockError> {
        self.waiting.notify_one();
        self.inner.wait_released(key, hint, max).await
    }
    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.inner.force_release(key).await
    }
    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.inner.abandon(key, owner).await
    }
    fn wake_next(&self, key: &LockKey) {
        self.inner.wake_next(key);
    }
}

/// A semaphore of `permits`: one held by `client`, and a second request of the client for
/// one, waiting for the store.
async fn held_and_waiting(
    store: &Arc<Handing>,
    client: &LockClient,
    permits: u32,
) -> (
    LockGuard,
    tokio::task::JoinHandle<Result<LockGuard, LockError>>,
) {
    let ttl = Duration::from_secs(30);
    let held = client
        .semaphore("k", permits)
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    let waiting = store.waiting.notified();
    let waiter = {
        let c = client.clone();
        tokio::spawn(async move {
            c.semaphore("k", permits)
                .ttl(ttl)
                .wait(BOUND)
                .acquire()
                .await
        })
    };
    tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the second request never waited for the store");
    (held, waiter)
}

/// The release hands the permit over in its own request: the waiter claims once (refused),
/// never again, and holds with a later token.
#[tokio::test]
async fn a_released_permit_goes_to_the_clients_next_waiter_in_the_release() {
    for hand_over in [true, false] {
        let store = handing(hand_over);
        let client = LockClient::new(store.clone());
        let (held, waiter) = held_and_waiting(&store, &client, 1).await;
        let first = held.token();
        assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
        let next = tokio::time::timeout(BOUND, waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(next.token() > first);
        assert!(next.valid_until() > std::time::Instant::now() + Duration::from_secs(20));
        let (claims, hand_overs) = (
            store.claims.load(Ordering::SeqCst),
            store.hand_overs.load(Ordering::SeqCst),
        );
        if hand_over {
            // The holder's claim, the waiter's refused one; the grant came in the release.
            assert_eq!((claims, hand_overs), (2, 1));
            assert_eq!(store.releases.load(Ordering::SeqCst), 0);
        } else {
            assert_eq!((claims, hand_overs), (3, 0));
        }
        assert_eq!(client.inspect_all("k").await.unwrap().len(), 1);
        next.release().await.unwrap();
        assert!(client.inspect_all("k").await.unwrap().is_empty());
    }
}

/// The store decides a hand-over's claim as any other: behind another process's
/// reservation the waiter is refused and keeps waiting, and is served in its turn.
#[tokio::test]
async fn a_hand_over_the_store_refuses_leaves_the_waiter_waiting() {
    let store = handing(true);
    let (ours, theirs) = (
        LockClient::new(store.clone()),
        LockClient::new(store.clone()),
    );
    let ttl = Duration::from_secs(30);
    let held = ours.semaphore("k", 2).ttl(ttl).acquire().await.unwrap();
    // The other permit goes to another client, whose heavier claim then waits with a
    // reservation that later lighter claims respect.
    let other = theirs.semaphore("k", 2).ttl(ttl).acquire().await.unwrap();
    let reserved = store.waiting.notified();
    let heavy = {
        let c = theirs.clone();
        tokio::spawn(async move {
            c.semaphore("k", 2)
                .permits(2)
                .ttl(ttl)
                .wait(BOUND)
                .acquire()
                .await
        })
    };
    tokio::time::timeout(BOUND, reserved).await.unwrap();
    let waiting = store.waiting.notified();
    let waiter = {
        let c = ours.clone();
        tokio::spawn(async move { c.semaphore("k", 2).ttl(ttl).wait(BOUND).acquire().await })
    };
    tokio::time::timeout(BOUND, waiting).await.unwrap();
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(store.hand_overs.load(Ordering::SeqCst), 1);
    let holders = ours.inspect_all("k").await.unwrap();
    assert_eq!(
        holders.iter().map(|i| i.token).collect::<Vec<_>>(),
        [other.token()]
    );
    assert!(
        !waiter.is_finished(),
        "the hand-over passed another's reservation"
    );
    other.release().await.unwrap();
    let heavy = tokio::time::timeout(BOUND, heavy)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!waiter.is_finished());
    let heavy_token = heavy.token();
    heavy.release().await.unwrap();
    let next = tokio::time::timeout(BOUND, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(next.token() > heavy_token);
    next.release().await.unwrap();
}

/// A waiter that goes away while the release hands it the permit leaves nothing held: its
/// clean-up awaits the hand-over's answer and releases the grant.
#[tokio::test]
async fn a_waiter_gone_during_its_hand_over_leaves_nothing_held() {
    let store = handing(true);
    let client = LockClient::new(store.clone());
    let (held, waiter) = held_and_waiting(&store, &client, 1).await;
    store.hold_back.store(true, Ordering::SeqCst);
    let applied = store.applied.notified();
    let release = tokio::spawn(held.release());
    tokio::time::timeout(BOUND, applied).await.unwrap();
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    // Granted in the store, its requester gone.
    assert_eq!(client.inspect_all("k").await.unwrap().len(), 1);
    store.go.notify_one();
    assert_eq!(release.await.unwrap().unwrap(), ReleaseOutcome::Released);
    assert!(tokio::time::timeout(BOUND, client.shutdown())
        .await
        .unwrap());
    assert!(client.inspect_all("k").await.unwrap().is_empty());
}

/// A hand-over whose answer is lost: the holder releases again by owner, the waiter claims
/// again and is answered the same grant, and the key keeps one holder.
#[tokio::test]
async fn a_hand_over_without_an_answer_is_settled_by_owner() {
    let store = handing(true);
    let client = LockClient::new(store.clone());
    let (held, waiter) = held_and_waiting(&store, &client, 1).await;
    store.fail.store(true, Ordering::SeqCst);
    held.release().await.unwrap();
    assert_eq!(store.releases.load(Ordering::SeqCst), 1);
    let next = tokio::time::timeout(BOUND, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let holders = client.inspect_all("k").await.unwrap();
    assert_eq!(
        holders.iter().map(|i| i.token).collect::<Vec<_>>(),
        [next.token()]
    );
    // Its refused claim, then the claim again after the lost answer.
    assert_eq!(store.claims.load(Ordering::SeqCst), 3);
    next.release().await.unwrap();
    assert!(client.inspect_all("k").await.unwrap().is_empty());
}
