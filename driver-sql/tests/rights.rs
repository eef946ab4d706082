//! The rights a database role needs, against the real PostgreSQL and MariaDB test servers and
//! their role `distlock_plain` (created by `scripts/servers.sh`): one that may not create
//! the lock table is told what to grant, in the database's words without sqlx's wrapping;
//! once a role that may has created it, the rights docs/sql.md lists under "Rights" are
//! enough for every kind of lock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::servers::shared_url;
use distlock_sql::SqlOptions;
use lockcore::{LockBackend, LockClient, LockError};

/// The shared server's URL (`var`) as the role `distlock_plain`, and as its owner, both on
/// the table `table`.
fn urls(var: &str, table: &str) -> (String, String) {
    let owner = format!("{}?distlock_table={table}", shared_url(var));
    let plain = owner.replacen("://distlock:", "://distlock_plain:", 1);
    assert_ne!(
        plain, owner,
        "the test server's URL names the role distlock"
    );
    (plain, owner)
}

async fn backend(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    let options = SqlOptions::new().acquire_timeout(Duration::from_secs(5));
    distlock_sql::connect_with(url, options).await
}

/// `distlock_plain` is refused the table's creation with the database's reason and what to
/// grant; then, the table created by its owner (and the owner's `grants` run, `{t}` the
/// table), it takes and releases an exclusive lock, a read lock and permits of a semaphore.
async fn check(var: &str, what_to_grant: &str, grants: &[&str]) {
    let table = format!("rights_{}", common::random_suffix());
    let (plain, owner) = urls(var, &table);
    let err = match backend(&plain).await {
        Err(e) => e,
        Ok(_) => panic!("distlock_plain created the table {table}"),
    };
    let text = lockcore::ErrorChain(&err).to_string();
    assert!(
        !text.contains("authentication failed") && !text.contains("Access denied for user"),
        "the test servers have no role distlock_plain (started before scripts/servers.sh \
         created it?): restart them with scripts/servers.sh stop; scripts/servers.sh start. \
         {text}"
    );
    assert!(matches!(err, LockError::Backend { .. }), "{text}");
    for said in [
        format!("cannot create the lock table {table}"),
        what_to_grant.to_string(),
        "docs/sql.md".to_string(),
    ] {
        assert!(text.contains(&said), "{said:?} missing from: {text}");
    }
    // Neither sqlx's wrapper nor the database server's source line.
    for noise in ["error returned from database", " at line "] {
        assert!(!text.contains(noise), "{noise:?} in: {text}");
    }

    backend(&owner).await.expect("the owner creates the table");
    if !grants.is_empty() {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&shared_url(var))
            .await
            .unwrap();
        for grant in grants {
            // The table name is the test's own (letters, digits, `_`).
            sqlx::raw_sql(sqlx::AssertSqlSafe(grant.replace("{t}", &table)))
                .execute(&mut conn)
                .await
                .unwrap();
        }
    }
    let client = LockClient::new(backend(&plain).await.expect("the rights are enough"));
    client
        .lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let shared = client.lock("k").shared().acquire().await.unwrap();
    shared.release().await.unwrap();
    let permit = client.semaphore("s", 2).acquire().await.unwrap();
    permit.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_rights() {
    tokio::time::timeout(Duration::from_secs(60), async {
        check(
            "DISTLOCK_TEST_POSTGRES_URL",
            "GRANT CREATE ON SCHEMA public TO <role>",
            &[
                "GRANT SELECT, INSERT, UPDATE, DELETE ON {t}, {t}_leases TO distlock_plain",
                "GRANT SELECT ON {t}_version TO distlock_plain",
            ],
        )
        .await
    })
    .await
    .unwrap();
}

/// `distlock_plain` holds `SELECT, INSERT, UPDATE, DELETE, EXECUTE ON distlock.*` (see
/// `scripts/servers.sh`): a database-wide grant covers the tables and routines made later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_rights() {
    tokio::time::timeout(Duration::from_secs(60), async {
        check(
            "DISTLOCK_TEST_MYSQL_URL",
            "CREATE, CREATE ROUTINE and ALTER ROUTINE",
            &[],
        )
        .await
    })
    .await
    .unwrap();
}
