//! SQLite: the whole conformance suite on a temp file, the contract checks, several
//! backends and several processes on one file, and releases retried while busy.
#![cfg(feature = "sqlite")]

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::scenarios;
use conformance_tests::layer::{FaultLayer, StoreSwitch};
use conformance_tests::{FaultClient, FaultStore, Harness, Restart, Tamper};
use distlock_sql::sqlite::{SqliteBackend, SQLITE_CAPABILITIES};
use distlock_sql::SqlOptions;
use lockcore::driver::{AcquireOutcome, LockBackendExt};
use lockcore::{FencingToken, LockBackend, LockClient, LockError, LockKey, Owner, ReleaseOutcome};

/// A directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("distlock-sqlite-{}", common::random_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn url(&self, file: &str) -> String {
        format!("sqlite:{}", self.0.join(file).display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // A connection still being opened by a backend that outlives the test can create
        // the file again while the directory is removed: try once more.
        for _ in 0..3 {
            if std::fs::remove_dir_all(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

async fn backend(url: &str, table: &str) -> Arc<SqliteBackend> {
    SqliteBackend::connect(url, SqlOptions::new().table(table).unwrap())
        .await
        .unwrap()
}

struct SqliteHarness {
    dir: TempDir,
    table: String,
}

impl SqliteHarness {
    fn new() -> Self {
        SqliteHarness {
            dir: TempDir::new(),
            table: format!("locks_{}", common::random_suffix()),
        }
    }
}

#[async_trait]
impl Harness for SqliteHarness {
    /// A backend with its own pool on the shared file, as another process would have.
    async fn client(&self) -> Result<LockClient, LockError> {
        let options = SqlOptions::new().table(&self.table)?;
        Ok(LockClient::new(
            SqliteBackend::connect(&self.dir.url("locks.db"), options).await?,
        ))
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(500)
    }

    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        Ok(Some(Box::new(SqliteFaultStore {
            dir: TempDir::new(),
            switch: StoreSwitch::new(),
        })))
    }
}

/// SQLite has no server to stop: a fault store of its own file whose clients each wrap
/// their own backend in the suite's `FaultLayer`, which a scenario can pause, delay, or cut
/// ("stopped": every call fails with `Unavailable`, as a database that cannot be opened
/// would).
struct SqliteFaultStore {
    dir: TempDir,
    switch: StoreSwitch,
}

#[async_trait]
impl FaultStore for SqliteFaultStore {
    async fn client(&self) -> Result<FaultClient, LockError> {
        let inner = SqliteBackend::connect(&self.dir.url("fault.db"), SqlOptions::new()).await?;
        let link = Arc::new(FaultLayer::new(inner, self.switch.clone()));
        Ok(FaultClient {
            client: LockClient::new(link.clone()),
            link,
        })
    }

    async fn stop(&self) -> Result<(), LockError> {
        self.switch.stop();
        Ok(())
    }

    async fn start(&self) -> Result<(), LockError> {
        self.switch.start();
        Ok(())
    }

    /// Keeping the data: the file stays. Losing it: every row deleted, as a file restored
    /// from a copy taken before any lock.
    async fn restart(&self, how: Restart) -> Result<bool, LockError> {
        self.switch.stop();
        let cleared = match how {
            Restart::KeepData => Ok(()),
            Restart::LoseData => self.delete(None).await,
            other => Err(LockError::config(format!("{other:?} is not implemented"))),
        };
        self.switch.start();
        cleared.map(|()| true)
    }

    /// Plain `DELETE`s on a connection of its own, as the `sqlite3` shell would.
    async fn tamper(&self, key: &LockKey, how: Tamper) -> Result<(), LockError> {
        match how {
            Tamper::Delete => self.delete(Some(key)).await,
            Tamper::Reassign => {
                let stranger = *lockcore::Owner::new("stranger").token().as_bytes();
                self.rewrite(key, Some(stranger)).await
            }
            Tamper::Rewrite => self.rewrite(key, None).await,
            other => Err(LockError::config(format!("{other:?} is not implemented"))),
        }
    }
}

impl SqliteFaultStore {
    /// Writes `key`'s row again with a plain `UPDATE`: the same columns, or with `owner`
    /// as its owner.
    async fn rewrite(&self, key: &LockKey, owner: Option<[u8; 16]>) -> Result<(), LockError> {
        use sqlx::Connection;
        let unavailable = |e: sqlx::Error| LockError::unavailable("sqlite", e);
        let mut conn = sqlx::SqliteConnection::connect(&self.dir.url("fault.db"))
            .await
            .map_err(unavailable)?;
        sqlx::query(
            "UPDATE distlock_locks SET owner = COALESCE(?, owner), label = label \
             WHERE lock_key = ?",
        )
        .bind(owner.map(Vec::from))
        .bind(key.as_str().as_bytes())
        .execute(&mut conn)
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    /// Deletes `key`'s rows, or every row, with plain statements.
    async fn delete(&self, key: Option<&LockKey>) -> Result<(), LockError> {
        use sqlx::Connection;
        let unavailable = |e: sqlx::Error| LockError::unavailable("sqlite", e);
        let mut conn = sqlx::SqliteConnection::connect(&self.dir.url("fault.db"))
            .await
            .map_err(unavailable)?;
        for table in ["distlock_locks", "distlock_locks_leases"] {
            let statement = match key {
                Some(_) => format!("DELETE FROM {table} WHERE lock_key = ?"),
                None => format!("DELETE FROM {table}"),
            };
            let mut query = sqlx::query(sqlx::AssertSqlSafe(statement));
            if let Some(key) = key {
                query = query.bind(key.as_str().as_bytes());
            }
            query.execute(&mut conn).await.map_err(unavailable)?;
        }
        Ok(())
    }
}

conformance_tests::suite!(
    in_tree conformance,
    capabilities: SQLITE_CAPABILITIES,
    faults: true,
    shared: true,
    semaphores: true,
    fair: bounded,
    harness: || async { SqliteHarness::new() },
);

/// The writes of one process to a file take turns: tasks that start together, hold
/// for no time and ask again at once all get turns. Without the turns, the task that
/// released asked SQLite again while the others slept in its busy handler, and took the
/// key again most times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_take_turns_in_the_process() {
    const TASKS: usize = 4;
    const ROUNDS: usize = 6;
    let dir = TempDir::new();
    let client = LockClient::new(backend(&dir.url("locks.db"), "locks").await);
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..TASKS)
        .map(|me| {
            let (client, order) = (client.clone(), order.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = client.lock("turns").acquire().await.unwrap();
                    order.lock().unwrap().push(me);
                    guard.release().await.unwrap();
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .unwrap()
            .unwrap();
    }
    let order = order.lock().unwrap().clone();
    let busy = &order[..TASKS * (ROUNDS - 1)];
    let again = busy.windows(2).filter(|w| w[0] == w[1]).count();
    assert!(again <= 3, "{again} grants in a row to one task: {order:?}");
    client.shutdown().await;
}

/// Bounded fairness of the default layout: marks for long waits.
mod marks {
    use super::*;

    common::marks::marks_tests!(two_backends());
}

async fn two_backends() -> (TempDir, Arc<dyn LockBackend>, Arc<dyn LockBackend>) {
    let dir = TempDir::new();
    let url = dir.url("locks.db");
    let a: Arc<dyn LockBackend> = backend(&url, "locks").await;
    let b: Arc<dyn LockBackend> = backend(&url, "locks").await;
    (dir, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_matches_memory_backend() {
    let (_dir, a, b) = two_backends().await;
    scenarios::contract_matches_memory_backend(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_increase_within_one_millisecond() {
    let (_dir, a, b) = two_backends().await;
    scenarios::tokens_increase(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_keys_stay_apart() {
    let (_dir, a, b) = two_backends().await;
    scenarios::hostile_keys_stay_apart(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_are_woken() {
    let (_dir, a, b) = two_backends().await;
    let polled = Duration::from_millis(600);
    scenarios::waiters_are_woken(a, b, polled, "polling noticed the release").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_backends_on_one_file_exclude_each_other() {
    let dir = TempDir::new();
    let url = dir.url("locks.db");
    scenarios::several_backends_exclude_each_other(|| backend_dyn(&url, "locks")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_names_with_sql_are_rejected() {
    let dir = TempDir::new();
    let url = dir.url("locks.db");
    for bad in ["locks; DROP TABLE x", "locks--", "a b", "\"x\"", ""] {
        assert!(
            matches!(SqlOptions::new().table(bad), Err(LockError::Config { .. })),
            "{bad}"
        );
    }
    let err = distlock_sql::connect(&format!("{url}?distlock_table=x;DROP%20TABLE%20y"))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    // A good name through the URL is used.
    let backend = distlock_sql::connect(&format!("{url}?distlock_table=named_locks"))
        .await
        .unwrap();
    let k = common::key("named");
    let o = Owner::new("o");
    assert!(matches!(
        backend
            .try_acquire(&k, &o, Duration::from_secs(5))
            .await
            .unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    let other = backend_dyn(&url, "other_locks").await;
    assert!(
        other.inspect(&k).await.unwrap().is_none(),
        "tables are separate namespaces"
    );
    assert!(backend.inspect(&k).await.unwrap().is_some());
}

async fn backend_dyn(url: &str, table: &str) -> Arc<dyn LockBackend> {
    backend(url, table).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_creates_the_file_and_rejects_unknown_schemes() {
    let dir = TempDir::new();
    let path = dir.0.join("sub.db");
    assert!(!path.exists());
    let backend = distlock_sql::connect(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    assert_eq!(backend.name(), "sqlite");
    assert!(path.exists());
    // Migration is idempotent: a second backend on the same file and table works.
    let again = distlock_sql::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let k = common::key("k");
    let o = Owner::new("o");
    assert!(matches!(
        backend
            .try_acquire(&k, &o, Duration::from_secs(5))
            .await
            .unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    assert!(again.inspect(&k).await.unwrap().is_some());
    for bad in ["ftp://x", "nonsense", "redis://127.0.0.1/"] {
        assert!(
            matches!(
                distlock_sql::connect(bad).await,
                Err(LockError::Config { .. })
            ),
            "{bad}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused() {
    let dir = TempDir::new();
    let url = dir.url("locks.db");
    let b = backend(&url, "locks").await;
    sqlx::query("UPDATE locks_version SET version = 99")
        .execute(b.pool())
        .await
        .unwrap();
    let err = SqliteBackend::connect(&url, SqlOptions::new().table("locks").unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
}

/// The database file deleted, or replaced by another, under a holder: every process that
/// opens the path now gets another store, where a second holder of the lock would go
/// unnoticed. The holder learns it at its next renewal (`lost()`, well before its TTL
/// runs out), and the backend refuses to take locks in the old file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_replaced_file_loses_its_holds() {
    for replaced in [false, true] {
        let dir = TempDir::new();
        let url = dir.url("locks.db");
        let locks = LockClient::new(backend(&url, "locks").await);
        let ttl = Duration::from_secs(3);
        let guard = locks.lock("job").ttl(ttl).acquire().await.unwrap();
        let path = dir.0.join("locks.db");
        if replaced {
            // As `mv new.db locks.db` would: another database at the path.
            let other = dir.url("other.db");
            let other_backend = backend(&other, "locks").await;
            other_backend.pool().close().await;
            std::fs::rename(dir.0.join("other.db"), &path).unwrap();
        } else {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
        let started = std::time::Instant::now();
        tokio::time::timeout(ttl / 2, guard.lost())
            .await
            .unwrap_or_else(|_| panic!("replaced={replaced}: the holder did not learn it"));
        assert!(started.elapsed() < ttl / 2, "replaced={replaced}");
        let err = locks.lock("other").try_acquire().await.unwrap_err();
        let said = lockcore::ErrorChain(&err).to_string();
        let word = if replaced {
            "was replaced"
        } else {
            "was deleted"
        };
        assert!(said.contains(word), "replaced={replaced}: {said}");
        assert!(said.contains(&path.display().to_string()), "{said}");
        drop(guard);
        locks.shutdown().await;
    }
}

/// A hold's renewal goes ahead of this process's writes waiting for their turn: 1,000 tasks
/// of the same process taking and releasing other locks on the file keep a line of writes
/// longer than a renewal may wait (a quarter of the TTL); the hold is kept for three TTLs.
/// In the line, its renewals gave up in turn and a 1 s hold was lost within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_goes_ahead_of_the_writes_in_line() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let dir = TempDir::new();
    let locks = LockClient::new(backend(&dir.url("locks.db"), "locks").await);
    let ttl = Duration::from_secs(1);
    let held = locks.lock("held").ttl(ttl).acquire().await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..1000 {
        let (locks, stop, cycles) = (locks.clone(), stop.clone(), cycles.clone());
        tasks.push(tokio::spawn(async move {
            let key = format!("flood-{i}");
            while !stop.load(Ordering::Relaxed) {
                if let Ok(Some(g)) = locks.lock(key.as_str()).ttl(ttl).try_acquire().await {
                    let _ = g.release().await;
                }
                cycles.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let lost = tokio::time::timeout(ttl * 3, held.lost()).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    assert!(
        lost.is_err(),
        "the hold was lost while {} lock cycles of the same process queued their writes: {:?}",
        cycles.load(Ordering::Relaxed),
        *held.renewal_health().borrow()
    );
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_is_retried_while_another_process_writes() {
    use sqlx::Connection;
    let dir = TempDir::new();
    let url = dir.url("locks.db");
    let options = SqlOptions::new()
        .table("locks")
        .unwrap()
        .busy_timeout(Duration::from_millis(20));
    let b = SqliteBackend::connect(&url, options).await.unwrap();
    let k = common::key("busy");
    let o = Owner::new("o");
    assert!(matches!(
        b.try_acquire(&k, &o, Duration::from_secs(30))
            .await
            .unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    // Another connection (as another process would) holds the write lock for a while.
    let mut other = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        sqlx::query("COMMIT").execute(&mut other).await.unwrap();
        other
    });
    let released = tokio::time::timeout(Duration::from_secs(10), b.release(&k, &o))
        .await
        .unwrap();
    assert_eq!(released.unwrap(), ReleaseOutcome::Released);
    drop(writer.await.unwrap());
    assert!(b.inspect(&k).await.unwrap().is_none());
}

const CHILD_ENV: &str = "DISTLOCK_SQLITE_CHILD_URL";
const CHILD_ROUNDS: u64 = 25;

/// The body of one process of `several_processes_share_one_file`; does nothing when run
/// as an ordinary test.
#[test]
fn sqlite_child_process() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let counter_path = std::env::var("DISTLOCK_SQLITE_CHILD_COUNTER").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let locks = LockClient::new(backend(&url, "locks").await);
        for _ in 0..CHILD_ROUNDS {
            let guard = locks
                .lock("shared-counter")
                .ttl(Duration::from_secs(10))
                .wait(Duration::from_secs(60))
                .acquire()
                .await
                .unwrap();
            let text = std::fs::read_to_string(&counter_path).unwrap_or_default();
            let mut parts = text.split_whitespace().map(|s| s.parse::<u64>().unwrap());
            let (count, last_token) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
            assert!(
                guard.token().0 > last_token,
                "token {} after {last_token}",
                guard.token()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
            std::fs::write(&counter_path, format!("{} {}", count + 1, guard.token().0)).unwrap();
            guard.release().await.unwrap();
        }
    });
}

#[test]
fn several_processes_share_one_file() {
    let dir = TempDir::new();
    let url = dir.url("locks.db");
    let counter = dir.0.join("counter.txt");
    let exe = std::env::current_exe().unwrap();
    // Create the file and table once, so the children meet an existing database.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        backend(&url, "locks").await;
    });
    let children: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "sqlite_child_process",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, &url)
                .env("DISTLOCK_SQLITE_CHILD_COUNTER", &counter)
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    for mut child in children {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "a child process failed: {status}");
                break;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("a child process did not finish in time");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let text = std::fs::read_to_string(&counter).unwrap();
    let count: u64 = text.split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(count, 3 * CHILD_ROUNDS, "lost updates across processes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_deletes_released_rows() {
    let dir = TempDir::new();
    let url = dir.url("locks.db");
    let options = SqlOptions::new()
        .table("locks")
        .unwrap()
        .gc_grace(Duration::ZERO);
    let b = SqliteBackend::connect(&url, options).await.unwrap();
    let count_rows = || async {
        sqlx::query_scalar("SELECT COUNT(*) FROM locks")
            .fetch_one(b.pool())
            .await
            .unwrap()
    };
    scenarios::garbage_collection_deletes_released_rows(b.clone(), count_rows).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_url_is_one_database_per_backend() {
    let a = distlock_sql::connect("sqlite::memory:").await.unwrap();
    let b = distlock_sql::connect("sqlite::memory:").await.unwrap();
    let k = common::key("memory");
    let (o, p) = (Owner::new("o"), Owner::new("p"));
    assert!(matches!(
        a.try_acquire(&k, &o, Duration::from_secs(5)).await.unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    // Every connection of a's pool sees the lock; b is a database of its own.
    let probes: Vec<_> = (0..16)
        .map(|_| {
            let (a, k) = (a.clone(), k.clone());
            tokio::spawn(async move { a.inspect(&k).await.unwrap().is_some() })
        })
        .collect();
    for probe in probes {
        assert!(
            probe.await.unwrap(),
            "a connection of the pool saw another database"
        );
    }
    assert!(matches!(
        a.try_acquire(&k, &p, Duration::from_secs(5)).await.unwrap(),
        AcquireOutcome::Held(_)
    ));
    assert!(b.inspect(&k).await.unwrap().is_none());
}

/// Connects to `url` expecting an error; returns it as one line, checking that it names
/// `file` and came quickly.
async fn connect_error(url: &str, file: &std::path::Path) -> (LockError, String) {
    let started = std::time::Instant::now();
    let err = SqliteBackend::connect(url, SqlOptions::new())
        .await
        .unwrap_err();
    let line = common::chain(&err);
    println!("{line}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}: {line}",
        started.elapsed()
    );
    assert!(
        line.contains(&file.display().to_string()),
        "the error does not name {}: {line}",
        file.display()
    );
    (err, line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_directory_is_named() {
    let dir = TempDir::new();
    let file = dir.0.join("no-such-dir").join("locks.db");
    let (_, line) = connect_error(&format!("sqlite:{}", file.display()), &file).await;
    assert!(line.contains("unable to open database file"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_is_named() {
    let dir = TempDir::new();
    let file = dir.0.join("locks.db");
    // A database opened read-only (as a file without write permission is): the table
    // cannot be created.
    std::fs::File::create(&file).unwrap();
    let (_, line) = connect_error(&format!("sqlite:{}?mode=ro", file.display()), &file).await;
    assert!(line.contains("readonly"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_is_not_a_database_is_named() {
    let dir = TempDir::new();
    let file = dir.0.join("notes.txt");
    std::fs::write(&file, "these are not the pages of a database\n".repeat(200)).unwrap();
    let (err, line) = connect_error(&format!("sqlite:{}", file.display()), &file).await;
    assert!(matches!(err, LockError::Backend { .. }), "{line}");
    assert!(line.contains("file is not a database"), "{line}");
}

/// A failing statement after connecting names the file too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_of_operations_name_the_file() {
    let dir = TempDir::new();
    let file = dir.0.join("locks.db");
    let url = format!("sqlite:{}", file.display());
    let table = format!("t_{}", common::random_suffix());
    let b = backend(&url, &table).await;
    // Another process drops the table under the backend.
    let other = backend(&url, "other").await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(other.pool())
        .await
        .unwrap();
    let err = b.inspect(&common::key("k")).await.unwrap_err();
    let line = common::chain(&err);
    println!("{line}");
    assert!(line.contains(&file.display().to_string()), "{line}");
    assert!(line.contains("no such table"), "{line}");
}

claim_tests!(async {
    let dir = TempDir::new();
    let table = format!("locks_{}", common::random_suffix());
    let url = dir.url("locks.db");
    let a: Arc<dyn LockBackend> = backend(&url, &table).await;
    let b: Arc<dyn LockBackend> = backend(&url, &table).await;
    (a, b, dir)
});

/// A pool on the file `file` of `dir` that runs `statements` as they are (a development
/// build's tables), binding `key` to those that take a parameter.
async fn written_by_hand(dir: &TempDir, file: &str, statements: &[String], key: &[u8]) {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.0.join(file))
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    for statement in statements {
        let query = sqlx::query(sqlx::AssertSqlSafe(statement.clone()));
        let query = if statement.contains("?1") {
            query.bind(key)
        } else {
            query
        };
        query.execute(&pool).await.unwrap();
    }
    pool.close().await;
}

/// A table made by a development build (schema stamps 1 to 8 in `<table>_schema`), holding a
/// lock, is refused with one line saying what to do, and nothing in the file changes: no
/// table, trigger or stamp is added, the lock and the stamp stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_development_table_is_refused_and_left_as_it_is() {
    let dir = TempDir::new();
    let url = dir.url("old.db");
    let t = "distlock_locks";
    let held = common::key("held");
    let statements = [
        format!(
            "CREATE TABLE {t} (lock_key BLOB NOT NULL PRIMARY KEY, owner BLOB NOT NULL, \
             label TEXT NOT NULL, fence INTEGER NOT NULL, expires_at INTEGER NOT NULL) \
             WITHOUT ROWID"
        ),
        format!(
            "CREATE TABLE {t}_schema (id INTEGER NOT NULL PRIMARY KEY, version INTEGER NOT NULL)"
        ),
        format!("INSERT INTO {t}_schema (id, version) VALUES (1, 1)"),
        format!(
            "INSERT INTO {t} VALUES (?1, X'01010101010101010101010101010101', 'old', 5, \
             CAST(unixepoch('subsec') * 1000000 AS INTEGER) + 3600000000)"
        ),
    ];
    written_by_hand(&dir, "old.db", &statements, held.as_bytes()).await;
    // Everything in the file (tables, indexes, triggers), its lock and its stamp.
    let what_is_there = || async {
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        let there: (String, String, i64) = sqlx::query_as(
            "SELECT (SELECT group_concat(name) FROM (SELECT name FROM sqlite_master \
               ORDER BY name)), \
             (SELECT label || ' ' || fence FROM distlock_locks), \
             (SELECT version FROM distlock_locks_schema)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        pool.close().await;
        there
    };
    for stamp in common::DEVELOPMENT_STAMPS {
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t}_schema SET version = {stamp}"
        )))
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
        let before = what_is_there().await;
        let err = SqliteBackend::connect(&url, SqlOptions::new())
            .await
            .unwrap_err();
        common::assert_refused_as_development(&err, t, stamp);
        assert_eq!(what_is_there().await, before, "stamp {stamp}");
    }
    assert_eq!(what_is_there().await.1, "old 5");
}

/// With `SqlOptions::migrate(false)` a backend uses the table as it finds it: on a fresh file
/// it creates nothing (its operations fail, naming the missing table), and on a table a
/// migrating backend made it takes and releases locks beside that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_migration_the_table_is_used_as_it_is() {
    let dir = TempDir::new();
    let url = dir.url("locks.db");
    let unmigrated = || SqliteBackend::connect(&url, SqlOptions::new().migrate(false));
    let b = unmigrated().await.unwrap();
    let err = b.inspect(&common::key("k")).await.unwrap_err();
    assert!(common::chain(&err).contains("no such table"), "{err}");
    let made: Arc<dyn LockBackend> = SqliteBackend::connect(&url, SqlOptions::new())
        .await
        .unwrap();
    let b: Arc<dyn LockBackend> = unmigrated().await.unwrap();
    let (k, o) = (common::key("k"), Owner::new("unmigrated"));
    assert!(matches!(
        b.try_acquire(&k, &o, Duration::from_secs(5)).await.unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    assert_eq!(
        made.inspect(&k).await.unwrap().unwrap().holder,
        "unmigrated"
    );
    assert_eq!(b.release(&k, &o).await.unwrap(), ReleaseOutcome::Released);
}

/// Processes that start together on a fresh file (the CLI's first use on a machine, a fleet
/// restarted at once) all open it: switching a new file to WAL and migrating it make the
/// others wait, never fail with "database is locked".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backends_opening_a_fresh_file_together_all_start() {
    for round in 0..5 {
        let dir = TempDir::new();
        let url = dir.url(&format!("fresh{round}.db"));
        let opens: Vec<_> = (0..8)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move {
                    SqliteBackend::connect(&url, SqlOptions::new())
                        .await
                        .map(|_| ())
                })
            })
            .collect();
        for open in opens {
            let opened = open.await.unwrap();
            assert!(opened.is_ok(), "round {round}: {:?}", opened.err());
        }
    }
}

/// A lock row restored from an old backup, its fence rewound far below the tokens handed out
/// since, still gives the next holder a token above every earlier one: the acquiring
/// statement floors the token with SQLite's clock (`MAX(fence + 1, now_us)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewound_fence_is_floored_by_the_clock() {
    let dir = TempDir::new();
    let b = backend(&dir.url("locks.db"), "locks").await;
    let (k, o) = (lockcore::LockKey::new("rewound").unwrap(), Owner::new("o"));
    let ttl = Duration::from_secs(30);
    let token = |outcome| match outcome {
        AcquireOutcome::Acquired(g) => g.token,
        other => panic!("a free key was not granted: {other:?}"),
    };
    let first = token(b.try_acquire(&k, &o, ttl).await.unwrap());
    assert_eq!(b.release(&k, &o).await.unwrap(), ReleaseOutcome::Released);
    sqlx::query("UPDATE locks SET fence = 1")
        .execute(b.pool())
        .await
        .unwrap();
    let second = token(b.try_acquire(&k, &o, ttl).await.unwrap());
    assert!(
        second > first,
        "after the fence was rewound the token went from {first:?} to {second:?}"
    );
}

/// Locks inside a transaction, on a fresh lock table and a fresh accounts table.
struct LiteTx {
    dir: TempDir,
    backend: Arc<SqliteBackend>,
    table: String,
    accounts: String,
}

#[async_trait]
impl common::transaction::TxDb for LiteTx {
    type Tx = sqlx::Transaction<'static, sqlx::Sqlite>;
    const LOCKS_THE_STORE: bool = true;

    async fn start() -> Self {
        let dir = TempDir::new();
        let table = format!("locks_{}", common::random_suffix());
        let backend = backend(&dir.url("locks.db"), &table).await;
        let accounts = format!("accounts_{}", common::random_suffix());
        let pool = backend.pool();
        let create = format!(
            "CREATE TABLE {accounts} (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, \
             fence BIGINT NOT NULL)"
        );
        sqlx::query(sqlx::AssertSqlSafe(create))
            .execute(pool)
            .await
            .unwrap();
        let fill = format!("INSERT INTO {accounts} VALUES (1, 100, 0), (2, 100, 0)");
        sqlx::query(sqlx::AssertSqlSafe(fill))
            .execute(pool)
            .await
            .unwrap();
        LiteTx {
            dir,
            backend,
            table,
            accounts,
        }
    }

    async fn client(&self) -> LockClient {
        // A short busy timeout: a transaction holding a key keeps the whole file locked.
        let options = SqlOptions::new().table(&self.table).unwrap();
        let url = self.dir.url("locks.db");
        let b = SqliteBackend::connect(&url, options.busy_timeout(Duration::from_millis(100)));
        LockClient::new(b.await.unwrap())
    }

    async fn begin(&self) -> Self::Tx {
        self.backend.pool().begin().await.unwrap()
    }

    async fn lock_in(
        &self,
        tx: &mut Self::Tx,
        key: &str,
        wait: Duration,
    ) -> Result<distlock_sql::TransactionLock, LockError> {
        self.backend.lock_in(tx, key, wait).await
    }

    async fn try_lock_in(
        &self,
        tx: &mut Self::Tx,
        key: &str,
    ) -> Result<Option<distlock_sql::TransactionLock>, LockError> {
        self.backend.try_lock_in(tx, key).await
    }

    async fn commit(tx: Self::Tx) {
        tx.commit().await.unwrap()
    }

    async fn rollback(tx: Self::Tx) {
        tx.rollback().await.unwrap()
    }

    async fn fenced_add(
        &self,
        tx: &mut Self::Tx,
        account: i64,
        delta: i64,
        token: FencingToken,
    ) -> bool {
        let update = format!(
            "UPDATE {} SET balance = balance + ?1, fence = ?2 WHERE id = ?3 AND fence <= ?2",
            self.accounts
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(update))
            .bind(delta)
            .bind(i64::try_from(token.0).unwrap())
            .bind(account)
            .execute(&mut **tx)
            .await
            .unwrap();
        done.rows_affected() == 1
    }

    async fn balance(&self, account: i64) -> i64 {
        let read = format!("SELECT balance FROM {} WHERE id = ?1", self.accounts);
        sqlx::query_scalar(sqlx::AssertSqlSafe(read))
            .bind(account)
            .fetch_one(self.backend.pool())
            .await
            .unwrap()
    }

    async fn usable(&self, tx: &mut Self::Tx) -> bool {
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut **tx)
            .await
            .unwrap();
        one == 1
    }
}

transaction_tests!(LiteTx);
