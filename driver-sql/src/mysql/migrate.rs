//! Creates MySQL's lock table, or checks the one there.

use lockcore::LockError;
use sqlx::mysql::MySqlConnection;
use sqlx::AssertSqlSafe;

use super::NAME;
use crate::db::BoxFuture;
use crate::error::map_err;
use crate::schema::{check_version, SCHEMA_VERSION};

/// Creates the lock table `t` and its schema stamp unless they exist; refuses a table
/// stamped by a newer version.
async fn migrate(conn: &mut MySqlConnection, t: &str) -> Result<(), LockError> {
    let err = |e| map_err(NAME, e);
    let version_sql = format!("SELECT version FROM {t}_schema WHERE id = 1");
    // Look before reading the version: a query on a missing table would be an error logged
    // on every first start.
    let exists: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(format!("{t}_schema"))
    .fetch_one(&mut *conn)
    .await
    .map_err(err)?;
    if exists > 0 {
        let version: Option<i64> = sqlx::query_scalar(AssertSqlSafe(version_sql.clone()))
            .fetch_optional(&mut *conn)
            .await
            .map_err(err)?;
        if let Some(version) = version {
            return check_version(t, version);
        }
    }
    // Serialise concurrent migrations of this table (the lock ends with the session, or
    // is released below).
    sqlx::query("SELECT GET_LOCK(CONCAT('distlock:', ?), 30)")
        .bind(t)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    let ddl = [
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (\
               lock_key VARBINARY(255) NOT NULL PRIMARY KEY, \
               owner BINARY(16) NOT NULL, \
               label VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
               fence BIGINT NOT NULL, \
               expires_at DATETIME(6) NOT NULL\
             ) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_schema (\
               id INT NOT NULL PRIMARY KEY, version BIGINT NOT NULL) ENGINE=InnoDB"
        ),
        format!("INSERT IGNORE INTO {t}_schema (id, version) VALUES (1, {SCHEMA_VERSION})"),
    ];
    let mut result = Ok(());
    for statement in ddl {
        if let Err(e) = sqlx::query(AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await
        {
            result = Err(err(e));
            break;
        }
    }
    let _ = sqlx::query("SELECT RELEASE_LOCK(CONCAT('distlock:', ?))")
        .bind(t)
        .execute(&mut *conn)
        .await;
    result?;
    let version: i64 = sqlx::query_scalar(AssertSqlSafe(version_sql))
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    check_version(t, version)
}

/// [`migrate`] as the backend's build takes it.
pub(super) fn boxed<'c>(
    conn: &'c mut MySqlConnection,
    t: &'c str,
) -> BoxFuture<'c, Result<(), LockError>> {
    Box::pin(migrate(conn, t))
}
