//! Creates PostgreSQL's lock table, or checks the one there.

use lockcore::LockError;
use sqlx::postgres::PgConnection;
use sqlx::AssertSqlSafe;

use super::Pg;
use crate::db::BoxFuture;
use crate::dialect::Dialect;
use crate::error::map_err;
use crate::schema::{
    check_version, create_tables, stamp, stamped, version_statement, SCHEMA_VERSION,
};
use sqlx::Postgres;

/// Creates the lock table `t` and its schema stamp unless they exist; refuses a table
/// stamped by a newer version.
pub(super) fn migrate<'c>(
    conn: &'c mut PgConnection,
    t: &'c str,
) -> BoxFuture<'c, Result<(), LockError>> {
    Box::pin(async move {
        use sqlx::Connection;
        let err = |e| map_err(Pg::NAME, e);
        let version = version_statement(t);
        // Look before reading the version: a query on a missing table would be an error the
        // server logs, and sqlx with it at debug level, on every first start.
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(format!("{t}_schema"))
            .fetch_one(&mut *conn)
            .await
            .map_err(err)?;
        if exists {
            if let Some(stamped) = stamp::<Postgres>(conn, &version).await.map_err(err)? {
                return check_version(t, stamped);
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
        let [table, schema] = create_tables(
            t,
            ["BYTEA", "BYTEA", "TEXT", "BIGINT", "TIMESTAMPTZ"],
            ["INTEGER", "BIGINT"],
            ["", ""],
        );
        let ddl = [
            table,
            schema,
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
        let version = stamp::<Postgres>(&mut *tx, &version).await;
        let version = version.and_then(stamped).map_err(err)?;
        tx.commit().await.map_err(err)?;
        check_version(t, version)
    })
}
