//! Creates PostgreSQL's lock table, or checks the one there.

use sqlx::postgres::PgConnection;
use sqlx::Postgres;

use super::routines::routines;
use super::Pg;
use crate::dialect::Dialect;
use crate::error::migration_failed;
use crate::open::Migration;
use crate::schema::{check_version, Schema, SCHEMA_VERSION};

/// PostgreSQL's lock table.
const SCHEMA: Schema = Schema {
    exists: "SELECT CASE WHEN to_regclass($1::text) IS NULL THEN 0 ELSE 1 END::bigint",
    ddl,
};

/// The lock table `t` (see `docs/sql.md`, "The table"), its leases, its functions (see
/// `routines.rs`) and its stamp.
fn ddl(t: &str) -> Vec<String> {
    let rw = lockcore::driver::READ_WRITE_CAPACITY;
    let mut statements = vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (lock_key BYTEA NOT NULL PRIMARY KEY, \
             owner BYTEA NOT NULL, label TEXT NOT NULL, fence BIGINT NOT NULL, \
             expires_at TIMESTAMPTZ NOT NULL, capacity BIGINT NOT NULL DEFAULT {rw}, \
             res_owner BYTEA, res_weight BIGINT NOT NULL DEFAULT 0, \
             res_expires_at TIMESTAMPTZ NOT NULL DEFAULT 'epoch', res_since BIGINT, \
             lease_weight BIGINT NOT NULL DEFAULT 0, lease_fence BIGINT)"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_leases (lock_key BYTEA NOT NULL, \
             owner BYTEA NOT NULL, label TEXT NOT NULL, weight BIGINT NOT NULL, \
             fence BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, \
             PRIMARY KEY (lock_key, owner))"
        ),
    ];
    statements.extend(routines(t));
    statements.extend([
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_version (id INTEGER NOT NULL PRIMARY KEY, \
             version BIGINT NOT NULL)"
        ),
        format!(
            "INSERT INTO {t}_version (id, version) VALUES (1, {SCHEMA_VERSION}) \
             ON CONFLICT (id) DO NOTHING"
        ),
    ]);
    statements
}

/// Creates the lock table `t` and its stamp unless they exist; refuses a table made by a
/// development build or stamped by a newer version.
pub(super) fn migrate<'c>(conn: &'c mut PgConnection, t: &'c str) -> Migration<'c> {
    Box::pin(async move {
        use sqlx::Connection;
        let err = |e| migration_failed(Pg::NAME, t, e);
        if SCHEMA.check::<Postgres>(conn, t).await.map_err(err)?? {
            return Ok(());
        }
        let mut tx = conn.begin().await.map_err(err)?;
        // Concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog: serialise
        // the migrations of this table.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('distlock migration ' || $1))")
            .bind(t)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let version = SCHEMA.make::<Postgres>(&mut *tx, t).await.map_err(err)?;
        tx.commit().await.map_err(err)?;
        check_version(t, version)
    })
}

#[cfg(test)]
mod tests {
    use super::SCHEMA;

    #[test]
    fn what_a_table_holds_changes_only_with_the_schema_version() {
        crate::schema::assert_stored(&SCHEMA, "PostgreSQL", (1, "258fe67ab03a21b2fb7fa5ff"));
    }
}
