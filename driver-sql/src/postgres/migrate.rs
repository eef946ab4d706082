//! Creates PostgreSQL's lock table, or checks the one there.

use sqlx::postgres::PgConnection;

use super::Pg;
use crate::dialect::Dialect;
use crate::error::map_err;
use crate::open::Migration;
use crate::schema::{check_version, stamp, stamped, version_statement, Ddl};
use sqlx::Postgres;

/// PostgreSQL's tables.
const DDL: Ddl = Ddl {
    columns: [
        "BYTEA",
        "BYTEA",
        "TEXT",
        "BIGINT",
        "TIMESTAMPTZ",
        "INTEGER",
        "BIGINT",
    ],
    after: ["", ""],
    insert: ["INSERT INTO", " ON CONFLICT (id) DO NOTHING"],
};

/// Creates the lock table `t` and its schema stamp unless they exist; refuses a table
/// stamped by a newer version.
pub(super) fn migrate<'c>(conn: &'c mut PgConnection, t: &'c str) -> Migration<'c> {
    Box::pin(async move {
        use sqlx::Connection;
        let err = |e| map_err(Pg::NAME, e);
        // Look before reading the version: a query on a missing table would be an error the
        // server logs, and sqlx with it at debug level, on every first start.
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(format!("{t}_schema"))
            .fetch_one(&mut *conn)
            .await
            .map_err(err)?;
        let version = version_statement(t);
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
        DDL.run::<Postgres>(&mut *tx, t).await.map_err(err)?;
        let version = stamp::<Postgres>(&mut *tx, &version).await;
        let version = version.and_then(stamped).map_err(err)?;
        tx.commit().await.map_err(err)?;
        check_version(t, version)
    })
}
