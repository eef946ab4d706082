//! `distlock::blocking` through its own small runner: the core scenarios (mutual exclusion,
//! expiry, fencing, drop releases, loss) on the memory store, a SQLite file, and the real
//! Redis and PostgreSQL servers of `scripts/servers.sh`; and no panic inside a runtime.
#![cfg(all(
    feature = "blocking",
    feature = "sqlite",
    feature = "redis",
    feature = "postgres"
))]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::blocking::LockClient;
use distlock::{LockError, ReleaseOutcome};

/// A store for the scenarios: a URL every client of the scenario connects to, and a prefix
/// that keeps runs apart on shared servers.
struct Store {
    url: String,
    run: String,
}

impl Store {
    fn client(&self) -> LockClient {
        LockClient::connect(&self.url).expect("connect")
    }

    fn key(&self, name: &str) -> String {
        format!("blocking:{}:{name}", self.run)
    }
}

fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}", std::process::id())
}

/// Threads with clients of their own increment a counter by a read, a pause and a write
/// under the lock: no update is lost and never two hold it at once.
fn mutual_exclusion(store: &Store) {
    let key = store.key("counter");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (client, key) = (store.client(), key.clone());
            let (counter, inside) = (counter.clone(), inside.clone());
            std::thread::spawn(move || {
                for _ in 0..10 {
                    let guard = client
                        .lock(key.as_str())
                        .ttl(Duration::from_secs(10))
                        .wait(Duration::from_secs(30))
                        .acquire()
                        .expect("acquire");
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    let seen = counter.load(Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(1));
                    counter.store(seen + 1, Ordering::SeqCst);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert_eq!(guard.release().expect("release"), ReleaseOutcome::Released);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a worker thread panicked");
    }
    assert_eq!(counter.load(Ordering::SeqCst), 40, "lost updates");
}

/// A dropped guard has released its lock when `drop` returns; tokens increase.
fn drop_releases_and_tokens_increase(store: &Store) {
    let key = store.key("drop");
    let (a, b) = (store.client(), store.client());
    let first = a.lock(key.as_str()).acquire().expect("acquire");
    let token = first.token();
    assert!(b.lock(key.as_str()).try_acquire().expect("try").is_none());
    drop(first);
    let second = b
        .lock(key.as_str())
        .try_acquire()
        .expect("try")
        .expect("free as soon as the guard was dropped");
    assert!(second.token() > token, "{} after {token}", second.token());
    second.release().expect("release");
}

/// A holder that never releases loses the lock after its TTL: another client gets it then,
/// with a larger token, and the old guard reports the loss.
fn expiry_hands_over(store: &Store) {
    let key = store.key("expiry");
    let (a, b) = (store.client(), store.client());
    let ttl = Duration::from_millis(800);
    let stale = a
        .lock(key.as_str())
        .ttl(ttl)
        .watchdog(false)
        .acquire()
        .expect("acquire");
    let started = Instant::now();
    let next = b
        .lock(key.as_str())
        .wait(Duration::from_secs(10))
        .acquire()
        .expect("taken over after the TTL");
    assert!(
        started.elapsed() >= ttl / 2,
        "taken over too early: {:?}",
        started.elapsed()
    );
    assert!(next.token() > stale.token());
    assert!(
        stale.wait_lost(Duration::from_secs(5)).expect("wait"),
        "lost never fired"
    );
    assert!(stale.is_lost());
    assert_eq!(stale.release().expect("release"), ReleaseOutcome::NotHeld);
    next.release().expect("release");
}

/// A lock broken by an operator: the holder's extend says NotHeld and the flag is up.
fn loss_is_signalled(store: &Store) {
    let key = store.key("broken");
    let (a, b) = (store.client(), store.client());
    let guard = a
        .lock(key.as_str())
        .watchdog(false)
        .acquire()
        .expect("acquire");
    assert!(!guard.wait_lost(Duration::from_millis(10)).expect("wait"));
    b.force_release(key.as_str()).expect("force release");
    let err = guard.extend().unwrap_err();
    assert!(matches!(err, LockError::NotHeld { .. }), "{err:?}");
    assert!(guard.is_lost());
    let info = b.inspect(key.as_str()).expect("inspect");
    assert!(info.is_none(), "{info:?}");
}

fn scenarios(store: Store) {
    mutual_exclusion(&store);
    drop_releases_and_tokens_increase(&store);
    expiry_hands_over(&store);
    loss_is_signalled(&store);
    shared_claims(&store);
}

/// Readers share and keep a writer out; a semaphore lends at most its permits.
fn shared_claims(store: &Store) {
    let (a, b) = (store.client(), store.client());
    let key = store.key("rw");
    let r1 = a.lock(&key).shared().acquire().expect("first reader");
    let r2 = b.lock(&key).shared().acquire().expect("second reader");
    assert_eq!(r2.claim().mode(), distlock::ClaimMode::Shared);
    assert!(b.lock(&key).try_acquire().expect("writer try").is_none());
    assert_eq!(a.inspect_all(&key).expect("inspect_all").len(), 2);
    let last_reader = r2.token();
    drop((r1, r2));
    let w = b.lock(&key).acquire().expect("writer after the readers");
    assert!(w.token() > last_reader);
    drop(w);
    let key = store.key("sem");
    let two = a
        .semaphore(&key, 3)
        .permits(2)
        .acquire()
        .expect("two permits");
    let one = b.semaphore(&key, 3).acquire().expect("one permit");
    assert!(b.semaphore(&key, 3).try_acquire().expect("try").is_none());
    let err = b.semaphore(&key, 4).try_acquire().unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    drop((two, one));
}

#[test]
fn memory() {
    scenarios(Store {
        url: format!("memory:blocking-{}", run_id()),
        run: run_id(),
    });
}

#[test]
fn sqlite() {
    let dir = std::env::temp_dir().join(format!("distlock-blocking-{}", run_id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    scenarios(Store {
        url: format!("sqlite:{}", dir.join("locks.db").display()),
        run: run_id(),
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn redis() {
    let url = std::env::var("DISTLOCK_TEST_REDIS_URL")
        .expect("run scripts/servers.sh start (DISTLOCK_TEST_REDIS_URL)");
    scenarios(Store { url, run: run_id() });
}

#[test]
fn postgres() {
    let url = std::env::var("DISTLOCK_TEST_POSTGRES_URL")
        .expect("run scripts/servers.sh start (DISTLOCK_TEST_POSTGRES_URL)");
    scenarios(Store { url, run: run_id() });
}

/// Inside an async runtime every call answers a clear error instead of panicking, and
/// dropping a guard or a client there does not panic either.
#[test]
fn inside_a_runtime_it_refuses_without_panicking() {
    let client = LockClient::connect("memory:").expect("connect");
    let guard = client.lock("held").acquire().expect("acquire");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        let err = LockClient::connect("memory:").unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err:?}");
        assert!(err.to_string().contains("inside an async runtime"), "{err}");
        let err = client.lock("k").acquire().unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err:?}");
        let err = client.inspect("k").unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err:?}");
        drop(guard);
        drop(client);
    });
}
