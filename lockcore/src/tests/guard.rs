//! Guards: what they show, renewal health, extend.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::memory::MemoryBackend;
use crate::tests::faulty::Faulty;
use crate::{LockClient, LockError, RenewalHealth};

/// A guard prints what identifies the hold, not the store behind it.
#[tokio::test]
async fn debug_shows_the_hold_not_the_store() {
    let client = LockClient::new(MemoryBackend::new());
    let mut guards = Vec::new();
    for k in ["a-key", "b-key", "c-key", "d-key"] {
        guards.push(client.lock(k).acquire().await.unwrap());
    }
    let shown = format!("{:?}", guards[0]);
    assert!(
        shown.starts_with("LockGuard { key: LockKey(\"a-key\"), token: "),
        "{shown}"
    );
    assert!(shown.contains("backend: \"memory\""), "{shown}");
    assert!(!shown.contains("b-key") && shown.len() < 200, "{shown}");
    let client_shown = format!("{client:?}");
    assert!(
        !client_shown.contains("a-key") && client_shown.len() < 200,
        "{client_shown}"
    );
    let handle_shown = format!("{:?}", guards[0].handle());
    assert!(
        handle_shown.starts_with("LockHandle { key: LockKey(\"a-key\")"),
        "{handle_shown}"
    );
}

/// The first failed renewal raises the warning long before the lock counts as lost;
/// a renewal that goes through clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_failing_fires_at_the_first_failure_and_clears_on_recovery() {
    let store = Faulty::new();
    let client = LockClient::new(store.clone());
    let ttl = Duration::from_millis(900);
    let guard = client.lock("k").ttl(ttl).acquire().await.unwrap();
    let mut health = guard.renewal_health();
    assert_eq!(*health.borrow(), RenewalHealth::Renewing);
    let failing = guard.renewal_failing();
    store.extend_fails.store(true, Ordering::SeqCst);
    // The first renewal is due at ttl/3: the warning comes with it.
    tokio::time::timeout(ttl / 2 + Duration::from_millis(200), failing)
        .await
        .expect("renewal_failing() did not fire at the first failed renewal");
    assert!(!guard.is_lost(), "the warning must come before the loss");
    match &*health.borrow_and_update() {
        RenewalHealth::Failing {
            failures,
            last_error,
            ..
        } => {
            assert!(*failures >= 1);
            assert!(
                last_error.contains("renewing \"k\"") && last_error.contains("timed out"),
                "{last_error}"
            );
        }
        other => panic!("{other:?}"),
    }
    store.extend_fails.store(false, Ordering::SeqCst);
    tokio::time::timeout(ttl, health.wait_for(|h| *h == RenewalHealth::Renewing))
        .await
        .expect("a successful renewal did not clear the warning")
        .unwrap();
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
}

/// An explicit extend that finds the lock gone names the key.
#[tokio::test]
async fn extend_after_loss_names_the_key() {
    let store = MemoryBackend::new();
    let client = LockClient::new(store.clone());
    let guard = client
        .lock("job:7")
        .watchdog(false)
        .acquire()
        .await
        .unwrap();
    client.force_release("job:7").await.unwrap();
    let err = guard.extend().await.unwrap_err();
    assert!(
        matches!(&err, LockError::NotHeld { key } if key.as_str() == "job:7"),
        "{err:?}"
    );
    assert!(guard.is_lost());
}
