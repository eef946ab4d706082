//! Creates PostgreSQL's lock table, or checks the one there.

use lockcore::LockError;
use sqlx::postgres::PgConnection;
use sqlx::AssertSqlSafe;

use super::NAME;
use crate::db::BoxFuture;
use crate::error::map_err;
use crate::schema::{check_version, SCHEMA_VERSION};

/// Creates the lock table `t` and its schema stamp unless they exist; refuses a table
/// stamped by a newer version.
async fn migrate(conn: &mut PgConnection, t: &str) -> Result<(), LockError> {
    use sqlx::Connection;
    let err = |e| map_err(NAME, e);
    let version_sql = format!("SELECT version FROM {t}_schema WHERE id = 1");
    // Look before reading the version: a query on a missing table would be an error the
    // server logs, and sqlx with it at debug level, on every first start.
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(format!("{t}_schema"))
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    if exists {
        let version: Option<i64> = sqlx::query_scalar(AssertSqlSafe(version_sql.clone()))
            .fetch_optional(&mut *conn)
            .await
            .map_err(err)?;
        if let Some(version) = version {
            return check_version(t, version);
        }
    }
    let mut tx = conn.begin().await.map_err(err)?;
    // Concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog: serialise
    // the migrations of this table.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('distlock migration ' || $1))")
        .bind(t)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    let ddl = [
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (\
               lock_key BYTEA NOT NULL PRIMARY KEY, \
               owner BYTEA NOT NULL, \
               label TEXT NOT NULL, \
               fence BIGINT NOT NULL, \
               expires_at TIMESTAMPTZ NOT NULL)"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_schema (\
               id INTEGER NOT NULL PRIMARY KEY, version BIGINT NOT NULL)"
        ),
        format!(
            "INSERT INTO {t}_schema (id, version) VALUES (1, {SCHEMA_VERSION}) \
             ON CONFLICT (id) DO NOTHING"
        ),
    ];
    for statement in ddl {
        sqlx::query(AssertSqlSafe(statement))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
    }
    let version: i64 = sqlx::query_scalar(AssertSqlSafe(version_sql))
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
    tx.commit().await.map_err(err)?;
    check_version(t, version)
}

/// [`migrate`] as the backend's build takes it.
pub(super) fn boxed<'c>(
    conn: &'c mut PgConnection,
    t: &'c str,
) -> BoxFuture<'c, Result<(), LockError>> {
    Box::pin(migrate(conn, t))
}
