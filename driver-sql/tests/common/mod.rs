//! Checks shared by the three database test files: the backend-level contract, held to
//! `lockcore::memory::MemoryBackend`'s behaviour, and contention across backends.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::driver::{AcquireOutcome, ExtendOutcome, LockBackendExt, WaitHint};
use lockcore::{
    FencedResource, FencingToken, LockBackend, LockClient, LockError, LockKey, Owner,
    ReleaseOutcome,
};

/// A random lowercase suffix for table names and key prefixes.
pub fn random_suffix() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).unwrap();
    bytes.iter().map(|b| format!("{:02x}", b)).collect()
}

/// A fresh key under a random prefix.
pub fn key(name: &str) -> LockKey {
    LockKey::new(format!("t{}:{name}", random_suffix())).unwrap()
}

fn acquired(o: AcquireOutcome) -> FencingToken {
    match o {
        AcquireOutcome::Acquired(g) => g.token,
        AcquireOutcome::Held(c) => panic!("expected a grant, got contention {c:?}"),
    }
}

fn held(o: AcquireOutcome) -> Option<Duration> {
    match o {
        AcquireOutcome::Held(c) => c.remaining_ttl,
        AcquireOutcome::Acquired(g) => panic!("expected contention, got a grant {g:?}"),
    }
}

/// Every operation, on two backends of one database, as `MemoryBackend` behaves.
pub async fn contract(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let k = key("contract");
    let (alice, bob) = (Owner::new("alice"), Owner::new("bob"));
    let long = Duration::from_secs(10);

    let t1 = acquired(a.try_acquire(&k, &alice, long).await.unwrap());
    // Same owner again: same token, expiry not shortened.
    let again = acquired(
        a.try_acquire(&k, &alice, Duration::from_millis(1))
            .await
            .unwrap(),
    );
    assert_eq!(again, t1);
    let info = b.inspect(&k).await.unwrap().expect("held");
    assert_eq!(info.holder, "alice");
    assert_eq!(info.token, t1);
    let left = info.remaining_ttl.unwrap();
    assert!(left > Duration::from_secs(8) && left <= long, "{left:?}");
    // Another owner: held, with a plausible remaining TTL.
    let left = held(b.try_acquire(&k, &bob, long).await.unwrap()).unwrap();
    assert!(left > Duration::from_secs(8) && left <= long, "{left:?}");
    // Extend and release are owner-checked.
    assert_eq!(
        b.extend(&k, &bob, long).await.unwrap(),
        ExtendOutcome::NotHeld
    );
    assert_eq!(b.release(&k, &bob).await.unwrap(), ReleaseOutcome::NotHeld);
    match a.extend(&k, &alice, Duration::from_secs(20)).await.unwrap() {
        ExtendOutcome::Extended(g) => assert_eq!(g.token, t1),
        other => panic!("{other:?}"),
    }
    let left = a.inspect(&k).await.unwrap().unwrap().remaining_ttl.unwrap();
    assert!(left > Duration::from_secs(18), "{left:?}");
    // Extend never shortens.
    assert!(matches!(
        a.extend(&k, &alice, Duration::from_millis(5))
            .await
            .unwrap(),
        ExtendOutcome::Extended(_)
    ));
    let left = a.inspect(&k).await.unwrap().unwrap().remaining_ttl.unwrap();
    assert!(left > Duration::from_secs(18), "{left:?}");
    assert_eq!(
        a.release(&k, &alice).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        a.release(&k, &alice).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    assert!(b.inspect(&k).await.unwrap().is_none());
    // Extend never creates.
    assert_eq!(
        a.extend(&k, &alice, long).await.unwrap(),
        ExtendOutcome::NotHeld
    );
    assert!(b.inspect(&k).await.unwrap().is_none());

    // The next holder's token is higher.
    let t2 = acquired(
        b.try_acquire(&k, &bob, Duration::from_millis(60))
            .await
            .unwrap(),
    );
    assert!(t2 > t1, "{t2} after {t1}");
    // Expiry: gone after its TTL, a late release by the old holder frees nothing.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(a.inspect(&k).await.unwrap().is_none());
    assert_eq!(
        b.extend(&k, &bob, long).await.unwrap(),
        ExtendOutcome::NotHeld
    );
    // Same owner after expiry: a fresh grant with a new token.
    let t3 = acquired(b.try_acquire(&k, &bob, long).await.unwrap());
    assert!(t3 > t2);
    let carol = Owner::new("carol");
    let t3b = {
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(b.force_release(&k).await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(b.force_release(&k).await.unwrap(), ReleaseOutcome::NotHeld);
        assert_eq!(b.release(&k, &bob).await.unwrap(), ReleaseOutcome::NotHeld);
        acquired(a.try_acquire(&k, &carol, long).await.unwrap())
    };
    assert!(t3b > t3);
    assert_eq!(
        a.release(&k, &carol).await.unwrap(),
        ReleaseOutcome::Released
    );
    // A holder that expired: its late release is NotHeld and does not free the new holder.
    let t4 = acquired(
        a.try_acquire(&k, &alice, Duration::from_millis(30))
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(60)).await;
    let t5 = acquired(b.try_acquire(&k, &bob, long).await.unwrap());
    assert!(t5 > t4);
    assert_eq!(
        a.release(&k, &alice).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(b.inspect(&k).await.unwrap().unwrap().token, t5);
    assert_eq!(b.release(&k, &bob).await.unwrap(), ReleaseOutcome::Released);
}

/// Tokens strictly increase over quick acquire/release cycles on one key, alternating
/// backends and owners (SQLite's clock has millisecond resolution: many cycles share one).
pub async fn tokens_increase(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let k = key("tokens");
    let mut last = FencingToken(0);
    for i in 0..100 {
        let (backend, owner) = if i % 2 == 0 {
            (&a, Owner::new("even"))
        } else {
            (&b, Owner::new("odd"))
        };
        let t = acquired(
            backend
                .try_acquire(&k, &owner, Duration::from_secs(5))
                .await
                .unwrap(),
        );
        assert!(t > last, "cycle {i}: {t} after {last}");
        last = t;
        assert_eq!(
            backend.release(&k, &owner).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}

/// Keys that collations, LIKE patterns or string building would confuse stay apart.
pub async fn hostile_keys(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let prefix = format!("h{}:", random_suffix());
    let names = [
        "A".to_owned(),
        "a".to_owned(),
        "a ".to_owned(),
        " a".to_owned(),
        "'; DROP TABLE distlock_locks; --".to_owned(),
        "%".to_owned(),
        "_".to_owned(),
        "\\".to_owned(),
        "\\%".to_owned(),
        "\"quoted\"".to_owned(),
        "é".to_owned(),
        "e\u{301}".to_owned(),
        "日本語".to_owned(),
        "{}*:/".to_owned(),
    ];
    let mut keys: Vec<LockKey> = names
        .iter()
        .map(|n| LockKey::new(format!("{prefix}{n}")).unwrap())
        .collect();
    let pad = 255 - prefix.len();
    keys.push(LockKey::new(format!("{prefix}{}", "x".repeat(pad))).unwrap());
    keys.push(LockKey::new(format!("{prefix}{}y", "x".repeat(pad - 1))).unwrap());
    let mut owners = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let o = Owner::new(format!("owner-{i}"));
        acquired(a.try_acquire(k, &o, Duration::from_secs(10)).await.unwrap());
        owners.push(o);
    }
    for (i, k) in keys.iter().enumerate() {
        let info = b.inspect(k).await.unwrap().expect("held");
        assert_eq!(info.holder, format!("owner-{i}"), "key {k:?}");
        held(
            b.try_acquire(k, &Owner::new("x"), Duration::from_secs(1))
                .await
                .unwrap(),
        );
    }
    assert!(b
        .inspect(&LockKey::new(format!("{prefix}b")).unwrap())
        .await
        .unwrap()
        .is_none());
    for (k, o) in keys.iter().zip(&owners) {
        assert_eq!(
            a.release(k, o).await.unwrap(),
            ReleaseOutcome::Released,
            "{k:?}"
        );
    }
}

/// A waiter on another backend is woken soon after a release; returns how long it took.
pub async fn handoff(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) -> Duration {
    let k = key("handoff");
    let holder = Owner::new("holder");
    acquired(
        a.try_acquire(&k, &holder, Duration::from_secs(20))
            .await
            .unwrap(),
    );
    let waiter = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move {
            // Spurious wake-ups are allowed by the contract (a LISTEN session that just
            // connected wakes everyone, since it may have missed a release): wait again
            // while the key is still held.
            loop {
                b.wait_released(&k, &WaitHint::none(), u64::MAX, Duration::from_secs(10))
                    .await
                    .unwrap();
                if b.inspect(&k).await.unwrap().is_none() {
                    return Instant::now();
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter returned while the lock was held"
    );
    let released = Instant::now();
    assert_eq!(
        a.release(&k, &holder).await.unwrap(),
        ReleaseOutcome::Released
    );
    let woke = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    woke - released
}

/// A waiter on the releasing backend itself is woken in-process.
pub async fn local_handoff(a: Arc<dyn LockBackend>) -> Duration {
    handoff(a.clone(), a).await
}

/// Many tasks over several backends, a read-modify-write with an `.await` in between:
/// no lost update, and every write accepted by a fenced resource.
pub async fn mutual_exclusion(
    backends: Vec<Arc<dyn LockBackend>>,
    tasks_per_backend: usize,
    rounds: usize,
) {
    let k = key("mutex");
    let counter = Arc::new(AtomicU64::new(0));
    let fenced = Arc::new(FencedResource::new(0u64));
    let mut handles = Vec::new();
    let backends_len = backends.len() as u64;
    for backend in backends {
        let client = LockClient::new(backend);
        for _ in 0..tasks_per_backend {
            let (client, k, counter, fenced) =
                (client.clone(), k.clone(), counter.clone(), fenced.clone());
            handles.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let guard = client
                        .lock(k.as_str())
                        .ttl(Duration::from_secs(10))
                        .wait(Duration::from_secs(60))
                        .acquire()
                        .await
                        .unwrap();
                    let v = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    counter.store(v + 1, Ordering::SeqCst);
                    fenced
                        .write(guard.token(), |n| *n += 1)
                        .expect("fenced write accepted");
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for h in handles {
        tokio::time::timeout(Duration::from_secs(120), h)
            .await
            .unwrap()
            .unwrap();
    }
    let total = (tasks_per_backend * rounds) as u64 * backends_len;
    assert_eq!(counter.load(Ordering::SeqCst), total, "lost updates");
    assert_eq!(fenced.read(), total);
}

/// Asserts that `err`, from building a backend on lock table `t` that a development build
/// made and stamped `stamp` in `<t>_schema`, is a `Config` error of one line saying what to
/// do: drop the tables, named, or choose another table name.
pub fn assert_refused_as_development(err: &LockError, t: &str, stamp: i64) {
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    let text = err.to_string();
    assert!(!text.contains('\n'), "more than one line: {text}");
    for said in [
        format!("{t} was made by a development build of distlock (stamp {stamp} in {t}_schema)"),
        format!("drop its tables ({t}, {t}_leases, {t}_schema and, if there, {t}_queue)"),
        "choose another table name (SqlOptions::table, or distlock_table=NAME".to_string(),
    ] {
        assert!(text.contains(&said), "{said:?} missing from: {text}");
    }
}

/// The development stamps a table may carry: the schema versions 1 to 8 of development
/// builds.
pub const DEVELOPMENT_STAMPS: std::ops::RangeInclusive<i64> = 1..=8;

pub mod claims;
pub mod harness;
pub mod kept;
pub mod limits;
pub mod marks;
pub mod scenarios;
pub mod server_scenarios;
pub mod servers;
pub mod slow_open;
pub mod transaction;

/// With no grace, the first release's garbage collection deletes the released row; the
/// next holder's token still rises (from the clock). Returns the key, for a row count.
pub async fn collected_rows_keep_tokens_rising(b: Arc<dyn LockBackend>) -> LockKey {
    // More expired rows than one collection batch holds.
    let o = Owner::new("gc");
    for i in 0..2500 {
        let k = key(&format!("expired-{i}"));
        acquired(
            b.try_acquire(&k, &o, Duration::from_millis(1))
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let k = key("gc");
    let t1 = acquired(b.try_acquire(&k, &o, Duration::from_secs(5)).await.unwrap());
    assert_eq!(b.release(&k, &o).await.unwrap(), ReleaseOutcome::Released);
    // The collector runs in the background after the first release.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let t2 = acquired(b.try_acquire(&k, &o, Duration::from_secs(5)).await.unwrap());
    assert!(t2 > t1, "{t2} after {t1} once the row was collected");
    assert_eq!(b.release(&k, &o).await.unwrap(), ReleaseOutcome::Released);
    k
}

/// `n` acquire+release cycles on one key, each expected to succeed.
pub async fn cycles(b: &dyn LockBackend, n: usize) {
    let k = key("cycles");
    for _ in 0..n {
        let o = Owner::new("cycles");
        acquired(
            b.try_acquire(&k, &o, Duration::from_secs(10))
                .await
                .unwrap(),
        );
        assert_eq!(b.release(&k, &o).await.unwrap(), ReleaseOutcome::Released);
    }
}

/// `tasks` tasks doing `n` cycles each on keys of their own, at the same time, within
/// `bound`: a pool smaller than the number of tasks must still serve them all.
pub async fn concurrent_cycles(b: Arc<dyn LockBackend>, tasks: usize, n: usize, bound: Duration) {
    let started = Instant::now();
    let runs: Vec<_> = (0..tasks)
        .map(|_| {
            let b = b.clone();
            tokio::spawn(async move { cycles(&*b, n).await })
        })
        .collect();
    for run in runs {
        tokio::time::timeout(bound.saturating_sub(started.elapsed()), run)
            .await
            .expect("concurrent cycles took too long")
            .unwrap();
    }
}

/// An error and its sources on one line, as a log or the CLI shows the whole chain.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        line.push_str(": ");
        line.push_str(&s.to_string());
        source = s.source();
    }
    line
}

/// `err`, which came after `took`, is `Unavailable` and came before `bound`; returns it as
/// one line (printed, for the test's output).
fn unavailable_within(err: &lockcore::LockError, took: Duration, bound: Duration) -> String {
    let line = chain(err);
    println!("after {took:?}: {line}");
    assert!(
        matches!(err, lockcore::LockError::Unavailable { .. }),
        "{line}"
    );
    assert!(took < bound, "took {took:?}: {line}");
    line
}

/// Connecting to a port where nothing listens fails well under a second (not after the
/// acquire timeout) with `Unavailable`, naming the address and the refused connection.
pub async fn refused_connection_is_reported_at_once<B, F, Fut>(connect: F)
where
    B: std::fmt::Debug,
    F: FnOnce(std::net::SocketAddr) -> Fut,
    Fut: std::future::Future<Output = Result<B, lockcore::LockError>>,
{
    let addr = std::net::SocketAddr::from((
        [127, 0, 0, 1],
        conformance_tests::process::free_port().unwrap(),
    ));
    let started = Instant::now();
    let err = connect(addr).await.unwrap_err();
    let took = started.elapsed();
    let line = unavailable_within(&err, took, Duration::from_secs(1));
    assert!(
        line.contains(&format!("at {addr} is unavailable: cannot connect")),
        "{line}"
    );
    assert!(line.to_lowercase().contains("connection refused"), "{line}");
}

/// The server stops under a backend with the default 5 s acquire timeout: every operation
/// fails with `Unavailable` well under a second, and once the dead connections are used
/// up, the error names the refused connection.
pub async fn stopped_server_is_reported_at_once(
    backend: Arc<dyn LockBackend>,
    server: &servers::OwnServer,
) {
    let k = key("stopped");
    let o = Owner::new("o");
    backend
        .try_acquire(&k, &o, Duration::from_secs(30))
        .await
        .unwrap();
    server.stop().await;
    let mut seen = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let err = backend.inspect(&k).await.unwrap_err();
        let took = started.elapsed();
        let line = unavailable_within(&err, took, Duration::from_secs(1));
        // The database's own goodbye, or a broken or refused connection naming the server.
        let named = line.contains(&format!("at {} is unavailable", server.addr()));
        assert!(
            line.contains("terminating connection")
                || (named
                    && (line.contains("lost the connection") || line.contains("cannot connect"))),
            "{line}"
        );
        if line.to_lowercase().contains("connection refused") {
            assert!(named && line.contains("cannot connect"), "{line}");
            refused_attempts_leave_nothing_for_shutdown(backend).await;
            return;
        }
        seen.push(line);
    }
    panic!("no error named the refused connection: {seen:#?}");
}

/// With connections refused, failed acquisitions sent nothing: the client compensates none
/// of them, so its shutdown has nothing to wait for (it used to wait out a release retried
/// until the TTL for every failed attempt).
async fn refused_attempts_leave_nothing_for_shutdown(backend: Arc<dyn LockBackend>) {
    let locks = lockcore::LockClient::new(backend);
    for i in 0..5 {
        let err = locks
            .lock(format!("refused-{i}"))
            .ttl(Duration::from_secs(30))
            .try_acquire()
            .await
            .unwrap_err();
        assert!(
            matches!(err, lockcore::LockError::Unavailable { .. }),
            "{}",
            chain(&err)
        );
    }
    let started = Instant::now();
    assert!(
        locks.shutdown().await,
        "background work was left after refused attempts"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "shutdown took {:?}",
        started.elapsed()
    );
}

/// A server that accepts connections and never answers: the error comes after the acquire
/// timeout and says how long it waited.
pub async fn silent_server_names_the_time_bound<B, F, Fut>(connect: F)
where
    B: std::fmt::Debug,
    F: FnOnce(std::net::SocketAddr, Duration) -> Fut,
    Fut: std::future::Future<Output = Result<B, lockcore::LockError>>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let bound = Duration::from_millis(300);
    let started = Instant::now();
    let err = connect(addr, bound).await.unwrap_err();
    let took = started.elapsed();
    silent.abort();
    let line = unavailable_within(&err, took, Duration::from_secs(2));
    assert!(
        line.contains(&format!("at {addr} is unavailable"))
            && line.contains("no connection within 300ms"),
        "{line}"
    );
}

/// Log lines captured from `tracing` at debug level (the driver's and sqlx's), as
/// `DISTLOCK_LOG=debug` would print them.
///
/// The subscriber is the process's global one: `tracing` caches per call site whether
/// anyone listens, and a thread-local subscriber races with other tests' threads filling
/// that cache. So the tests using it live in a test binary of their own.
#[derive(Clone, Default)]
pub struct LogCapture(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    /// Installs the capture as the global subscriber (once per process).
    pub fn global() -> Self {
        static CAPTURE: std::sync::OnceLock<LogCapture> = std::sync::OnceLock::new();
        CAPTURE
            .get_or_init(|| {
                let capture = LogCapture::default();
                let writer = capture.clone();
                tracing_subscriber::fmt()
                    .with_max_level(tracing::Level::DEBUG)
                    .with_ansi(false)
                    .without_time()
                    .with_writer(move || writer.clone())
                    .init();
                capture
            })
            .clone()
    }

    /// What was logged since the last call.
    pub fn take(&self) -> String {
        let bytes = std::mem::take(&mut *self.0.lock().unwrap());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// A lock table used for the first time, with debug logging on: the migration logs no
/// failing statement (a probe of the missing table, statements prepared before it exists).
pub async fn first_start_logs_no_errors<F, Fut>(connect: F)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Arc<dyn LockBackend>>,
{
    // One at a time: the capture is the whole process's.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = ONE_AT_A_TIME.lock().await;
    let capture = LogCapture::global();
    let table = format!("fresh_{}", random_suffix());
    capture.take();
    let backend = connect(table.clone()).await;
    let locks = LockClient::new(backend);
    let guard = locks.lock("first").try_acquire().await.unwrap().unwrap();
    guard.release().await.unwrap();
    locks.shutdown().await;
    let logs = capture.take();
    // The capture works: sqlx logged the migration's statements.
    assert!(
        logs.contains(&format!("CREATE TABLE IF NOT EXISTS {table}")),
        "nothing captured: {logs}"
    );
    for bad in ["does not exist", "doesn't exist", "failed", "ERROR"] {
        assert!(
            !logs.contains(bad),
            "{bad:?} in the log of a first start:\n{logs}"
        );
    }
}
