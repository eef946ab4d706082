//! PostgreSQL: the whole conformance suite (shared server from `DISTLOCK_TEST_POSTGRES_URL`,
//! fault scenarios on servers of their own), the contract checks, NOTIFY hand-off, and a
//! holder's connection killed on the server.
#![cfg(feature = "postgres")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::harness::{self, options, two_backends, ServerDb, ServerHarness};
use common::servers::OwnServer;
use common::{scenarios, server_scenarios};
use driver_sql::postgres::{PostgresBackend, POSTGRES_CAPABILITIES};
use driver_sql::SqlOptions;
use lockcore::{FencingToken, LockBackend, LockClient, LockError, ReleaseOutcome};

/// PostgreSQL for the scenarios shared with MySQL.
struct Pg;

#[async_trait]
impl ServerDb for Pg {
    const NAME: &'static str = "postgres";
    const OTHER_SCHEME: &'static str = "postgresql";
    const URL_VAR: &'static str = "DISTLOCK_TEST_POSTGRES_URL";
    type Database = sqlx::Postgres;

    async fn connect(url: &str, options: SqlOptions) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(PostgresBackend::connect(url, options).await?)
    }

    async fn from_pool(
        pool: sqlx::Pool<sqlx::Postgres>,
        options: SqlOptions,
    ) -> Arc<dyn LockBackend> {
        PostgresBackend::from_pool(pool, options).await.unwrap()
    }

    async fn own_server() -> OwnServer {
        OwnServer::postgres().await
    }
}

fn url() -> String {
    Pg::url()
}

async fn backend(table: &str) -> Arc<PostgresBackend> {
    PostgresBackend::connect(&url(), options(table))
        .await
        .unwrap()
}

conformance_tests::suite!(
    in_tree conformance,
    capabilities: POSTGRES_CAPABILITIES,
    notifications: true,
    faults: true,
    shared: true,
    semaphores: true,
    harness: || async { ServerHarness::<Pg>::new() },
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_matches_memory_backend() {
    let (a, b) = two_backends::<Pg>().await;
    scenarios::contract_matches_memory_backend(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_increase() {
    let (a, b) = two_backends::<Pg>().await;
    scenarios::tokens_increase(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_keys_stay_apart() {
    let (a, b) = two_backends::<Pg>().await;
    scenarios::hostile_keys_stay_apart(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_are_woken_by_notify() {
    let (a, b) = two_backends::<Pg>().await;
    let notified = Duration::from_millis(200);
    scenarios::waiters_are_woken(a, b, notified, "other backend's waiter woken").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_backends_exclude_each_other() {
    let table = format!("locks_{}", common::random_suffix());
    scenarios::several_backends_exclude_each_other(|| harness::backend::<Pg>(&table)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_names_with_sql_are_rejected() {
    server_scenarios::table_names_with_sql_are_rejected::<Pg>().await;
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

/// Terminates, through `via`, the server's sessions of the application named `app`; one
/// answer per session.
async fn terminate(app: &str, via: &PostgresBackend) -> Vec<bool> {
    sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(app)
    .fetch_all(via.pool())
    .await
    .unwrap()
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
    let kill = || async {
        let killed = terminate(&app, &other).await;
        assert!(!killed.is_empty(), "no connection of the holder found");
    };
    server_scenarios::killed_connection_keeps_the_lock_correct(holder, other.clone(), kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stopped_database_is_unavailable_then_recovers() {
    server_scenarios::stopped_database_is_unavailable_then_recovers::<Pg>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_deletes_released_rows() {
    let table = format!("locks_{}", common::random_suffix());
    let b = PostgresBackend::connect(&url(), options(&table).gc_grace(Duration::ZERO))
        .await
        .unwrap();
    let count_rows = || async {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(b.pool())
            .await
            .unwrap()
    };
    scenarios::garbage_collection_deletes_released_rows(b.clone(), count_rows).await;
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
    let killed = terminate(&app, &admin).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_options_pass_through_the_url() {
    server_scenarios::tls_options_pass_through_the_url::<Pg>("sslmode=disable", "sslmode=require")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_connections_skip_the_pool() {
    common::kept::skip_the_pool::<Pg>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_kept_connection_serves_concurrent_operations() {
    common::kept::serve_concurrent_operations::<Pg>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_kept_connection_returns_to_the_pool() {
    common::kept::idle_connection_returns::<Pg>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_kept_connections() {
    server_scenarios::shutdown_returns_kept_connections::<Pg>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connection_is_reported_at_once() {
    server_scenarios::refused_connection_is_reported_at_once::<Pg>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stopped_database_is_reported_at_once() {
    server_scenarios::stopped_database_is_reported_at_once::<Pg>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_server_names_the_time_bound() {
    server_scenarios::silent_server_names_the_time_bound::<Pg>().await;
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

claim_tests!(async {
    let (a, b) = two_backends::<Pg>().await;
    (a, b, ())
});

/// A table of schema version 1 (before shared claims), holding a lock, is upgraded in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_1_table_is_upgraded() {
    let t = format!("locks_{}", common::random_suffix());
    let held = common::key("held");
    let pool = sqlx::PgPool::connect(&url()).await.unwrap();
    for statement in [
        format!(
            "CREATE TABLE {t} (lock_key BYTEA NOT NULL PRIMARY KEY, owner BYTEA NOT NULL, \
             label TEXT NOT NULL, fence BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL)"
        ),
        format!(
            "CREATE TABLE {t}_schema (id INTEGER NOT NULL PRIMARY KEY, version BIGINT NOT NULL)"
        ),
        format!("INSERT INTO {t}_schema (id, version) VALUES (1, 1)"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&pool)
            .await
            .unwrap();
    }
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {t} VALUES ($1, $2, 'old', 5, now() + interval '1 hour')"
    )))
    .bind(held.as_bytes())
    .bind([1u8; 16].as_slice())
    .execute(&pool)
    .await
    .unwrap();
    let b: Arc<dyn LockBackend> = backend(&t).await;
    common::claims::upgraded_table_keeps_its_locks(b, &held).await;
    let version: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT version FROM {t}_schema"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(version, driver_sql::SCHEMA_VERSION);
    // Opening it again (already upgraded) changes nothing.
    let again: Arc<dyn LockBackend> = backend(&t).await;
    assert_eq!(again.inspect(&held).await.unwrap().unwrap().holder, "old");
}
