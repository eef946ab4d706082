//! PostgreSQL: the whole conformance suite (shared server from `DISTLOCK_TEST_POSTGRES_URL`,
//! fault scenarios on servers of their own), the contract checks, NOTIFY hand-off, and a
//! holder's connection killed on the server.
#![cfg(feature = "postgres")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::servers::{shared_url, OwnServer};
use conformance_tests::{FaultClient, FaultStore, Harness, TcpProxy};
use driver_sql::postgres::{PostgresBackend, POSTGRES_CAPABILITIES};
use driver_sql::SqlOptions;
use lockcore::{
    AcquireOutcome, FencingToken, LockBackend, LockClient, LockError, Owner, ReleaseOutcome,
};

const URL_VAR: &str = "DISTLOCK_TEST_POSTGRES_URL";

fn url() -> String {
    shared_url(URL_VAR)
}

fn options(table: &str) -> SqlOptions {
    SqlOptions::new().table(table).unwrap().max_connections(4)
}

async fn backend(table: &str) -> Arc<PostgresBackend> {
    PostgresBackend::connect(&url(), options(table))
        .await
        .unwrap()
}

struct PgHarness {
    url: String,
    table: String,
}

#[async_trait]
impl Harness for PgHarness {
    async fn client(&self) -> Result<LockClient, LockError> {
        let backend = PostgresBackend::connect(&self.url, options(&self.table)).await?;
        Ok(LockClient::new(backend))
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(500)
    }

    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        Ok(Some(Box::new(PgFaultStore {
            server: OwnServer::postgres().await,
        })))
    }
}

struct PgFaultStore {
    server: OwnServer,
}

#[async_trait]
impl FaultStore for PgFaultStore {
    async fn client(&self) -> Result<FaultClient, LockError> {
        let proxy = TcpProxy::start(self.server.addr())
            .await
            .map_err(|e| LockError::unavailable("postgres", e))?;
        let options = SqlOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(2));
        let backend = PostgresBackend::connect(&self.server.url_via(proxy.addr()), options).await?;
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
    capabilities: POSTGRES_CAPABILITIES,
    notifications: true,
    faults: true,
    harness: || async { PgHarness { url: url(), table: format!("locks_{}", common::random_suffix()) } },
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
async fn waiters_are_woken_by_notify() {
    let (a, b) = two_backends().await;
    let local = tokio::time::timeout(Duration::from_secs(30), common::local_handoff(a.clone()))
        .await
        .unwrap();
    assert!(
        local < Duration::from_millis(200),
        "own waiter woken after {local:?}"
    );
    let remote = tokio::time::timeout(Duration::from_secs(30), common::handoff(a, b))
        .await
        .unwrap();
    assert!(
        remote < Duration::from_millis(200),
        "other backend's waiter woken after {remote:?}"
    );
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
        url().replacen("postgres://", "postgresql://", 1)
    ))
    .await
    .unwrap();
    assert_eq!(a.name(), "postgres");
    let k = common::key("scheme");
    let o = Owner::new("o");
    assert!(matches!(
        a.try_acquire(&k, &o, Duration::from_secs(5)).await.unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    assert!(b.inspect(&k).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_output_hides_the_password() {
    let backend = backend(&format!("locks_{}", common::random_suffix())).await;
    let shown = format!("{backend:?}");
    let password = url()
        .split_once("://")
        .unwrap()
        .1
        .split_once('@')
        .unwrap()
        .0
        .split_once(':')
        .map(|(_, p)| p.to_owned());
    if let Some(password) = password {
        assert!(!shown.contains(&format!(":{password}")), "{shown}");
        assert!(!shown.contains("password"), "{shown}");
    }
}

/// The holder's pooled connections are killed on the server: the lock stays held until
/// released (the release is retried on a fresh connection) and is then free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_connection_keeps_the_lock_correct() {
    let table = format!("locks_{}", common::random_suffix());
    let app = format!("distlock_kill_{}", common::random_suffix());
    let holder_url = format!("{}?application_name={app}", url());
    let holder = PostgresBackend::connect(&holder_url, options(&table))
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
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&app)
    .fetch_all(other.pool())
    .await
    .unwrap();
    assert!(!killed.is_empty(), "no connection of the holder found");
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
    let server = OwnServer::postgres().await;
    let options = SqlOptions::new().acquire_timeout(Duration::from_secs(1));
    let backend = PostgresBackend::connect(&server.url_via(server.addr()), options)
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
    let b = PostgresBackend::connect(&url(), options(&table).gc_grace(Duration::ZERO))
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

/// The backend's LISTEN session is killed on the server: it reconnects, and waiters are
/// still woken promptly afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_listen_session_reconnects() {
    let table = format!("locks_{}", common::random_suffix());
    let app = format!("distlock_listen_{}", common::random_suffix());
    let waiter: Arc<dyn LockBackend> = PostgresBackend::connect(
        &format!("{}?application_name={app}", url()),
        options(&table),
    )
    .await
    .unwrap();
    let holder: Arc<dyn LockBackend> = backend(&table).await;
    // A first hand-off starts the waiter's LISTEN session.
    let first = common::handoff(holder.clone(), waiter.clone()).await;
    assert!(first < Duration::from_millis(300), "{first:?}");
    let admin = backend(&table).await;
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&app)
    .fetch_all(admin.pool())
    .await
    .unwrap();
    assert!(!killed.is_empty());
    // The waiter's lock-pool connections were killed too: each fails once, then is replaced.
    let probe = common::key("probe");
    for _ in 0..10 {
        if waiter.inspect(&probe).await.is_ok() {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let again = common::handoff(holder, waiter).await;
    assert!(
        again < Duration::from_millis(400),
        "after the session was lost: {again:?}"
    );
}

/// TLS options reach sqlx through the URL: the test server has no TLS, so asking for none
/// works and requiring it fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_options_pass_through_the_url() {
    let sep = if url().contains('?') { '&' } else { '?' };
    let plain = driver_sql::connect(&format!("{}{sep}sslmode=disable", url())).await;
    assert!(plain.is_ok(), "{:?}", plain.err());
    let options = SqlOptions::new().acquire_timeout(Duration::from_secs(2));
    let tls = driver_sql::connect_with(&format!("{}{sep}sslmode=require", url()), options).await;
    assert!(
        tls.is_err(),
        "TLS was required of a server without it, and the connection worked"
    );
}

async fn from_pool(pool: sqlx::Pool<sqlx::Postgres>, options: SqlOptions) -> Arc<dyn LockBackend> {
    PostgresBackend::from_pool(pool, options).await.unwrap()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connection_is_reported_at_once() {
    common::refused_connection_is_reported_at_once(|addr| async move {
        PostgresBackend::connect(&format!("postgres://u:p@{addr}/db"), SqlOptions::new()).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stopped_database_is_reported_at_once() {
    let server = OwnServer::postgres().await;
    let backend = PostgresBackend::connect(&server.url_via(server.addr()), SqlOptions::new())
        .await
        .unwrap();
    common::stopped_server_is_reported_at_once(backend, &server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_server_names_the_time_bound() {
    common::silent_server_names_the_time_bound(|addr, bound| async move {
        PostgresBackend::connect(
            &format!("postgres://u:p@{addr}/db"),
            SqlOptions::new().acquire_timeout(bound),
        )
        .await
    })
    .await;
}

/// The fenced write of docs/fencing.md on a real PostgreSQL table: tokens bind and decode
/// as `BIGINT` (lockcore's `sqlx` feature), the holder's `UPDATE … WHERE fence <= $1`
/// succeeds, and the same write by a holder whose lock was taken over changes nothing,
/// which `check_write` turns into `StaleToken`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_update_rejects_a_stale_token() {
    let table = format!("locks_{}", common::random_suffix());
    let invoices = format!("invoices_{}", common::random_suffix());
    let backend = backend(&table).await;
    let locks = LockClient::new(backend.clone());
    // The application's own pool and table.
    let pool = sqlx::PgPool::connect(&url()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {invoices} (id BIGINT PRIMARY KEY, total BIGINT NOT NULL, \
         fence BIGINT NOT NULL DEFAULT 0)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {invoices} (id, total) VALUES (42, 0)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let write =
        format!("UPDATE {invoices} SET total = $2, fence = $1 WHERE id = 42 AND fence <= $1");
    let fenced_write = |token: FencingToken, total: i64| {
        let (pool, write) = (pool.clone(), write.clone());
        async move {
            let done = sqlx::query(sqlx::AssertSqlSafe(write))
                .bind(token)
                .bind(total)
                .execute(&pool)
                .await
                .unwrap();
            token.check_write(done.rows_affected())
        }
    };

    let old = locks
        .lock("invoice:42")
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let old_token = old.token();
    assert_eq!(fenced_write(old_token, 100).await, Ok(1));
    // The old holder stalls; the lock is broken and taken by someone else.
    assert_eq!(
        locks.force_release("invoice:42").await.unwrap(),
        ReleaseOutcome::Released
    );
    let new = locks
        .lock("invoice:42")
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(new.token() > old_token);
    assert_eq!(fenced_write(new.token(), 200).await, Ok(1));
    // The same holder may write again with its token.
    assert_eq!(fenced_write(new.token(), 250).await, Ok(1));
    // The stalled holder wakes up and writes: refused.
    let stale = fenced_write(old_token, 999).await.unwrap_err();
    assert_eq!(stale.presented, old_token);
    println!("{stale}");
    let (total, fence): (i64, FencingToken) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT total, fence FROM {invoices} WHERE id = 42"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((total, fence), (250, new.token()));
    new.release().await.unwrap();
    drop(old);
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {invoices}")))
        .execute(&pool)
        .await
        .unwrap();
}
