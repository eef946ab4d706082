//! What the client records (feature `metrics`), counted exactly by a recorder of the test's
//! own. Each test labels by key and uses keys of its own, so tests running in parallel
//! against the one global recorder do not see each other's events.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};

use crate::memory::MemoryBackend;
use crate::metrics as m;
use crate::tests::faulty::Faulty;
use crate::{LockBackend, LockClient, LockError};

/// Keeps every metric in a registry that the tests read without resetting it.
struct TestRecorder(Registry<Key, AtomicStorage>);

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

fn recorder() -> &'static TestRecorder {
    static RECORDER: OnceLock<&'static TestRecorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder: &'static TestRecorder = Box::leak(Box::new(TestRecorder(Registry::atomic())));
        metrics::set_global_recorder(recorder).expect("no other recorder in lockcore's tests");
        recorder
    })
}

/// Whether `key` carries the label `key=<lock>` and every `(name, value)` of `labels`.
fn matches(key: &Key, lock: &str, labels: &[(&str, &str)]) -> bool {
    let has = |name: &str, value: &str| key.labels().any(|l| l.key() == name && l.value() == value);
    has("key", lock) && labels.iter().all(|(n, v)| has(n, v))
}

fn counter(name: &str, lock: &str, labels: &[(&str, &str)]) -> u64 {
    recorder()
        .0
        .get_counter_handles()
        .into_iter()
        .filter(|(k, _)| k.name() == name && matches(k, lock, labels))
        .map(|(_, c)| c.load(Ordering::SeqCst))
        .sum()
}

fn gauge(name: &str, lock: &str) -> f64 {
    recorder()
        .0
        .get_gauge_handles()
        .into_iter()
        .filter(|(k, _)| k.name() == name && matches(k, lock, &[]))
        .map(|(_, g)| f64::from_bits(g.load(Ordering::SeqCst)))
        .sum()
}

fn samples(name: &str, lock: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    recorder()
        .0
        .get_histogram_handles()
        .into_iter()
        .filter(|(k, _)| k.name() == name && matches(k, lock, labels))
        .flat_map(|(_, h)| h.data())
        .collect()
}

fn client(backend: Arc<dyn LockBackend>) -> LockClient {
    recorder();
    LockClient::builder(backend).metrics_by_key(true).build()
}

/// An uncontended cycle: one grant, one wait, one attempt, one hold that counts while it
/// lives, every one labelled with the backend.
#[tokio::test]
async fn a_cycle_records_its_grant_wait_and_hold() {
    let locks = client(MemoryBackend::new());
    let key = "metrics-cycle";
    let guard = locks.lock(key).acquire().await.unwrap();
    assert_eq!(gauge(m::HOLDS, key), 1.0);
    tokio::time::sleep(Duration::from_millis(20)).await;
    guard.release().await.unwrap();
    assert_eq!(gauge(m::HOLDS, key), 0.0);
    let labels = [("backend", "memory"), ("mode", "exclusive")];
    assert_eq!(counter(m::ACQUISITIONS, key, &labels), 1);
    let waits = samples(m::ACQUIRE_WAIT, key, &[("outcome", "acquired")]);
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert_eq!(
        samples(m::ACQUIRE_ATTEMPT, key, &[("outcome", "acquired")]).len(),
        1
    );
    let held = samples(m::HOLD, key, &[("backend", "memory")]);
    assert_eq!(held.len(), 1);
    assert!(held[0] >= 0.02 && held[0] < 5.0, "{held:?}");
    assert_eq!(counter(m::CONTENTION, key, &[]), 0);
}

/// Contention, a try that misses, a wait that times out and one that is dropped: each
/// counted under its own outcome.
#[tokio::test]
async fn contention_timeouts_and_cancellations_have_their_outcomes() {
    let locks = client(MemoryBackend::new());
    let key = "metrics-contention";
    let held = locks.lock(key).acquire().await.unwrap();
    assert!(locks.lock(key).try_acquire().await.unwrap().is_none());
    let err = locks
        .lock(key)
        .wait(Duration::from_millis(30))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }));
    let cancelled =
        tokio::time::timeout(Duration::from_millis(30), locks.lock(key).acquire()).await;
    assert!(cancelled.is_err());
    held.release().await.unwrap();

    assert_eq!(
        samples(m::ACQUIRE_WAIT, key, &[("outcome", "contended")]).len(),
        1
    );
    let timeouts = samples(m::ACQUIRE_WAIT, key, &[("outcome", "timeout")]);
    assert_eq!(timeouts.len(), 1);
    assert!(timeouts[0] >= 0.03, "{timeouts:?}");
    assert_eq!(
        samples(m::ACQUIRE_WAIT, key, &[("outcome", "cancelled")]).len(),
        1
    );
    assert_eq!(
        samples(m::ACQUIRE_WAIT, key, &[("outcome", "acquired")]).len(),
        1
    );
    let contention = counter(m::CONTENTION, key, &[("backend", "memory")]);
    let held_answers = samples(m::ACQUIRE_ATTEMPT, key, &[("outcome", "held")]).len();
    assert!(contention >= 3, "{contention}");
    assert_eq!(contention, held_answers as u64);
    assert_eq!(counter(m::ACQUISITIONS, key, &[]), 1);
}

/// A dropped guard is a background release until the store answered it.
#[tokio::test]
async fn a_dropped_guard_counts_as_a_background_release_until_answered() {
    let locks = client(MemoryBackend::new());
    let key = "metrics-dropped";
    let guard = locks.lock(key).acquire().await.unwrap();
    drop(guard);
    // The current-thread runtime has not run the release yet.
    assert_eq!(gauge(m::BACKGROUND_RELEASES, key), 1.0);
    assert!(locks.shutdown().await);
    assert_eq!(gauge(m::BACKGROUND_RELEASES, key), 0.0);
    assert_eq!(gauge(m::HOLDS, key), 0.0);
    assert_eq!(samples(m::HOLD, key, &[]).len(), 1);
}

/// Renewals that go through, then one that finds the lock gone: the hold is lost once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_and_a_loss_are_counted() {
    let backend = MemoryBackend::new();
    let locks = client(backend.clone());
    let key = "metrics-lost";
    let guard = locks
        .lock(key)
        .ttl(Duration::from_millis(90))
        .acquire()
        .await
        .unwrap();
    let start = std::time::Instant::now();
    while counter(m::RENEWALS, key, &[("outcome", "extended")]) == 0 {
        assert!(start.elapsed() < Duration::from_secs(5), "no renewal");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    locks.force_release(key).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost fires");
    assert_eq!(counter(m::LOST, key, &[("backend", "memory")]), 1);
    assert_eq!(counter(m::RENEWALS, key, &[("outcome", "not_held")]), 1);
    assert_eq!(counter(m::RENEWALS, key, &[("outcome", "failed")]), 0);
    drop(guard);
    assert!(locks.shutdown().await);
    assert_eq!(counter(m::LOST, key, &[]), 1, "counted once");
}

/// Store errors by operation and kind, each retry counted; renewals that fail are counted
/// as failed; errors that are not the store's are not store errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_errors_are_counted_by_operation_and_kind() {
    let faulty = Faulty::new();
    let locks = client(faulty.clone());
    let key = "metrics-errors";
    faulty.acquire_failures.store(2, Ordering::SeqCst);
    let guard = locks
        .lock(key)
        .ttl(Duration::from_millis(300))
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let acquire = [
        ("operation", "acquire"),
        ("kind", "unavailable"),
        ("backend", "faulty"),
    ];
    assert_eq!(counter(m::STORE_ERRORS, key, &acquire), 2);
    assert_eq!(
        samples(m::ACQUIRE_ATTEMPT, key, &[("outcome", "error")]).len(),
        2
    );

    faulty.extend_fails.store(true, Ordering::SeqCst);
    let start = std::time::Instant::now();
    while counter(m::RENEWALS, key, &[("outcome", "failed")]) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no failed renewal"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let renew = [("operation", "renew"), ("kind", "unavailable")];
    assert!(counter(m::STORE_ERRORS, key, &renew) >= 2);
    assert!(guard.extend().await.is_err());
    assert_eq!(counter(m::STORE_ERRORS, key, &[("operation", "extend")]), 1);
    faulty.extend_fails.store(false, Ordering::SeqCst);

    faulty.release_fails.store(true, Ordering::SeqCst);
    let release = tokio::spawn(guard.release());
    let start = std::time::Instant::now();
    while counter(m::STORE_ERRORS, key, &[("operation", "release")]) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no retried release"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    faulty.release_fails.store(false, Ordering::SeqCst);
    release.await.unwrap().unwrap();
}

/// Without `metrics_by_key`, no metric carries the key.
#[tokio::test]
async fn keys_are_no_labels_unless_asked_for() {
    recorder();
    let locks = LockClient::new(MemoryBackend::new());
    let key = "metrics-unlabelled-key";
    locks
        .lock(key)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let registry = &recorder().0;
    let keys: Vec<Key> = registry
        .get_counter_handles()
        .into_keys()
        .chain(registry.get_histogram_handles().into_keys())
        .collect();
    assert!(keys.iter().all(|k| k.labels().all(|l| l.value() != key)));
    assert!(keys
        .iter()
        .any(|k| k.name() == m::ACQUISITIONS && !k.labels().any(|l| l.key() == "key")));
}
