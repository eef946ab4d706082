//! Leader election through the client: campaign, leader, observe, resign, and what an
//! election refuses.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::memory::MemoryBackend;
use crate::tests::faulty::Faulty;
use crate::*;

const BOUND: Duration = Duration::from_secs(10);

#[tokio::test]
async fn one_leader_at_a_time_and_terms_rise() {
    let store = MemoryBackend::new();
    let (a, b) = (LockClient::new(store.clone()), LockClient::new(store));
    let first = a.election("e").campaign("a:1").await.unwrap();
    assert_eq!(first.value(), "a:1");
    assert_eq!(first.key().as_str(), "e");
    let second = {
        let b = b.clone();
        tokio::spawn(async move { b.election("e").campaign("b:2").await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(
        !second.is_finished(),
        "a second leader while the first leads"
    );
    let leader = b.election("e").leader().await.unwrap().unwrap();
    assert_eq!((leader.value.as_str(), leader.term), ("a:1", first.term()));
    let first_term = first.term();
    first.resign().await.unwrap();
    let second = tokio::time::timeout(BOUND, second)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(second.term() > first_term);
    assert_eq!(
        a.election("e").leader().await.unwrap().unwrap().value,
        "b:2"
    );
    second.resign().await.unwrap();
    assert_eq!(a.election("e").leader().await.unwrap(), None);
}

#[tokio::test]
async fn observers_see_each_leader_once_in_term_order() {
    let store = MemoryBackend::new();
    let (a, b) = (LockClient::new(store.clone()), LockClient::new(store));
    let mut watch = b.election("e").observe().unwrap();
    assert_eq!(watch.changed().await.unwrap(), None, "nobody leads yet");
    let mut terms = Vec::new();
    for i in 0..4 {
        let value = format!("node-{i}");
        let leadership = a.election("e").campaign(&value).await.unwrap();
        let seen = tokio::time::timeout(BOUND, watch.changed())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(
            (seen.value.as_str(), seen.term),
            (value.as_str(), leadership.term())
        );
        assert_eq!(watch.current(), Some(&seen));
        terms.push(seen.term);
        leadership.resign().await.unwrap();
        let vacant = tokio::time::timeout(BOUND, watch.changed()).await.unwrap();
        assert_eq!(vacant.unwrap(), None, "the resignation was not seen");
    }
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
}

#[tokio::test]
async fn an_observer_wakes_on_the_release_not_the_lease() {
    let locks = LockClient::new(MemoryBackend::new());
    let election = locks.election("e").ttl(Duration::from_secs(60));
    let leadership = election.campaign("x").await.unwrap();
    let mut watch = election.observe().unwrap();
    assert_eq!(
        watch.changed().await.unwrap().unwrap().term,
        leadership.term()
    );
    let change = tokio::spawn(async move { watch.changed().await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    leadership.resign().await.unwrap();
    // Far less than the 60 s lease: the release signal woke it.
    let seen = tokio::time::timeout(Duration::from_secs(5), change).await;
    assert_eq!(seen.unwrap().unwrap().unwrap(), None);
}

#[tokio::test]
async fn a_dropped_campaign_leaves_nothing_and_a_deadline_times_out() {
    let locks = LockClient::new(MemoryBackend::new());
    let leader = locks.election("e").campaign("a").await.unwrap();
    let err = locks
        .election("e")
        .wait(Duration::from_millis(30))
        .campaign("b")
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    let election = locks.election("e");
    let pending = election.campaign("c");
    assert!(tokio::time::timeout(Duration::from_millis(30), pending)
        .await
        .is_err());
    leader.resign().await.unwrap();
    assert_eq!(locks.election("e").leader().await.unwrap(), None);
}

#[tokio::test]
async fn values_are_published_as_given_or_refused() {
    let locks = LockClient::new(MemoryBackend::new());
    for bad in ["a\nb".to_owned(), "x".repeat(MAX_LABEL_LEN + 1)] {
        let err = locks.election("e").campaign(bad).await.unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err:?}");
    }
    let longest = "é".repeat(MAX_LABEL_LEN / 2);
    let leadership = locks.election("e").campaign(&longest).await.unwrap();
    assert_eq!(
        locks.election("e").leader().await.unwrap().unwrap().value,
        longest
    );
    leadership.resign().await.unwrap();
    let err = locks.election("bad\0key").observe().unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
}

#[tokio::test]
async fn a_backend_without_tokens_cannot_hold_elections() {
    let store = Faulty::new();
    store.unfenced.store(true, Ordering::SeqCst);
    let locks = LockClient::new(store);
    let err = locks.election("e").campaign("a").await.unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err:?}");
    assert!(err.to_string().contains("fencing tokens"), "{err}");
}

#[tokio::test]
async fn resigning_a_lost_leadership_says_so() {
    let store = MemoryBackend::new();
    let locks = LockClient::new(store.clone());
    let leadership = locks
        .election("e")
        .ttl(Duration::from_secs(30))
        .campaign("a")
        .await
        .unwrap();
    locks.force_release("e").await.unwrap();
    let err = leadership.resign().await.unwrap_err();
    assert!(matches!(err, LockError::NotHeld { .. }), "{err:?}");
}
