//! MySQL/MariaDB: the whole conformance suite (shared server from `DISTLOCK_TEST_MYSQL_URL`,
//! fault scenarios on MariaDB servers of their own), the contract checks, byte-exact keys,
//! polling hand-off, and a holder's connection killed on the server.
#![cfg(feature = "mysql")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::servers::{shared_url, OwnServer};
use conformance_tests::{FaultClient, FaultStore, Harness, TcpProxy};
use driver_sql::mysql::{MySqlBackend, MYSQL_CAPABILITIES};
use driver_sql::SqlOptions;
use lockcore::{AcquireOutcome, LockBackend, LockClient, LockError, Owner, ReleaseOutcome};

const URL_VAR: &str = "DISTLOCK_TEST_MYSQL_URL";

fn url() -> String {
    shared_url(URL_VAR)
}

fn options(table: &str) -> SqlOptions {
    SqlOptions::new().table(table).unwrap().max_connections(4)
}

async fn backend(table: &str) -> Arc<MySqlBackend> {
    MySqlBackend::connect(&url(), options(table)).await.unwrap()
}

struct MyHarness {
    url: String,
    table: String,
}

#[async_trait]
impl Harness for MyHarness {
    async fn client(&self) -> Result<LockClient, LockError> {
        let backend = MySqlBackend::connect(&self.url, options(&self.table)).await?;
        Ok(LockClient::new(backend))
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(500)
    }

    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        Ok(Some(Box::new(MyFaultStore {
            server: OwnServer::mariadb().await,
        })))
    }
}

struct MyFaultStore {
    server: OwnServer,
}

#[async_trait]
impl FaultStore for MyFaultStore {
    async fn client(&self) -> Result<FaultClient, LockError> {
        let proxy = TcpProxy::start(self.server.addr())
            .await
            .map_err(|e| LockError::unavailable("mysql", e))?;
        let options = SqlOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(2));
        let backend = MySqlBackend::connect(&self.server.url_via(proxy.addr()), options).await?;
        Ok(FaultClient {
            client: LockClient::new(backend),
            link: Arc::new(proxy),
        })
    }

    async fn stop(&self) {
        self.server.stop().await;
    }

    async fn start(&self) {
        self.server.start().await;
    }
}

conformance_tests::suite!(
    in_tree conformance,
    capabilities: MYSQL_CAPABILITIES,
    notifications: false,
    faults: true,
    harness: || async { MyHarness { url: url(), table: format!("locks_{}", common::random_suffix()) } },
);

async fn two_backends() -> (Arc<dyn LockBackend>, Arc<dyn LockBackend>) {
    let table = format!("locks_{}", common::random_suffix());
    (backend(&table).await, backend(&table).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_matches_memory_backend() {
    let (a, b) = two_backends().await;
    tokio::time::timeout(Duration::from_secs(60), common::contract(a, b))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_increase() {
    let (a, b) = two_backends().await;
    tokio::time::timeout(Duration::from_secs(60), common::tokens_increase(a, b))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_keys_stay_apart() {
    let (a, b) = two_backends().await;
    tokio::time::timeout(Duration::from_secs(60), common::hostile_keys(a, b))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_are_woken() {
    let (a, b) = two_backends().await;
    let local = tokio::time::timeout(Duration::from_secs(30), common::local_handoff(a.clone()))
        .await
        .unwrap();
    assert!(
        local < Duration::from_millis(200),
        "own waiter woken after {local:?}"
    );
    let polled = tokio::time::timeout(Duration::from_secs(30), common::handoff(a, b))
        .await
        .unwrap();
    assert!(
        polled < Duration::from_millis(600),
        "polling noticed the release after {polled:?}"
    );
}

/// MySQL's default collations would make `A`, `a` and `a ` one key; the table must not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_and_trailing_space_keys_stay_distinct() {
    let (a, b) = two_backends().await;
    let prefix = format!("c{}:", common::random_suffix());
    let names = ["A", "a", "a ", "a  ", "\u{e9}", "e\u{301}", "\u{c9}"];
    let mut owners = Vec::new();
    for name in names {
        let k = lockcore::LockKey::new(format!("{prefix}{name}")).unwrap();
        let o = Owner::new(format!("owner of {name:?}"));
        let outcome = a
            .try_acquire(&k, &o, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(
            matches!(outcome, AcquireOutcome::Acquired(_)),
            "{name:?} was merged with another key"
        );
        owners.push((k, o));
    }
    for (k, o) in &owners {
        assert_eq!(b.inspect(k).await.unwrap().unwrap().holder, o.label());
        assert_eq!(a.release(k, o).await.unwrap(), ReleaseOutcome::Released);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_backends_exclude_each_other() {
    let table = format!("locks_{}", common::random_suffix());
    let mut backends: Vec<Arc<dyn LockBackend>> = Vec::new();
    for _ in 0..3 {
        backends.push(backend(&table).await);
    }
    tokio::time::timeout(
        Duration::from_secs(120),
        common::mutual_exclusion(backends, 6, 15),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_names_with_sql_are_rejected() {
    let err = driver_sql::connect(&format!("{}?distlock_table=x;DROP%20TABLE%20y", url()))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    // Both schemes reach the same server.
    let table = format!("locks_{}", common::random_suffix());
    let a = driver_sql::connect(&format!("{}?distlock_table={table}", url()))
        .await
        .unwrap();
    let b = driver_sql::connect(&format!(
        "{}?distlock_table={table}",
        url().replacen("mysql://", "mariadb://", 1)
    ))
    .await
    .unwrap();
    assert_eq!(a.name(), "mysql");
    let k = common::key("scheme");
    let o = Owner::new("o");
    assert!(matches!(
        a.try_acquire(&k, &o, Duration::from_secs(5)).await.unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    assert!(b.inspect(&k).await.unwrap().is_some());
}

/// The holder's connections (pooled and kept) are killed on the server: the lock stays
/// held until released (the release is retried on a fresh connection) and is then free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_connection_keeps_the_lock_correct() {
    let table = format!("locks_{}", common::random_suffix());
    // Every connection the holder's pool opens records its id.
    let opened = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let record = opened.clone();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(4)
        .test_before_acquire(false)
        .after_connect(move |conn, _| {
            let record = record.clone();
            Box::pin(async move {
                let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                    .fetch_one(conn)
                    .await?;
                record.lock().unwrap().push(id);
                Ok(())
            })
        })
        .connect(&url())
        .await
        .unwrap();
    let holder = MySqlBackend::from_pool(pool, options(&table).keep_connections(4))
        .await
        .unwrap();
    let other = backend(&table).await;
    let k = common::key("killed");
    let (o, p) = (Owner::new("holder"), Owner::new("other"));
    assert!(matches!(
        holder
            .try_acquire(&k, &o, Duration::from_secs(30))
            .await
            .unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    let ids = opened.lock().unwrap().clone();
    assert!(!ids.is_empty(), "no connection of the holder recorded");
    for id in &ids {
        sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
            .execute(other.pool())
            .await
            .unwrap();
    }
    assert!(matches!(
        other
            .try_acquire(&k, &p, Duration::from_secs(5))
            .await
            .unwrap(),
        AcquireOutcome::Held(_)
    ));
    // The first statement on a killed connection may fail; a retry gets a new one.
    let mut released = None;
    for _ in 0..5 {
        match holder.release(&k, &o).await {
            Ok(outcome) => {
                released = Some(outcome);
                break;
            }
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
    }
    assert_eq!(released, Some(ReleaseOutcome::Released));
    assert!(matches!(
        other
            .try_acquire(&k, &p, Duration::from_secs(5))
            .await
            .unwrap(),
        AcquireOutcome::Acquired(_)
    ));
}

/// The database stops: operations fail with `Unavailable` within the acquire timeout, and
/// work again after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stopped_database_is_unavailable_then_recovers() {
    let server = OwnServer::mariadb().await;
    let options = SqlOptions::new().acquire_timeout(Duration::from_secs(1));
    let backend = MySqlBackend::connect(&server.url_via(server.addr()), options)
        .await
        .unwrap();
    let k = common::key("stop");
    let o = Owner::new("o");
    assert!(matches!(
        backend
            .try_acquire(&k, &o, Duration::from_secs(30))
            .await
            .unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    server.stop().await;
    let started = std::time::Instant::now();
    let err = backend
        .try_acquire(&k, &o, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    let err = backend.inspect(&k).await.unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    server.start().await;
    let mut answer = None;
    for _ in 0..20 {
        if let Ok(a) = backend.inspect(&k).await {
            answer = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // fsync is off in test servers, so what survived the restart is not asserted; the
    // backend answers again.
    assert!(answer.is_some(), "no answer after restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_deletes_released_rows() {
    let table = format!("locks_{}", common::random_suffix());
    let b = MySqlBackend::connect(&url(), options(&table).gc_grace(Duration::ZERO))
        .await
        .unwrap();
    let keep = common::key("kept");
    let o = Owner::new("o");
    assert!(matches!(
        b.try_acquire(&keep, &o, Duration::from_secs(30))
            .await
            .unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    common::collected_rows_keep_tokens_rising(b.clone()).await;
    let rows: i64 =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(b.pool())
            .await
            .unwrap();
    assert_eq!(rows, 2, "the live lock and the last released row");
    assert!(
        b.inspect(&keep).await.unwrap().is_some(),
        "a live lock was collected"
    );
}

/// TLS options reach sqlx through the URL: the test server has no TLS, so asking for none
/// works and requiring it fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_options_pass_through_the_url() {
    let sep = if url().contains('?') { '&' } else { '?' };
    let plain = driver_sql::connect(&format!("{}{sep}ssl-mode=DISABLED", url())).await;
    assert!(plain.is_ok(), "{:?}", plain.err());
    let options = SqlOptions::new().acquire_timeout(Duration::from_secs(2));
    let tls = driver_sql::connect_with(&format!("{}{sep}ssl-mode=REQUIRED", url()), options).await;
    assert!(
        tls.is_err(),
        "TLS was required of a server without it, and the connection worked"
    );
}

async fn from_pool(pool: sqlx::Pool<sqlx::MySql>, options: SqlOptions) -> Arc<dyn LockBackend> {
    MySqlBackend::from_pool(pool, options).await.unwrap()
}

/// Kept connections go from one operation to the next without a trip through the pool
/// (and sqlx's ping on return); a shared pool keeps none by default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_connections_skip_the_pool() {
    let table = format!("locks_{}", common::random_suffix());
    common::kept::skip_the_pool(&url(), options(&table), from_pool).await;
}

/// One connection kept by a backend, many tasks: the ones waiting for the pool take the
/// kept connection when it comes free (the pool would never hand it out).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_kept_connection_serves_concurrent_operations() {
    let table = format!("locks_{}", common::random_suffix());
    common::kept::serve_concurrent_operations(&url(), options(&table), from_pool).await;
}

/// A kept connection unused for a while goes back to the application's pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_kept_connection_returns_to_the_pool() {
    let table = format!("locks_{}", common::random_suffix());
    common::kept::idle_connection_returns(&url(), options(&table), from_pool).await;
}

/// Shutdown hands kept connections back at once instead of waiting for them to idle out
/// (closing a pool waits for every connection it lent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_kept_connections() {
    let table = format!("locks_{}", common::random_suffix());
    let b = backend(&table).await;
    common::cycles(&*b, 3).await;
    tokio::time::timeout(Duration::from_millis(800), b.shutdown())
        .await
        .expect("shutdown waited for kept connections");
}

/// A backend dropped after its runtime (kept connections and all) does not panic.
#[test]
fn backend_outlives_its_runtime() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let table = format!("locks_{}", common::random_suffix());
    let b = runtime.block_on(async {
        let b = backend(&table).await;
        common::cycles(&*b, 2).await;
        b
    });
    drop(runtime);
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connection_is_reported_at_once() {
    common::refused_connection_is_reported_at_once(|addr| async move {
        MySqlBackend::connect(&format!("mysql://u:p@{addr}/db"), SqlOptions::new()).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stopped_database_is_reported_at_once() {
    let server = OwnServer::mariadb().await;
    let backend = MySqlBackend::connect(&server.url_via(server.addr()), SqlOptions::new())
        .await
        .unwrap();
    common::stopped_server_is_reported_at_once(backend, &server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_server_names_the_time_bound() {
    common::silent_server_names_the_time_bound(|addr, bound| async move {
        MySqlBackend::connect(
            &format!("mysql://u:p@{addr}/db"),
            SqlOptions::new().acquire_timeout(bound),
        )
        .await
    })
    .await;
}
