//! MySQL/MariaDB: the whole conformance suite (shared server from `DISTLOCK_TEST_MYSQL_URL`,
//! fault scenarios on MariaDB servers of their own), the contract checks, byte-exact keys,
//! polling hand-off, and a holder's connection killed on the server.
#![cfg(feature = "mysql")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::harness::{self, options, two_backends, ServerDb, ServerHarness};
use common::servers::OwnServer;
use common::{scenarios, server_scenarios, slow_open};
use distlock_sql::mysql::{MySqlBackend, MYSQL_CAPABILITIES};
use distlock_sql::SqlOptions;
use lockcore::driver::{AcquireOutcome, LockBackendExt};
use lockcore::{FencingToken, LockBackend, LockClient, LockError, Owner, ReleaseOutcome};

/// MySQL/MariaDB for the scenarios shared with PostgreSQL.
struct My;

#[async_trait]
impl ServerDb for My {
    const NAME: &'static str = "mysql";
    const OTHER_SCHEME: &'static str = "mariadb";
    const URL_VAR: &'static str = "DISTLOCK_TEST_MYSQL_URL";
    type Database = sqlx::MySql;

    async fn connect(url: &str, options: SqlOptions) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(MySqlBackend::connect(url, options).await?)
    }

    async fn from_pool(pool: sqlx::Pool<sqlx::MySql>, options: SqlOptions) -> Arc<dyn LockBackend> {
        MySqlBackend::from_pool(pool, options).await.unwrap()
    }

    async fn own_server() -> OwnServer {
        OwnServer::mariadb().await
    }

    async fn connect_in_zone(
        url: &str,
        minutes: i32,
        options: SqlOptions,
    ) -> Result<Arc<dyn LockBackend>, LockError> {
        Self::connect(&format!("{url}?{}", time_zone_option(minutes)), options).await
    }

    async fn set_time_zone(url: &str, minutes: i32) -> Result<(), LockError> {
        use sqlx::Connection;
        let unavailable = |e: sqlx::Error| LockError::unavailable("mysql", e);
        let (sign, h, m) = harness::utc_offset(minutes);
        let mut conn = sqlx::MySqlConnection::connect(url)
            .await
            .map_err(unavailable)?;
        sqlx::query("SET GLOBAL time_zone = ?")
            .bind(format!("{sign}{h:02}:{m:02}"))
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
        let unavailable = |e: sqlx::Error| LockError::unavailable("mysql", e);
        let mut conn = sqlx::MySqlConnection::connect(url)
            .await
            .map_err(unavailable)?;
        sqlx::query("UPDATE distlock_locks SET owner = COALESCE(?, owner), label = label WHERE lock_key = ?")
            .bind(owner.map(Vec::from))
            .bind(key.as_str().as_bytes())
            .execute(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn delete_rows(url: &str, key: Option<&lockcore::LockKey>) -> Result<(), LockError> {
        use sqlx::Connection;
        let unavailable = |e: sqlx::Error| LockError::unavailable("mysql", e);
        let mut conn = sqlx::MySqlConnection::connect(url)
            .await
            .map_err(unavailable)?;
        for table in ["distlock_locks", "distlock_locks_leases"] {
            let query = match key {
                Some(key) => sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DELETE FROM {table} WHERE lock_key = ?"
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
    My::url()
}

async fn backend(table: &str) -> Arc<MySqlBackend> {
    MySqlBackend::connect(&url(), options(table)).await.unwrap()
}

conformance_tests::suite!(
    in_tree conformance,
    capabilities: MYSQL_CAPABILITIES,
    faults: true,
    shared: true,
    semaphores: true,
    fair: bounded,
    harness: || async { ServerHarness::<My>::new() },
);

/// Bounded fairness of the default layout: marks for long waits.
mod marks {
    use super::*;

    common::marks::marks_tests!(async {
        let (a, b) = harness::two_backends::<My>().await;
        ((), a, b)
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_matches_memory_backend() {
    let (a, b) = two_backends::<My>().await;
    scenarios::contract_matches_memory_backend(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_increase() {
    let (a, b) = two_backends::<My>().await;
    scenarios::tokens_increase(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_keys_stay_apart() {
    let (a, b) = two_backends::<My>().await;
    scenarios::hostile_keys_stay_apart(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_are_woken() {
    let (a, b) = two_backends::<My>().await;
    let polled = Duration::from_millis(600);
    scenarios::waiters_are_woken(a, b, polled, "polling noticed the release").await;
}

/// MySQL's default collations would make `A`, `a` and `a ` one key; the table must not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_and_trailing_space_keys_stay_distinct() {
    let (a, b) = two_backends::<My>().await;
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
    scenarios::several_backends_exclude_each_other(|| harness::backend::<My>(&table)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_names_with_sql_are_rejected() {
    server_scenarios::table_names_with_sql_are_rejected::<My>().await;
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
    let kill = || async {
        let ids = opened.lock().unwrap().clone();
        assert!(!ids.is_empty(), "no connection of the holder recorded");
        for id in &ids {
            sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
                .execute(other.pool())
                .await
                .unwrap();
        }
    };
    server_scenarios::killed_connection_keeps_the_lock_correct(holder, other.clone(), kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stopped_database_is_unavailable_then_recovers() {
    server_scenarios::stopped_database_is_unavailable_then_recovers::<My>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_breaks_no_operation_after_it() {
    server_scenarios::a_restart_breaks_no_operation_after_it::<My>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_outlives_sessions_slower_to_open_than_a_renewal_may_wait() {
    slow_open::a_hold_outlives_sessions_slower_to_open_than_a_renewal_may_wait::<My>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opened_for_an_operation_that_gave_up_goes_to_the_next() {
    slow_open::a_session_opened_for_an_operation_that_gave_up_goes_to_the_next::<My>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_deletes_released_rows() {
    let table = format!("locks_{}", common::random_suffix());
    let b = MySqlBackend::connect(&url(), options(&table).gc_grace(Duration::ZERO))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_options_pass_through_the_url() {
    server_scenarios::tls_options_pass_through_the_url::<My>(
        "ssl-mode=DISABLED",
        "ssl-mode=REQUIRED",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_connections_skip_the_pool() {
    common::kept::skip_the_pool::<My>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_kept_connection_serves_concurrent_operations() {
    common::kept::serve_concurrent_operations::<My>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_kept_connection_returns_to_the_pool() {
    common::kept::idle_connection_returns::<My>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_kept_connections() {
    server_scenarios::shutdown_returns_kept_connections::<My>().await;
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
    server_scenarios::refused_connection_is_reported_at_once::<My>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stopped_database_is_reported_at_once() {
    server_scenarios::stopped_database_is_reported_at_once::<My>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_server_names_the_time_bound() {
    server_scenarios::silent_server_names_the_time_bound::<My>().await;
}

claim_tests!(async {
    let (a, b) = two_backends::<My>().await;
    (a, b, ())
});

/// A table made by a development build (schema stamps 1 to 8 in `<table>_schema`), holding a
/// lock, is refused with one line saying what to do, and nothing in it changes: no table,
/// procedure or stamp is added, the lock and the stamp stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_development_table_is_refused_and_left_as_it_is() {
    let t = format!("locks_{}", common::random_suffix());
    let pool = sqlx::MySqlPool::connect(&url()).await.unwrap();
    let run = |statement: String| {
        let pool = &pool;
        async move {
            sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
                .execute(pool)
                .await
                .unwrap();
        }
    };
    run(format!(
        "CREATE TABLE {t} (lock_key VARBINARY(255) NOT NULL PRIMARY KEY, \
         owner BINARY(16) NOT NULL, \
         label VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
         fence BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB"
    ))
    .await;
    run(format!(
        "CREATE TABLE {t}_schema (id INT NOT NULL PRIMARY KEY, version BIGINT NOT NULL) \
         ENGINE=InnoDB"
    ))
    .await;
    run(format!(
        "INSERT INTO {t}_schema (id, version) VALUES (1, 1)"
    ))
    .await;
    run(format!(
        "INSERT INTO {t} VALUES ('held', REPEAT(X'01', 16), 'old', 5, \
         UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)"
    ))
    .await;
    // Everything named after the table (tables, procedures), its lock and its stamp.
    let what_is_there = || {
        let (pool, t) = (&pool, &t);
        async move {
            sqlx::query_as::<_, (String, String, i64)>(sqlx::AssertSqlSafe(format!(
                "SELECT CONCAT((SELECT GROUP_CONCAT(table_name ORDER BY table_name) \
                   FROM information_schema.tables WHERE table_schema = DATABASE() \
                   AND LEFT(table_name, CHAR_LENGTH(?)) = ?), ';', \
                   COALESCE((SELECT GROUP_CONCAT(routine_name ORDER BY routine_name) \
                   FROM information_schema.routines WHERE routine_schema = DATABASE() \
                   AND LEFT(routine_name, CHAR_LENGTH(?)) = ?), '')), \
                 (SELECT CONCAT(label, ' ', fence) FROM {t}), \
                 (SELECT version FROM {t}_schema)"
            )))
            .bind(t)
            .bind(t)
            .bind(t)
            .bind(t)
            .fetch_one(pool)
            .await
            .unwrap()
        }
    };
    for stamp in common::DEVELOPMENT_STAMPS {
        run(format!("UPDATE {t}_schema SET version = {stamp}")).await;
        let before = what_is_there().await;
        let err = MySqlBackend::connect(&url(), options(&t))
            .await
            .unwrap_err();
        common::assert_refused_as_development(&err, &t, stamp);
        assert_eq!(what_is_there().await, before, "stamp {stamp}");
    }
    assert_eq!(what_is_there().await.1, "old 5");
}

/// A stored procedure's one row of integers; binds the key, the owner, then `ints`.
async fn call(
    pool: &sqlx::MySqlPool,
    statement: &str,
    key: &[u8],
    owner: u8,
    ints: &[i64],
) -> Vec<i64> {
    use sqlx::Row;
    let query = sqlx::query(sqlx::AssertSqlSafe(statement.to_owned()))
        .bind(key)
        .bind([owner; 16].as_slice());
    let query = ints.iter().fold(query, |q, n| q.bind(*n));
    let rows = query.fetch_all(pool).await.unwrap();
    assert_eq!(rows.len(), 1, "{statement}: one row");
    (0..rows[0].len())
        .map(|i| rows[0].get::<i64, _>(i))
        .collect()
}

/// The stored procedures answer every decision of a claim, a lease
/// release and a renewal, and the backend's claims, lease releases and renewals go through
/// them: once they are dropped, those fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_procedures_decide_in_one_call() {
    const RW: i64 = u32::MAX as i64;
    const HOUR_US: i64 = 3_600_000_000;
    let t = format!("locks_{}", common::random_suffix());
    let b = backend(&t).await;
    let pool = sqlx::MySqlPool::connect(&url()).await.unwrap();
    let k = common::key("calls");
    let k = k.as_bytes();
    let claim_sql = format!("CALL {t}_claim(?, ?, 'x', ?, ?, ?)");
    let claim = |owner: u8, weight: i64, capacity: i64| {
        let (pool, claim_sql) = (&pool, &claim_sql);
        async move { call(pool, claim_sql, k, owner, &[weight, HOUR_US, capacity]).await }
    };
    let release = |owner: u8| {
        let (pool, sql) = (&pool, format!("CALL {t}_release_lease(?, ?)"));
        async move { call(pool, &sql, k, owner, &[]).await }
    };
    let extend = |owner: u8| {
        let (pool, sql) = (&pool, format!("CALL {t}_extend_lease(?, ?, ?)"));
        async move { call(pool, &sql, k, owner, &[HOUR_US]).await }
    };
    let reserved_by = || {
        let (pool, sql) = (
            &pool,
            format!(
                "SELECT COALESCE(res_owner, ''), res_expires_at > UTC_TIMESTAMP(6) FROM {t} \
                 WHERE lock_key = ?"
            ),
        );
        async move {
            let (owner, live): (Vec<u8>, bool) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(k)
                .fetch_one(pool)
                .await
                .unwrap();
            live.then(|| owner[0])
        }
    };
    // [kind, fence, remaining, by_reservation, revision]; kinds as in shared.rs.
    // A free key's one lease goes into its row (3), and is renewed there.
    let g1 = claim(1, 1, RW).await;
    assert_eq!((g1[0], g1[2], g1[3]), (3, -1, 0), "grant inline: {g1:?}");
    assert_eq!(claim(1, 1, RW).await[..2], [3, g1[1]], "renew inline");
    // A second lease moves the first to the leases table, its token kept.
    let g2 = claim(2, 1, RW).await;
    assert!(g2[0] == 4 && g2[1] > g1[1], "second lease: {g2:?}");
    assert_eq!(claim(1, 1, RW).await[..2], [2, g1[1]], "renew moved lease");
    let w = claim(3, RW, RW).await;
    assert!(
        w[0] == 5 && w[2] > 0 && w[3] == 2 && w[4] == g2[1],
        "writer behind readers, its reservation kept: {w:?}"
    );
    assert_eq!(reserved_by().await, Some(3), "the writer reserved");
    let r = claim(4, 1, RW).await;
    assert!(
        r[0] == 5 && r[2] > 0 && r[3] == 1,
        "reader behind the reservation: {r:?}"
    );
    assert_eq!(
        reserved_by().await,
        Some(3),
        "the writer's reservation stays"
    );
    assert_eq!(claim(1, 1, 3).await[..2], [0, RW], "capacity mismatch");
    assert_eq!(extend(1).await, [g1[1]], "renewal");
    assert_eq!(extend(3).await, [-1], "renewal without a lease");
    assert_eq!(release(1).await, [1]);
    assert_eq!(release(1).await, [0], "released twice");
    assert_eq!(release(2).await, [1]);
    let x = claim(3, RW, RW).await;
    assert!(x[0] == 3 && x[1] > g2[1], "the writer takes the key: {x:?}");
    assert_eq!(reserved_by().await, None, "its reservation is gone");
    assert_eq!(claim(3, 1, RW).await[..2], [3, x[1]], "renew the row");
    let r = claim(4, 1, RW).await;
    assert!(
        r[0] == 5 && r[2] > 0 && r[3] == 2,
        "reader behind the writer, its reservation kept: {r:?}"
    );
    assert_eq!(
        reserved_by().await,
        Some(4),
        "a reader behind a writer reserves"
    );
    assert_eq!(release(3).await, [0], "the writer holds no lease");

    // The backend goes through the procedures: without them its claims fail, and so do
    // renewals and releases of a lease in the leases table (two readers: the first's
    // inline lease moved there).
    let (leased, owner) = (common::key("leased"), Owner::new("reader"));
    let shared = lockcore::Claim::shared();
    let ttl = Duration::from_secs(60);
    for reader in [&owner, &Owner::new("second")] {
        assert!(matches!(
            b.try_claim(&leased, reader, ttl, shared).await.unwrap(),
            AcquireOutcome::Acquired(_)
        ));
    }
    for name in ["claim", "release_lease", "extend_lease"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP PROCEDURE {t}_{name}")))
            .execute(&pool)
            .await
            .unwrap();
    }
    let other = common::key("other");
    assert!(b.try_claim(&other, &owner, ttl, shared).await.is_err());
    assert!(b.extend(&leased, &owner, ttl).await.is_err());
    assert!(b.release(&leased, &owner).await.is_err());
}

/// The URL option that puts a client's sessions in a time zone `minutes` east of UTC.
fn time_zone_option(minutes: i32) -> String {
    let (sign, h, m) = harness::utc_offset(minutes);
    let sign = if sign == '-' { "-" } else { "%2B" };
    format!("timezone={sign}{h:02}%3A{m:02}")
}

/// The fault store's time-zone hook reaches the sessions a client opens.
#[tokio::test]
async fn time_zone_hook_reaches_sessions() {
    use sqlx::Connection;
    for (minutes, zone) in [(345, "+05:45"), (-570, "-09:30")] {
        let url = format!("{}?{}", My::url(), time_zone_option(minutes));
        let mut conn = sqlx::MySqlConnection::connect(&url).await.unwrap();
        let shown: String = sqlx::query_scalar("SELECT @@session.time_zone")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(shown, zone);
    }
}

/// Pools whose sessions run in other time zones (`SET time_zone`, as an application may
/// configure its pool) share one lock table with a UTC session: expiry is judged by
/// `UTC_TIMESTAMP(6)`, so no session sees another's lease shifted by the offset. With
/// `NOW(6)` a lease written at UTC−5 would look expired to the UTC session (two holders), and
/// one written at UTC+5 held for hours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_time_zone_does_not_shift_expiry() {
    let table = format!("locks_{}", common::random_suffix());
    let utc = backend(&table).await;
    let ttl = Duration::from_secs(30);
    for tz in ["-05:00", "+05:00"] {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(2)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    sqlx::query(sqlx::AssertSqlSafe(format!("SET time_zone = '{tz}'")))
                        .execute(conn)
                        .await?;
                    Ok(())
                })
            })
            .connect(&url())
            .await
            .unwrap();
        let zoned = MySqlBackend::from_pool(pool, options(&table))
            .await
            .unwrap();
        for (holder, other, holder_tz) in [(&zoned, &utc, tz), (&utc, &zoned, "+00:00")] {
            let key = lockcore::LockKey::new(format!("tz {tz} held at {holder_tz}")).unwrap();
            let (a, b) = (Owner::new("a"), Owner::new("b"));
            assert!(matches!(
                holder.try_acquire(&key, &a, ttl).await.unwrap(),
                AcquireOutcome::Acquired(_)
            ));
            match other.try_acquire(&key, &b, ttl).await.unwrap() {
                AcquireOutcome::Held(c) => assert!(
                    c.remaining_ttl.is_some_and(|r| r <= ttl),
                    "held at {holder_tz}: the other session sees {:?} left of a {ttl:?} lease",
                    c.remaining_ttl
                ),
                AcquireOutcome::Acquired(_) => {
                    panic!("held at {holder_tz}: another session took a live lock")
                }
            }
            let info = other.inspect(&key).await.unwrap().expect("held");
            assert!(
                info.remaining_ttl.is_some_and(|r| r <= ttl && r > ttl / 2),
                "held at {holder_tz}: inspect from the other session says {:?} left",
                info.remaining_ttl
            );
            assert!(matches!(
                other.extend(&key, &b, ttl).await.unwrap(),
                lockcore::driver::ExtendOutcome::NotHeld
            ));
            assert_eq!(
                holder.release(&key, &a).await.unwrap(),
                ReleaseOutcome::Released
            );
        }
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

/// Another session's open transaction holding `key`'s row in `table` (`SELECT … FOR
/// UPDATE`): what keeps a batch renewing it waiting.
async fn row_locked(
    table: &str,
    key: &lockcore::LockKey,
) -> sqlx::Transaction<'static, sqlx::MySql> {
    let pool = sqlx::MySqlPool::connect(&url()).await.unwrap();
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM {table} WHERE lock_key = ? FOR UPDATE"
    )))
    .bind(key.as_bytes())
    .execute(&mut *blocker)
    .await
    .unwrap();
    blocker
}

/// A batch renewal stuck on the server (behind another session's row lock: a bad plan
/// holds its connection just as long) is ended by MariaDB within the time the watchdog
/// allows it (`max_statement_time`, 200 ms at a TTL of 2 s), not after InnoDB's 50 s lock
/// wait, and the backend's one connection serves the next batch at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_batch_renewal_is_ended_by_the_server() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let table = format!("locks_{}", common::random_suffix());
        let b = MySqlBackend::connect(&url(), options(&table).max_connections(1))
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

/// Runs `statement` on `b`'s pool.
async fn run_sql(b: &MySqlBackend, statement: String) {
    sqlx::query(sqlx::AssertSqlSafe(statement))
        .execute(b.pool())
        .await
        .unwrap();
}

/// Takes the table's statistics, the engine-independent ones included (column histograms
/// and the row count, which MariaDB never refreshes by itself).
async fn analyze(b: &MySqlBackend, table: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ANALYZE TABLE {table} PERSISTENT FOR ALL"
    )))
    .fetch_all(b.pool())
    .await
    .unwrap();
}

/// Adds 60,000 rows to `table`, of another owner, expiring `expires` (an expression).
async fn add_rows(b: &MySqlBackend, table: &str, expires: &str) {
    let digit = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                 UNION ALL SELECT 8 UNION ALL SELECT 9)";
    run_sql(
        b,
        format!(
            "INSERT INTO {table} (lock_key, owner, label, fence, expires_at) \
             SELECT CONCAT('other-', n), X'00000000000000000000000000000001', 'other', n, \
             {expires} FROM (SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d \
             + 10000 * f.d AS n FROM {digit} a, {digit} b, {digit} c, {digit} e, {digit} f) g \
             WHERE n <= 60000"
        ),
    )
    .await;
}

/// Holds 1,024 keys on `b` and renews them in one batch: every one renewed, in well under
/// 2 s.
async fn batch_of_1024_is_quick(b: &Arc<MySqlBackend>) {
    let owner = Owner::new("renewer");
    let keys = common::limits::hold(&**b, &owner, lockcore::driver::RENEWAL_BATCH).await;
    let ttl = Duration::from_secs(60);
    let renewals: Vec<lockcore::driver::Renewal<'_>> = keys
        .iter()
        .map(|k| lockcore::driver::Renewal::new(k, &owner, ttl))
        .collect();
    let started = std::time::Instant::now();
    let answers = b.renew(&renewals).await.unwrap();
    let took = started.elapsed();
    for (i, answer) in answers.iter().enumerate() {
        assert!(
            matches!(answer, Ok(lockcore::driver::ExtendOutcome::Extended(_))),
            "renewal {i}: {answer:?}"
        );
    }
    eprintln!("a batch of {} renewals took {took:?}", renewals.len());
    assert!(
        took < Duration::from_secs(2),
        "a batch of {} renewals took {took:?}",
        renewals.len()
    );
    common::limits::release(&**b, &owner, &keys).await;
}

/// Statistics taken while every row had expired (PostgreSQL planned its batch from such
/// statistics into a nested loop over the whole table): once 60,000 rows are held again,
/// a batch renewal of 1,024 holds still finds its rows by the primary key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_renewal_uses_the_key_after_statistics_of_expired_rows() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let table = format!("locks_{}", common::random_suffix());
        let b = backend(&table).await;
        add_rows(&b, &table, "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR").await;
        analyze(&b, &table).await;
        // Held again (by another owner) since the statistics were taken.
        run_sql(
            &b,
            format!("UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR"),
        )
        .await;
        batch_of_1024_is_quick(&b).await;
    })
    .await
    .expect("the test's own time bound");
}

/// Statistics taken while the table was empty, which MariaDB never refreshes by itself
/// (they estimate 0 rows): once 60,000 rows are held, a batch renewal of 1,024 holds still
/// finds its rows by the primary key (planned by those statistics, it read the whole table
/// for every bound row or compared each row with every bound row: 6 s per batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_renewal_uses_the_key_after_statistics_of_an_empty_table() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let table = format!("locks_{}", common::random_suffix());
        let b = backend(&table).await;
        analyze(&b, &table).await;
        add_rows(&b, &table, "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR").await;
        batch_of_1024_is_quick(&b).await;
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
    let pool = sqlx::MySqlPool::connect(&url()).await.unwrap();
    common::claims::stale_inline_lease_is_no_lease(b, |k| async move {
        // An exclusive grant on a free row that leaves the lease columns alone.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET owner = X'ABABABABABABABABABABABABABABABAB', label = 'old writer', \
             fence = fence + 1, capacity = {}, \
             expires_at = UTC_TIMESTAMP(6) + INTERVAL 20 SECOND WHERE lock_key = ?",
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
struct MyTx {
    backend: Arc<MySqlBackend>,
    table: String,
    accounts: String,
}

#[async_trait]
impl common::transaction::TxDb for MyTx {
    type Tx = sqlx::Transaction<'static, sqlx::MySql>;

    async fn start() -> Self {
        let table = format!("locks_{}", common::random_suffix());
        let backend = MySqlBackend::connect(&url(), options(&table))
            .await
            .unwrap();
        let accounts = format!("accounts_{}", common::random_suffix());
        let pool = backend.pool();
        let create = format!(
            "CREATE TABLE {accounts} (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, \
             fence BIGINT NOT NULL) ENGINE = InnoDB"
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
        MyTx {
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
            "UPDATE {} SET balance = balance + ?, fence = ? WHERE id = ? AND fence <= ?",
            self.accounts
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(update))
            .bind(delta)
            .bind(i64::try_from(token.0).unwrap())
            .bind(account)
            .bind(i64::try_from(token.0).unwrap())
            .execute(&mut **tx)
            .await
            .unwrap();
        done.rows_affected() == 1
    }

    async fn balance(&self, account: i64) -> i64 {
        let read = format!("SELECT balance FROM {} WHERE id = ?", self.accounts);
        sqlx::query_scalar(sqlx::AssertSqlSafe(read))
            .bind(account)
            .fetch_one(self.backend.pool())
            .await
            .unwrap()
    }

    async fn usable(&self, tx: &mut Self::Tx) -> bool {
        let one: i64 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut **tx)
            .await
            .unwrap();
        one == 1
    }
}

transaction_tests!(MyTx);
