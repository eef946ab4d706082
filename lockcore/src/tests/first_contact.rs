//! What a user meets first: errors, shutdown, split votes, `with_lock`.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::memory::MemoryBackend;
use crate::tests::faulty::Faulty;
use crate::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_vote_pauses_as_asked_instead_of_waiting_for_a_release() {
    let store = Faulty::new();
    store.split_votes.store(2, Ordering::SeqCst);
    let client = LockClient::new(store.clone());
    let started = Instant::now();
    let guard = client
        .lock("split")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(store.waits(), 0, "nobody held it: no wait");
    let pause = crate::tests::faulty::SPLIT_VOTE_PAUSE;
    assert!(took >= pause * 2, "two pauses: {took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_errors_name_the_operation_and_the_key() {
    let store = Faulty::new();
    store.acquire_failures.store(1, Ordering::SeqCst);
    let client = LockClient::new(store.clone());
    let err = client.lock("invoice:42").acquire().await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "faulty is unavailable while acquiring \"invoice:42\""
    );
    assert_eq!(
        ErrorChain(&err).to_string(),
        "faulty is unavailable while acquiring \"invoice:42\": timed out waiting for the answer"
    );
    // A short lease: a failing release is retried until the lease ends.
    let ttl = Duration::from_millis(300);
    let guard = client.lock("invoice:42").ttl(ttl).acquire().await.unwrap();
    store.release_fails.store(true, Ordering::SeqCst);
    let err = guard.release().await.unwrap_err();
    assert!(
        err.to_string().ends_with("while releasing \"invoice:42\""),
        "{err}"
    );
}

/// With the store refusing connections, a failed attempt applied nothing: no
/// compensating release is sent, and shutdown does not wait for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_is_not_compensated() {
    let store = Faulty::new();
    store.test.stop();
    let client = LockClient::new(store.clone());
    for i in 0..10 {
        let err = client.lock(format!("k{i}")).acquire().await.unwrap_err();
        assert!(matches!(err, LockError::Unavailable { .. }));
    }
    let started = Instant::now();
    assert!(client.shutdown().await);
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(
        store.test.ops().claims,
        10,
        "the attempts reached the stopped store"
    );
    assert_eq!(store.releases(), 0);

    // An attempt whose answer was lost may have been applied: that one is released.
    let store = Faulty::new();
    store.acquire_failures.store(1, Ordering::SeqCst);
    let client = LockClient::new(store.clone());
    client.lock("k").acquire().await.unwrap_err();
    assert!(client.shutdown().await);
    assert_eq!(store.releases(), 1);
}

/// A release that cannot get through is retried until the lease ends (here a minute):
/// shutdown gives up at its timeout instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_bounded_by_its_timeout() {
    let store = Faulty::new();
    let client = LockClient::builder(store.clone())
        .shutdown_timeout(Duration::from_millis(300))
        .build();
    let guard = client
        .lock("k")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    store.release_fails.store(true, Ordering::SeqCst);
    drop(guard);
    let started = Instant::now();
    assert!(!client.shutdown().await, "the release cannot have finished");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
}

/// Without a deadline, failures are retried only when a policy says so, and only for as
/// long as it says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_policy_rides_out_failures_without_a_deadline() {
    let store = Faulty::new();
    store.acquire_failures.store(3, Ordering::SeqCst);
    let client = LockClient::new(store.clone());
    let policy = RetryPolicy::new().first_delay(Duration::from_millis(5));
    let guard = client.lock("k").retry(policy).acquire().await.unwrap();
    assert_eq!(store.acquire_failures.load(Ordering::SeqCst), 0);
    guard.release().await.unwrap();

    store.acquire_failures.store(usize::MAX, Ordering::SeqCst);
    let started = Instant::now();
    let err = client
        .lock("k")
        .retry(policy.max_elapsed(Duration::from_millis(200)))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "{took:?}");
    // 5, 10, 20 and 40 ms (plus jitter) fit in the 200 ms: at least five attempts.
    let attempts = usize::MAX - store.acquire_failures.load(Ordering::SeqCst);
    assert!(attempts >= 5, "{attempts} attempts in {took:?}");
    // try_acquire makes its one attempt whatever the policy.
    let before = store.acquire_failures.load(Ordering::SeqCst);
    let err = client.lock("k").retry(policy).try_acquire().await;
    assert!(err.is_err());
    assert_eq!(store.acquire_failures.load(Ordering::SeqCst), before - 1);
}

/// with_lock stops the work when the lock is lost and says which lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_reports_the_lost_key() {
    let store = MemoryBackend::new();
    let client = LockClient::new(store.clone());
    let breaker = client.clone();
    let request = client.lock("report").ttl(Duration::from_millis(300));
    let work = request.with_lock(|lock| async move {
        assert!(!lock.is_lost());
        breaker.force_release("report").await.unwrap();
        lock.lost().await;
        std::future::pending::<()>().await
    });
    // The next renewal (100 ms) finds the lock gone; a lost() that never fires is a failure,
    // not a hang.
    let err = tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .expect("with_lock did not stop the work of a lost lock within 10 s")
        .unwrap_err();
    assert!(
        matches!(&err, LockError::Lost { key } if key.as_str() == "report"),
        "{err:?}"
    );
}

/// try_with_lock skips the work when the lock is held, and runs it when free.
#[tokio::test]
async fn try_with_lock_skips_a_held_lock() {
    let client = LockClient::new(MemoryBackend::new());
    let held = client.lock("cron").acquire().await.unwrap();
    let ran = std::sync::atomic::AtomicBool::new(false);
    let out = client
        .lock("cron")
        .try_with_lock(|_| async {
            ran.store(true, Ordering::SeqCst);
        })
        .await
        .unwrap();
    assert!(out.is_none() && !ran.load(Ordering::SeqCst));
    held.release().await.unwrap();
    let token = client
        .lock("cron")
        .try_with_lock(|lock| async move { lock.token() })
        .await
        .unwrap();
    assert!(token.is_some());
    assert!(
        client.inspect("cron").await.unwrap().is_none(),
        "released after the work"
    );
}
