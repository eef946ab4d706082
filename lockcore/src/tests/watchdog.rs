//! The watchdog: many holds, lost runtimes.

use std::time::{Duration, Instant};

use crate::memory::MemoryBackend;
use crate::LockClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_schedule_keeps_many_holds_of_different_ttls() {
    let store = MemoryBackend::new();
    let client = LockClient::new(store.clone());
    let mut guards = Vec::new();
    for i in 0..60u64 {
        let ttl = Duration::from_millis(300 + 5 * i);
        guards.push(
            client
                .lock(format!("k{i}"))
                .ttl(ttl)
                .acquire()
                .await
                .unwrap(),
        );
    }
    // Three of the longest TTLs: without renewals every one of them would have expired.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert_eq!(store.held_count(), 60);
    assert!(guards.iter().all(|g| !g.is_lost()));
    assert!(guards.iter().all(|g| g.valid_until() > Instant::now()));
    for g in guards {
        assert_eq!(g.release().await.unwrap(), crate::ReleaseOutcome::Released);
    }
    assert_eq!(store.held_count(), 0);
}

#[test]
fn lost_fires_even_when_the_acquiring_runtime_is_gone() {
    let store = MemoryBackend::new();
    let first = tokio::runtime::Runtime::new().unwrap();
    let guard = first.block_on(async {
        let client = LockClient::new(store.clone());
        client
            .lock("k")
            .ttl(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap()
    });
    // No runtime is left to renew the lease: the hold must be reported lost before it
    // ends, not silently expire.
    drop(first);
    let second = tokio::runtime::Runtime::new().unwrap();
    let started = Instant::now();
    second.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("lost() never fired");
    });
    assert!(started.elapsed() < Duration::from_millis(600));
    drop(guard);
}

/// A store whose next renewal never answers (its answer lost on the way) and whose later
/// renewals do; with `short_answers`, renewals answer a validity of only 50 ms (as a
/// backend may when its round took long), the store keeping the longer expiry.
#[derive(Debug)]
struct OneRenewalHangs {
    inner: std::sync::Arc<MemoryBackend>,
    hang_next: std::sync::atomic::AtomicBool,
    short_answers: bool,
    /// Grants answer a validity of only 50 ms.
    short_grants: bool,
    /// How long each renewal's answer takes to come back, once the store has applied it.
    answer_delay: Duration,
}

#[async_trait::async_trait]
impl crate::LockBackend for OneRenewalHangs {
    fn name(&self) -> &'static str {
        "one-renewal-hangs"
    }
    fn capabilities(&self) -> crate::Capabilities {
        self.inner.capabilities()
    }
    async fn claim(
        &self,
        request: &crate::ClaimRequest<'_>,
    ) -> Result<crate::AcquireOutcome, crate::LockError> {
        match self.inner.claim(request).await? {
            crate::AcquireOutcome::Acquired(grant) if self.short_grants => {
                Ok(crate::AcquireOutcome::Acquired(grant.with_valid_until(
                    Instant::now() + Duration::from_millis(50),
                )))
            }
            other => Ok(other),
        }
    }
    async fn release(
        &self,
        key: &crate::LockKey,
        owner: &crate::Owner,
    ) -> Result<crate::ReleaseOutcome, crate::LockError> {
        self.inner.release(key, owner).await
    }
    async fn renew(
        &self,
        renewals: &[crate::Renewal<'_>],
    ) -> Result<Vec<Result<crate::ExtendOutcome, crate::LockError>>, crate::LockError> {
        crate::driver::renew_each(renewals, |r| self.renew_one(r.key, r.owner, r.ttl)).await
    }
    async fn holders(
        &self,
        key: &crate::LockKey,
    ) -> Result<Vec<crate::LockInfo>, crate::LockError> {
        self.inner.holders(key).await
    }
    async fn wait_released(
        &self,
        key: &crate::LockKey,
        hint: &crate::WaitHint,
        place: u64,
        max: Duration,
    ) -> Result<(), crate::LockError> {
        self.inner.wait_released(key, hint, place, max).await
    }
    async fn force_release(
        &self,
        key: &crate::LockKey,
    ) -> Result<crate::ReleaseOutcome, crate::LockError> {
        self.inner.force_release(key).await
    }
}

impl OneRenewalHangs {
    /// The renewal of one lease: the first one sent hangs if told to.
    async fn renew_one(
        &self,
        key: &crate::LockKey,
        owner: &crate::Owner,
        ttl: Duration,
    ) -> Result<crate::ExtendOutcome, crate::LockError> {
        use crate::driver::LockBackendExt;
        if self
            .hang_next
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            std::future::pending::<()>().await;
        }
        let outcome = self.inner.extend(key, owner, ttl).await;
        tokio::time::sleep(self.answer_delay).await;
        match outcome? {
            crate::ExtendOutcome::Extended(grant) if self.short_answers => {
                Ok(crate::ExtendOutcome::Extended(grant.with_valid_until(
                    Instant::now() + Duration::from_millis(50),
                )))
            }
            other => Ok(other),
        }
    }
}

/// A renewal whose answer never comes is given up after its attempt timeout (under a
/// third of the TTL) and retried in time: one lost answer does not lose the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_never_answers_is_retried_in_time() {
    let store = std::sync::Arc::new(OneRenewalHangs {
        inner: MemoryBackend::new(),
        hang_next: std::sync::atomic::AtomicBool::new(true),
        short_answers: false,
        short_grants: false,
        answer_delay: Duration::ZERO,
    });
    let client = LockClient::new(store.clone());
    let ttl = Duration::from_millis(1200);
    let guard = client.lock("k").ttl(ttl).acquire().await.unwrap();
    tokio::time::sleep(ttl * 3).await;
    assert!(
        !store.hang_next.load(std::sync::atomic::Ordering::SeqCst),
        "no renewal was sent"
    );
    assert!(
        !guard.is_lost(),
        "one renewal that never answered lost the lock"
    );
    assert_eq!(
        guard.release().await.unwrap(),
        crate::ReleaseOutcome::Released
    );
}

/// While renewals keep failing, `lost()` fires a margin (5% of the TTL) before the lease's
/// end, not at the end itself: the holder gets time to stop before another may take over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_a_margin_before_the_lease_ends() {
    let store = crate::tests::faulty::Faulty::new();
    let client = LockClient::new(store.clone());
    let ttl = Duration::from_secs(4);
    let guard = client.lock("k").ttl(ttl).acquire().await.unwrap();
    store
        .extend_fails
        .store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("lost() never fired");
    let fired = Instant::now();
    let end = guard.valid_until();
    // The margin is 200 ms; half of it is left for a late timer.
    assert!(
        fired + ttl / 40 <= end,
        "lost() fired {:?} before the lease's end",
        end.saturating_duration_since(fired)
    );
    drop(guard);
}

/// A renewal's lease is dated from when it was sent, not from when its answer came back:
/// with answers 250 ms late, the holder never believes its lease ends later than the
/// store's (it would by 250 ms, dated from the answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_is_dated_from_when_it_was_sent() {
    use crate::driver::LockBackendExt;
    let inner = MemoryBackend::new();
    let store = std::sync::Arc::new(OneRenewalHangs {
        inner: inner.clone(),
        hang_next: std::sync::atomic::AtomicBool::new(false),
        short_answers: false,
        short_grants: false,
        answer_delay: Duration::from_millis(250),
    });
    let client = LockClient::new(store);
    // A renewal is given a quarter of the TTL (375 ms): the late answer still counts.
    let ttl = Duration::from_millis(1500);
    let guard = client.lock("k").ttl(ttl).acquire().await.unwrap();
    let key = crate::LockKey::new("k").unwrap();
    for _ in 0..2 {
        let before = guard.valid_until();
        let limit = Instant::now() + ttl;
        while guard.valid_until() <= before {
            assert!(Instant::now() < limit, "no renewal was answered");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let believed = guard.valid_until();
        let asked = Instant::now();
        let remaining = inner
            .inspect(&key)
            .await
            .unwrap()
            .and_then(|info| info.remaining_ttl)
            .unwrap();
        let store_end = asked + remaining;
        assert!(
            believed <= store_end + Duration::from_millis(40),
            "the holder believes its lease ends {:?} after the store's",
            believed.saturating_duration_since(store_end)
        );
    }
    guard.release().await.unwrap();
}

/// An extension whose answer promises less than the lease already has (the store kept the
/// longer expiry; a backend's round took long) never moves `valid_until` back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_never_moves_valid_until_back() {
    let store = std::sync::Arc::new(OneRenewalHangs {
        inner: MemoryBackend::new(),
        hang_next: std::sync::atomic::AtomicBool::new(false),
        short_answers: true,
        short_grants: false,
        answer_delay: Duration::ZERO,
    });
    let client = LockClient::new(store);
    let guard = client
        .lock("k")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let before = guard.valid_until();
    guard.extend().await.unwrap();
    assert!(
        guard.valid_until() >= before,
        "valid_until moved back by {:?}",
        before.saturating_duration_since(guard.valid_until())
    );
    guard.release().await.unwrap();
}

/// A validity the backend computed itself (Redlock: `ttl − elapsed − drift`) caps the
/// lease when it ends before the client's own estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_s_own_validity_caps_valid_until() {
    let store = std::sync::Arc::new(OneRenewalHangs {
        inner: MemoryBackend::new(),
        hang_next: std::sync::atomic::AtomicBool::new(false),
        short_answers: false,
        short_grants: true,
        answer_delay: Duration::ZERO,
    });
    let client = LockClient::new(store);
    let guard = client
        .lock("k")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    assert!(
        guard.valid_until() <= Instant::now() + Duration::from_millis(50),
        "the lease ends {:?} from now, past the backend's own validity",
        guard
            .valid_until()
            .saturating_duration_since(Instant::now())
    );
    drop(guard);
}

/// A loss reported once the release has begun (a renewal answering `NotHeld` because the
/// release got there first, or the deadline passing just then) never fires `lost()`.
#[tokio::test]
async fn no_loss_is_reported_after_the_release_began() {
    let hold = watched_hold();
    hold.stop();
    hold.mark_lost();
    assert!(!hold.is_lost(), "lost() fired after the release began");
}

#[tokio::test]
async fn a_signal_asked_for_after_the_loss_is_already_fired() {
    let hold = watched_hold();
    // Nobody asked for the signal before the loss: it is made afterwards, fired.
    hold.mark_lost();
    assert!(hold.is_lost());
    assert!(
        hold.lost_signal().is_cancelled(),
        "a signal asked for after the loss"
    );
    hold.stop();
}

/// A hold of the memory store with a 30 s lease, watched by the watchdog (call inside a
/// runtime).
fn watched_hold() -> std::sync::Arc<crate::hold::Hold> {
    use crate::hold::{Hold, Holder};
    use crate::metrics::Meter;
    use crate::{Claim, FencingToken, Grant, LockBackend, LockKey, Owner};

    let backend: std::sync::Arc<dyn LockBackend> = MemoryBackend::new();
    Hold::start(
        backend,
        Meter::new("memory", false),
        Holder {
            key: LockKey::new("k").unwrap(),
            owner: Owner::new("test"),
            claim: Claim::exclusive(),
        },
        true,
        (Instant::now(), Instant::now()),
        Grant::new(FencingToken(1), Duration::from_secs(30)),
        &tokio::runtime::Handle::current(),
    )
    .unwrap()
}
