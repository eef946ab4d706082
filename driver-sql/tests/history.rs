//! The history checker (`conformance_tests::history`) on the SQL backends: worker processes
//! lock one key while a nemesis pauses a holder past its lease, kills one, and restarts the
//! database server — a PostgreSQL and a MariaDB of the test's own (durable: the lock row
//! survives the restart), and a SQLite file shared by the worker processes (no server to
//! restart: the report says the restart was skipped).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use conformance_tests::history::{Check, HistoryStore, Mode, Workload};
use distlock_sql::SqlOptions;
use lockcore::{LockClient, LockError};

use common::servers::OwnServer;

/// The lease of every run.
const TTL: Duration = Duration::from_millis(500);

/// A worker's client of `url`.
async fn connect(url: String) -> Result<LockClient, LockError> {
    let options = SqlOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(1));
    Ok(LockClient::new(
        distlock_sql::connect_with(&url, options).await?,
    ))
}

/// Creates the lock table once, before the workers start, so they do not race to migrate.
async fn migrate(url: &str) {
    let backend = distlock_sql::connect_with(url, SqlOptions::new())
        .await
        .unwrap();
    drop(backend);
}

/// A database server of the test's own, restarted in place.
struct Server(OwnServer);

impl Server {
    async fn started(server: OwnServer) -> Server {
        let s = Server(server);
        migrate(&s.address()).await;
        s
    }
}

#[async_trait::async_trait]
impl HistoryStore for Server {
    fn address(&self) -> String {
        self.0.url_via(self.0.addr())
    }

    fn endpoints(&self) -> Vec<std::net::SocketAddr> {
        vec![self.0.addr()]
    }

    fn address_via(&self, via: &[std::net::SocketAddr]) -> String {
        self.0.url_via(via[0])
    }

    fn can_restart(&self) -> bool {
        true
    }

    fn can_set_clock(&self) -> bool {
        self.0.steered()
    }

    async fn set_clock(&self, offset_ms: i64) -> Result<(), String> {
        self.0.set_clock(offset_ms);
        Ok(())
    }

    async fn restart(&self) -> Result<(), String> {
        self.0.stop().await;
        self.0.start().await;
        Ok(())
    }
}

conformance_tests::history_test!(
    postgres,
    workload: Workload::new(TTL),
    connect: connect,
    store: || async { Server::started(OwnServer::postgres().await).await },
);

conformance_tests::history_test!(
    mysql,
    workload: Workload::new(TTL),
    connect: connect,
    store: || async { Server::started(OwnServer::mariadb().await).await },
);

/// A SQLite file in a directory of its own, removed at the end.
struct SqliteFile(PathBuf);

impl SqliteFile {
    async fn create() -> SqliteFile {
        let dir =
            std::env::temp_dir().join(format!("distlock-history-{}", common::random_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = SqliteFile(dir);
        migrate(&file.address()).await;
        file
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl HistoryStore for SqliteFile {
    fn address(&self) -> String {
        format!("sqlite:{}", self.0.join("locks.db").display())
    }
}

conformance_tests::history_test!(
    sqlite,
    workload: Workload::new(TTL),
    connect: connect,
    store: SqliteFile::create,
);

// The shared claims: a read-write lock, and a semaphore of two permits, on each database.

conformance_tests::history_test!(
    postgres_read_write,
    workload: Workload::new(TTL).mode(Mode::ReadWrite),
    connect: connect,
    store: || async { Server::started(OwnServer::postgres().await).await },
);

conformance_tests::history_test!(
    postgres_semaphore,
    workload: Workload::new(TTL).mode(Mode::Semaphore(2)),
    connect: connect,
    store: || async { Server::started(OwnServer::postgres().await).await },
);

conformance_tests::history_test!(
    mysql_read_write,
    workload: Workload::new(TTL).mode(Mode::ReadWrite),
    connect: connect,
    store: || async { Server::started(OwnServer::mariadb().await).await },
);

conformance_tests::history_test!(
    mysql_semaphore,
    workload: Workload::new(TTL).mode(Mode::Semaphore(2)),
    connect: connect,
    store: || async { Server::started(OwnServer::mariadb().await).await },
);

conformance_tests::history_test!(
    sqlite_read_write,
    workload: Workload::new(TTL).mode(Mode::ReadWrite),
    connect: connect,
    store: SqliteFile::create,
);

conformance_tests::history_test!(
    sqlite_semaphore,
    workload: Workload::new(TTL).mode(Mode::Semaphore(2)),
    connect: connect,
    store: SqliteFile::create,
);

/// The names libtest gives the tests below.
const POSTGRES_CLOCK_STEPS: &str = "postgres_clock_steps";
const MYSQL_CLOCK_STEPS: &str = "mysql_clock_steps";

/// Runs the clock steps alone (no other fault) on `server`, whose clock is steered, and
/// checks what held in every measured run: tokens unique and increasing, no stale write
/// accepted, no lost update. Only exclusion may fail, on a forward step.
fn clock_steps<F>(name: &str, server: impl FnOnce() -> F)
where
    F: std::future::Future<Output = OwnServer>,
{
    let workload = Workload::new(TTL)
        .faults(false, false, false)
        .partition(false)
        .clock_steps(true);
    let report = conformance_tests::history::run_report(name, workload, connect, || async {
        Server::started(server().await).await
    });
    eprintln!("{name}: {report}");
    assert_eq!(
        report.stats.clock_steps.len(),
        4,
        "the four steps were made:\n{report}"
    );
    // The fence column only ever rises (`fence + 1` while the key's row lives), so tokens
    // stay unique and increasing and the register stays right whatever the clock does.
    // Exclusion is what a forward step may break: a lease ends early by the store's clock
    // while its holder's own clock says it lives (measured: docs/fencing.md).
    for check in report.failed_checks() {
        assert_eq!(
            check,
            Check::MutualExclusion,
            "clock steps broke more than exclusion:\n{report}"
        );
    }
}

/// PostgreSQL's clock stepped forward by ten TTLs and back, then back by ten TTLs and
/// forward: what clock-assisted fencing does when the store's clock steps
/// (docs/fencing.md, "When the store's clock steps").
#[test]
fn postgres_clock_steps() {
    clock_steps(POSTGRES_CLOCK_STEPS, || {
        OwnServer::postgres_with_clock(true)
    });
}

/// The same on MariaDB.
#[test]
fn mysql_clock_steps() {
    clock_steps(MYSQL_CLOCK_STEPS, || OwnServer::mariadb_with_clock(true));
}
