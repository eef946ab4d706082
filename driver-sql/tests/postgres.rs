//! PostgreSQL: the whole conformance suite (shared server from `DISTLOCK_TEST_POSTGRES_URL`,
//! fault scenarios on servers of their own), the contract checks, NOTIFY hand-off, and a
//! holder's connection killed on the server.
#![cfg(feature = "postgres")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::harness::{self, options, two_backends, ServerDb, ServerHarness};
use common::servers::OwnServer;
use common::{scenarios, server_scenarios, slow_open};
use distlock_sql::postgres::{PostgresBackend, POSTGRES_CAPABILITIES};
use distlock_sql::SqlOptions;
use lockcore::driver::{AcquireOutcome, Contention, ExtendOutcome, LockBackendExt};
use lockcore::{
    Claim, FencingToken, LockBackend, LockClient, LockError, LockKey, Owner, ReleaseOutcome,
};

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

    async fn connect_in_zone(
        url: &str,
        minutes: i32,
        options: SqlOptions,
    ) -> Result<Arc<dyn LockBackend>, LockError> {
        let pool = zone_pool(url, minutes)
            .await
            .map_err(|e| LockError::unavailable("postgres", e))?;
        Ok(PostgresBackend::from_pool(pool, options).await?)
    }

    async fn set_time_zone(url: &str, minutes: i32) -> Result<(), LockError> {
        use sqlx::Connection;
        let unavailable = |e: sqlx::Error| LockError::unavailable("postgres", e);
        // A POSIX zone name: its offset counts west of UTC, hence the inverted sign.
        let (sign, h, m) = harness::utc_offset(minutes);
        let west = if sign == '-' { '+' } else { '-' };
        let zone = format!("<{sign}{h:02}{m:02}>{west}{h:02}:{m:02}");
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .map_err(unavailable)?;
        // The database's default, for sessions that do not set their own (sqlx's do: see
        // `zone_pool`).
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE postgres SET timezone = '{zone}'"
        )))
        .execute(&mut conn)
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    async fn rewrite_row(
        url: &str,
        key: &lockcore::LockKey,
        owner: Option<[u8; 16]>,
    ) -> Result<(), LockError> {
        use sqlx::Connection;
        let unavailable = |e: sqlx::Error| LockError::unavailable("postgres", e);
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .map_err(unavailable)?;
        sqlx::query("UPDATE distlock_locks SET owner = COALESCE($1, owner), label = label WHERE lock_key = $2")
            .bind(owner.map(Vec::from))
            .bind(key.as_str().as_bytes())
            .execute(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn delete_rows(url: &str, key: Option<&lockcore::LockKey>) -> Result<(), LockError> {
        use sqlx::Connection;
        let unavailable = |e: sqlx::Error| LockError::unavailable("postgres", e);
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .map_err(unavailable)?;
        for table in ["distlock_locks", "distlock_locks_leases"] {
            let query = match key {
                Some(key) => sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DELETE FROM {table} WHERE lock_key = $1"
                )))
                .bind(key.as_str().as_bytes()),
                None => sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table}"))),
            };
            query.execute(&mut conn).await.map_err(unavailable)?;
        }
        Ok(())
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
    faults: true,
    shared: true,
    semaphores: true,
    fair: bounded,
    harness: || async { ServerHarness::<Pg>::new() },
);

/// Bounded fairness of the default layout: marks for long waits.
mod marks {
    use super::*;

    common::marks::marks_tests!(async {
        let (a, b) = harness::two_backends::<Pg>().await;
        ((), a, b)
    });
}

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
    // A missed NOTIFY leaves the waiter asleep for its whole 10 s wait; a loaded machine
    // can delay a delivered one by a few hundred milliseconds.
    let notified = Duration::from_secs(1);
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
async fn a_restart_breaks_no_operation_after_it() {
    server_scenarios::a_restart_breaks_no_operation_after_it::<Pg>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_outlives_sessions_slower_to_open_than_a_renewal_may_wait() {
    slow_open::a_hold_outlives_sessions_slower_to_open_than_a_renewal_may_wait::<Pg>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opened_for_an_operation_that_gave_up_goes_to_the_next() {
    slow_open::a_session_opened_for_an_operation_that_gave_up_goes_to_the_next::<Pg>().await;
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

/// A table made by a development build (schema stamps 1 to 8 in `<table>_schema`), holding a
/// lock, is refused with one line saying what to do, and nothing in it changes: no table,
/// function or stamp is added, the lock and the stamp stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_development_table_is_refused_and_left_as_it_is() {
    let t = format!("locks_{}", common::random_suffix());
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
        format!(
            "INSERT INTO {t} VALUES ('held', '\\x01010101010101010101010101010101', 'old', 5, \
             now() + interval '1 hour')"
        ),
    ] {
        run_sql(&pool, statement).await;
    }
    // Everything named after the table (relations, functions), its lock and its stamp.
    let what_is_there = || {
        let (pool, t) = (&pool, &t);
        async move {
            sqlx::query_as::<_, (String, String, i64)>(sqlx::AssertSqlSafe(format!(
                "SELECT (SELECT string_agg(relname::text, ',' ORDER BY relname) FROM pg_class \
                   WHERE starts_with(relname::text, $1)) \
                   || ';' || COALESCE((SELECT string_agg(proname::text, ',' ORDER BY proname) \
                   FROM pg_proc WHERE starts_with(proname::text, $1)), ''), \
                 (SELECT label || ' ' || fence FROM {t}), \
                 (SELECT version FROM {t}_schema)"
            )))
            .bind(t)
            .fetch_one(pool)
            .await
            .unwrap()
        }
    };
    for stamp in common::DEVELOPMENT_STAMPS {
        run_sql(&pool, format!("UPDATE {t}_schema SET version = {stamp}")).await;
        let before = what_is_there().await;
        let err = PostgresBackend::connect(&url(), options(&t))
            .await
            .unwrap_err();
        common::assert_refused_as_development(&err, &t, stamp);
        assert_eq!(what_is_there().await, before, "stamp {stamp}");
    }
    assert_eq!(what_is_there().await.1, "old 5");
}

/// Runs `statement` (test SQL splicing only a generated table name) on `pool`.
async fn run_sql(pool: &sqlx::PgPool, statement: String) {
    sqlx::query(sqlx::AssertSqlSafe(statement))
        .execute(pool)
        .await
        .unwrap();
}

/// The claim, lease release and lease renewal each run as one call of the table's plpgsql
/// functions, never falling back to the transaction: every decision a
/// claim can make is driven through the backend, with the functions wrapped to count their
/// calls (so a silent fall-back to the transaction path fails the test), and the exclusive
/// grant and the same-owner re-grant of an exclusive holder, which the backend takes by its
/// exclusive statement, by calling the function itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_claims_take_one_call() {
    use lockcore::driver::{AcquireOutcome, ExtendOutcome, READ_WRITE_CAPACITY};
    use lockcore::{Claim, LockKey, Owner};

    let t = format!("locks_{}", common::random_suffix());
    let pool = sqlx::PgPool::connect(&url()).await.unwrap();
    // The first backend creates the table and its functions.
    drop(backend(&t).await);
    // Wrap each function: the wrapper records the call, then calls the original.
    run_sql(&pool, format!("CREATE TABLE {t}_seen (name TEXT NOT NULL)")).await;
    let wrapped = [
        (
            "claim",
            "p_key bytea, p_owner bytea, p_label text, p_weight bigint, p_ttl bigint, \
             p_capacity bigint",
            "TABLE (kind bigint, token bigint, remaining bigint, by_reservation bigint, \
             revision bigint)",
            "SELECT * FROM {inner}(p_key, p_owner, p_label, p_weight, p_ttl, p_capacity)",
        ),
        (
            "release_lease",
            "p_key bytea, p_owner bytea",
            "bigint",
            "SELECT {inner}(p_key, p_owner)",
        ),
        (
            "extend_lease",
            "p_key bytea, p_owner bytea, p_ttl bigint",
            "bigint",
            "SELECT {inner}(p_key, p_owner, p_ttl)",
        ),
    ];
    for (name, args, returns, body) in wrapped {
        let inner = format!("{t}_{name}_inner");
        let types: Vec<&str> = args
            .split(',')
            .filter_map(|a| a.split_whitespace().nth(1))
            .collect();
        run_sql(
            &pool,
            format!(
                "ALTER FUNCTION {t}_{name}({}) RENAME TO {inner}",
                types.join(", ")
            ),
        )
        .await;
        run_sql(
            &pool,
            format!(
                "CREATE FUNCTION {t}_{name}({args}) RETURNS {returns} LANGUAGE sql VOLATILE AS \
                 $fn$ INSERT INTO {t}_seen VALUES ('{name}'); {} $fn$",
                body.replace("{inner}", &inner)
            ),
        )
        .await;
    }
    let seen = |name: &'static str| {
        let pool = pool.clone();
        let t = t.clone();
        async move {
            let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {t}_seen WHERE name = $1"
            )))
            .bind(name)
            .fetch_one(&pool)
            .await
            .unwrap();
            n
        }
    };
    // A second backend: its connections prepare the statements against the wrappers.
    let b: Arc<dyn LockBackend> = backend(&t).await;
    let k = common::key("one-call");
    let ttl = Duration::from_secs(30);
    let (r1, r2, w) = (Owner::new("r1"), Owner::new("r2"), Owner::new("w"));
    let claim = |o: &Owner, c: Claim| {
        let (b, k, o) = (b.clone(), k.clone(), o.clone());
        async move { b.try_claim(&k, &o, ttl, c).await }
    };
    let granted = |o: Result<AcquireOutcome, LockError>| match o.unwrap() {
        AcquireOutcome::Acquired(g) => g.token,
        AcquireOutcome::Held(c) => panic!("expected a grant, got {c:?}"),
    };
    // A free key's one lease goes inline in its row: renewed by a
    // re-claim (same token) and by the exclusive statement, no lease function.
    let r3 = Owner::new("r3");
    let t1 = granted(claim(&r1, Claim::shared()).await);
    assert_eq!(granted(claim(&r1, Claim::shared()).await), t1);
    match b.extend(&k, &r1, ttl).await.unwrap() {
        ExtendOutcome::Extended(g) => assert_eq!(g.token, t1),
        other => panic!("{other:?}"),
    }
    assert_eq!(seen("extend_lease").await, 0);
    // A second reader: the first one's lease moves to the leases table, token and all.
    let t2 = granted(claim(&r2, Claim::shared()).await);
    assert!(t2 > t1);
    let shown: Vec<_> = (b.holders(&k).await.unwrap().into_iter())
        .map(|i| i.token)
        .collect();
    assert_eq!(shown, [t1, t2], "both leases, in grant order");
    // A writer is refused behind the leases and reserves: a revision to wait from.
    let AcquireOutcome::Held(c) = claim(&w, Claim::exclusive()).await.unwrap() else {
        panic!("a writer behind readers was granted");
    };
    assert!(
        c.hint.revision().is_some() && !c.hint.is_behind_reservation(),
        "{c:?}"
    );
    assert!(
        c.remaining_ttl.is_some_and(|r| r > Duration::from_secs(25)),
        "{c:?}"
    );
    // Another reader is held back by the writer's reservation only.
    let AcquireOutcome::Held(c) = claim(&r3, Claim::shared()).await.unwrap() else {
        panic!("a reader went past a writer's reservation");
    };
    assert!(c.hint.is_behind_reservation(), "{c:?}");
    // A semaphore on a read-write key.
    let sem = Claim::permits(1, 4).unwrap();
    let e = claim(&r3, sem).await.unwrap_err();
    let mismatch = LockError::capacity_mismatch(&k, READ_WRITE_CAPACITY, &sem);
    assert_eq!(e.to_string(), mismatch.to_string());
    assert_eq!(seen("claim").await, 6);
    // Renew the leases: their tokens; a renewal by an owner without one: not held.
    for (owner, token) in [(&r1, t1), (&r2, t2)] {
        match b.extend(&k, owner, ttl).await.unwrap() {
            ExtendOutcome::Extended(g) => assert_eq!(g.token, token),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        b.extend(&k, &r3, ttl).await.unwrap(),
        ExtendOutcome::NotHeld
    );
    assert_eq!(seen("extend_lease").await, 3);
    // Release the leases, one of them twice: not held.
    assert_eq!(b.release(&k, &r1).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(b.release(&k, &r1).await.unwrap(), ReleaseOutcome::NotHeld);
    assert_eq!(b.release(&k, &r2).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(seen("release_lease").await, 3);
    // The writer's claim now passes its own reservation (by its one statement).
    let tw = granted(claim(&w, Claim::exclusive()).await);
    assert!(tw > t2);
    // The function itself: a same-owner claim of the exclusive holder renews the row (1),
    // and an exclusive claim on a free key is granted the whole key (3).
    let call = |key: LockKey, owner: Owner, weight: u64| {
        let (pool, t) = (pool.clone(), t.clone());
        async move {
            let row: (i64, i64, i64, i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT * FROM {t}_claim($1, $2, 'label', $3, 30000000, $4)"
            )))
            .bind(key.as_bytes())
            .bind(owner.token().as_bytes().as_slice())
            .bind(i64::try_from(weight).unwrap())
            .bind(i64::try_from(READ_WRITE_CAPACITY).unwrap())
            .fetch_one(&pool)
            .await
            .unwrap();
            row
        }
    };
    let again = call(k.clone(), w.clone(), 1).await;
    assert_eq!((again.0, again.1), (1, i64::try_from(tw.get()).unwrap()));
    let free = common::key("one-call-free");
    let x = Owner::new("x");
    let grant = call(free.clone(), x.clone(), READ_WRITE_CAPACITY).await;
    assert_eq!(grant.0, 3);
    let info = b.inspect(&free).await.unwrap().unwrap();
    assert_eq!(info.holder, "label");
    assert_eq!(i64::try_from(info.token.get()).unwrap(), grant.1);
    assert_eq!(
        b.release(&free, &x).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A pool whose sessions are in a time zone `minutes` east of UTC: set after connecting,
/// since sqlx sends `TimeZone=UTC` at connect, which neither the server's zone nor an
/// `options` URL parameter overrides.
async fn zone_pool(url: &str, minutes: i32) -> Result<sqlx::PgPool, sqlx::Error> {
    use sqlx::Executor;
    // A POSIX zone name: its offset counts west of UTC, hence the inverted sign.
    let (sign, h, m) = harness::utc_offset(minutes);
    let west = if sign == '-' { '+' } else { '-' };
    let set = format!("SET TIME ZONE '<{sign}{h:02}{m:02}>{west}{h:02}:{m:02}'");
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .after_connect(move |conn, _| {
            let set = set.clone();
            Box::pin(async move {
                conn.execute(sqlx::AssertSqlSafe(set)).await?;
                Ok(())
            })
        })
        .connect(url)
        .await
}

/// The fault store's time-zone hook reaches the sessions a client opens.
#[tokio::test]
async fn time_zone_hook_reaches_sessions() {
    for (minutes, zone) in [(345, "<+0545>-05:45"), (-570, "<-0930>+09:30")] {
        let pool = zone_pool(&url(), minutes).await.unwrap();
        let shown: String = sqlx::query_scalar("SELECT current_setting('timezone')")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(shown, zone);
    }
}

/// A lock row restored from an old backup, its fence rewound far below the tokens handed out
/// since, still gives the next holder a token above every earlier one: the acquiring
/// statement floors the token with the database's clock (`max(fence + 1, now_us)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewound_fence_is_floored_by_the_clock() {
    let table = format!("locks_{}", common::random_suffix());
    let b = backend(&table).await;
    let (k, o) = (
        lockcore::LockKey::new("rewound").unwrap(),
        lockcore::Owner::new("o"),
    );
    let ttl = Duration::from_secs(30);
    let token = |outcome| match outcome {
        lockcore::driver::AcquireOutcome::Acquired(g) => g.token,
        other => panic!("a free key was not granted: {other:?}"),
    };
    let first = token(b.try_acquire(&k, &o, ttl).await.unwrap());
    assert_eq!(b.release(&k, &o).await.unwrap(), ReleaseOutcome::Released);
    sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE {table} SET fence = 1")))
        .execute(b.pool())
        .await
        .unwrap();
    let second = token(b.try_acquire(&k, &o, ttl).await.unwrap());
    assert!(
        second > first,
        "after the fence was rewound the token went from {first:?} to {second:?}"
    );
}

/// Reader `r1` (on `a`) holds `k`, writer `w` (on `b`) is refused and reserves it, `r1`
/// releases: reader `r2` (on `a`) is then refused by the reservation alone, marked so. Its
/// refusal.
async fn held_back_by_a_writer(
    a: &Arc<dyn LockBackend>,
    b: &Arc<dyn LockBackend>,
    k: &LockKey,
    [r1, r2, w]: [&Owner; 3],
) -> Contention {
    let (ttl, shared) = (Duration::from_secs(30), Claim::shared());
    assert!(matches!(
        a.try_claim(k, r1, ttl, shared).await.unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    assert!(matches!(
        b.try_acquire(k, w, ttl).await.unwrap(),
        AcquireOutcome::Held(_)
    ));
    assert_eq!(a.release(k, r1).await.unwrap(), ReleaseOutcome::Released);
    let AcquireOutcome::Held(c) = a.try_claim(k, r2, ttl, shared).await.unwrap() else {
        panic!("a reader went past a writer's reservation");
    };
    assert!(c.hint.is_behind_reservation(), "{c:?}");
    c
}

/// A reader held back only by a writer's reservation, on a key no lease holds any more,
/// waits for the writer (its grant, or the reservation's removal, which a NOTIFY
/// announces) instead of returning at once to be refused again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_behind_a_reservation_outlasts_a_free_key() {
    let (a, b) = two_backends::<Pg>().await;
    let k = common::key("reserved-free");
    let ttl = Duration::from_secs(30);
    let (r1, r2, w) = (Owner::new("r1"), Owner::new("r2"), Owner::new("w"));
    let shared = Claim::shared();
    let c = held_back_by_a_writer(&a, &b, &k, [&r1, &r2, &w]).await;
    // Until the backend's LISTEN session is up, a wait re-checks every 100 ms; once it is,
    // the wait lasts its whole bound.
    let quiet = Duration::from_millis(400);
    let mut ended = Vec::new();
    loop {
        let started = Instant::now();
        a.wait_released(&k, &c.hint, u64::MAX, quiet).await.unwrap();
        let waited = started.elapsed();
        if waited >= quiet - Duration::from_millis(50) {
            break;
        }
        ended.push(waited);
        assert!(
            ended.len() < 20,
            "every wait ended early on a key free but reserved: {ended:?}"
        );
    }
    // The writer gives up: the announced removal ends the wait.
    let waiting = {
        let (a, k, hint) = (a.clone(), k.clone(), c.hint.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            a.wait_released(&k, &hint, u64::MAX, Duration::from_secs(10))
                .await
                .unwrap();
            started.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    b.abandon(&k, &w).await.unwrap();
    let waited = waiting.await.unwrap();
    assert!(waited < Duration::from_secs(5), "woken after {waited:?}");
    assert!(matches!(
        a.try_claim(&k, &r2, ttl, shared).await.unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    a.release(&k, &r2).await.unwrap();

    // What a wait would have slept through, had it begun a moment later: the writer was
    // granted and released, or gave up, before the held-back reader subscribed. Its wait
    // ends at once (the NOTIFY it missed is not waited for).
    for gives_up in [false, true] {
        let c = held_back_by_a_writer(&a, &b, &k, [&r1, &r2, &w]).await;
        if gives_up {
            b.abandon(&k, &w).await.unwrap();
        } else {
            assert!(matches!(
                b.try_acquire(&k, &w, ttl).await.unwrap(),
                AcquireOutcome::Acquired(_)
            ));
            assert_eq!(b.release(&k, &w).await.unwrap(), ReleaseOutcome::Released);
        }
        let started = Instant::now();
        a.wait_released(&k, &c.hint, u64::MAX, Duration::from_secs(10))
            .await
            .unwrap();
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_secs(5),
            "the wait began after the writer {} and lasted {waited:?}",
            if gives_up { "gave up" } else { "came and went" }
        );
    }
}

/// Statistics taken while every row of the table had expired (autoanalyze after a release
/// of everything) estimate one live row. Once the rows are held again, a batch renewal of
/// 1,024 holds must still find its rows by the primary key: planned by those statistics
/// alone it compared every held row with every batch row (20 s per batch at 100,000 rows;
/// every pool connection stuck in one, every hold lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_renewal_uses_the_key_after_statistics_of_expired_rows() {
    let table = format!("locks_{}", common::random_suffix());
    let b = backend(&table).await;
    run_sql(
        b.pool(),
        format!(
            "INSERT INTO {table} (lock_key, owner, label, fence, expires_at) \
             SELECT convert_to('expired-' || g, 'UTF8'), '\\x00'::bytea, 'gone', g, \
             now() - interval '1 hour' FROM generate_series(1, 60000) g"
        ),
    )
    .await;
    run_sql(
        b.pool(),
        format!("ALTER TABLE {table} SET (autovacuum_enabled = false)"),
    )
    .await;
    run_sql(b.pool(), format!("ANALYZE {table}")).await;
    // Held again (by another owner) since the statistics were taken.
    run_sql(
        b.pool(),
        format!("UPDATE {table} SET expires_at = now() + interval '1 hour'"),
    )
    .await;
    let client = LockClient::new(b.clone());
    let owner = client.new_owner();
    let ttl = Duration::from_secs(60);
    let mut guards = Vec::new();
    for i in 0..lockcore::driver::RENEWAL_BATCH {
        let lock = client
            .lock(format!("held-{i}"))
            .owner(owner.clone())
            .ttl(ttl);
        guards.push(lock.acquire().await.unwrap());
    }
    let keys: Vec<LockKey> = (0..lockcore::driver::RENEWAL_BATCH)
        .map(|i| LockKey::new(format!("held-{i}")).unwrap())
        .collect();
    let renewals: Vec<lockcore::driver::Renewal<'_>> = keys
        .iter()
        .map(|k| lockcore::driver::Renewal::new(k, &owner, ttl))
        .collect();
    let started = Instant::now();
    let answers = b.renew(&renewals).await.unwrap();
    let took = started.elapsed();
    for (i, answer) in answers.iter().enumerate() {
        assert!(
            matches!(answer, Ok(ExtendOutcome::Extended(g)) if g.token == guards[i].token()),
            "renewal {i}: {answer:?}"
        );
    }
    assert!(
        took < Duration::from_secs(2),
        "a batch of {} renewals took {took:?}",
        renewals.len()
    );
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Another session's open transaction holding `key`'s row in `table` (`SELECT … FOR
/// UPDATE`): what keeps a batch renewing it waiting.
async fn row_locked(table: &str, key: &LockKey) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let pool = sqlx::PgPool::connect(&url()).await.unwrap();
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM {table} WHERE lock_key = $1 FOR UPDATE"
    )))
    .bind(key.as_bytes())
    .execute(&mut *blocker)
    .await
    .unwrap();
    blocker
}

/// A batch renewal stuck on the server (behind another session's row lock: a bad plan
/// holds its connection just as long) is ended by the server within the time the watchdog
/// allows it, and the one batch connection serves the next batch at once: at a TTL of
/// 20 s by the batch connections' own 1 s limit (one round trip), at 2 s by the 200 ms
/// the batch sets in its transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_batch_renewal_is_ended_by_the_server() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let table = format!("locks_{}", common::random_suffix());
        let b = PostgresBackend::connect(&url(), options(&table).max_connections(1))
            .await
            .unwrap();
        let owner = Owner::new("renewer");
        let keys = common::limits::hold(&*b, &owner, 4).await;
        for ttl in [Duration::from_secs(20), Duration::from_secs(2)] {
            let blocker = row_locked(&table, &keys[0]).await;
            common::limits::stuck_batch_is_ended_by_the_server(
                b.clone(),
                &owner,
                &keys,
                ttl,
                blocker,
            )
            .await;
        }
        common::limits::release(&*b, &owner, &keys).await;
    })
    .await
    .expect("the test's own time bound");
}

/// Over an application's pool, whose sessions the backend does not know, a stuck batch
/// renewal is ended by the limit it sets in its transaction, and the pool's one
/// connection serves the next batch at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_batch_renewal_over_an_application_pool_is_ended_by_the_server() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let table = format!("locks_{}", common::random_suffix());
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect(&url())
            .await
            .unwrap();
        let b = PostgresBackend::from_pool(pool, options(&table).keep_connections(1))
            .await
            .unwrap();
        let owner = Owner::new("renewer");
        let keys = common::limits::hold(&*b, &owner, 4).await;
        let blocker = row_locked(&table, &keys[0]).await;
        let ttl = Duration::from_secs(2);
        common::limits::stuck_batch_is_ended_by_the_server(b.clone(), &owner, &keys, ttl, blocker)
            .await;
        common::limits::release(&*b, &owner, &keys).await;
    })
    .await
    .expect("the test's own time bound");
}

/// A key last held by an inline lease, then granted exclusively by a write that leaves the
/// lease columns as they were (as the exclusive statement does): readers stay out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_inline_lease_is_no_lease() {
    let t = format!("locks_{}", common::random_suffix());
    let b = backend(&t).await;
    let pool = sqlx::PgPool::connect(&url()).await.unwrap();
    common::claims::stale_inline_lease_is_no_lease(b, |k| async move {
        // An exclusive grant on a free row that leaves the lease columns alone.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET owner = '\\xabababababababababababababababab'::bytea, \
             label = 'old writer', fence = fence + 1, capacity = {}, \
             expires_at = statement_timestamp() + interval '20 seconds' WHERE lock_key = $1",
            lockcore::driver::READ_WRITE_CAPACITY
        )))
        .bind(k.as_bytes())
        .execute(&pool)
        .await
        .unwrap();
    })
    .await;
}

/// Locks inside a transaction, on a fresh lock table and a fresh accounts table.
struct PgTx {
    backend: Arc<PostgresBackend>,
    table: String,
    accounts: String,
}

#[async_trait]
impl common::transaction::TxDb for PgTx {
    type Tx = sqlx::Transaction<'static, sqlx::Postgres>;
    const SHOWS_HOLD: bool = true;

    async fn start() -> Self {
        let table = format!("locks_{}", common::random_suffix());
        let backend = PostgresBackend::connect(&url(), options(&table))
            .await
            .unwrap();
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
        PgTx {
            backend,
            table,
            accounts,
        }
    }

    async fn client(&self) -> LockClient {
        LockClient::new(backend(&self.table).await)
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
            "UPDATE {} SET balance = balance + $1, fence = $2 WHERE id = $3 AND fence <= $2",
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
        let read = format!("SELECT balance FROM {} WHERE id = $1", self.accounts);
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

transaction_tests!(PgTx);
