//! Creates PostgreSQL's lock table, or checks the one there.

use sqlx::postgres::PgConnection;

use super::routines::routines;
use super::statements::channel_name;
use super::Pg;
use crate::dialect::Dialect;
use crate::error::migration_failed;
use crate::open::Migration;
use crate::schema::{check_version, settled, stamp, version_statement, Ddl};
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
    upgrades: [
        upgrade, upgrade_v3, upgrade_v4, upgrade_v5, upgrade_v6, upgrade_v7,
    ],
};

/// Version 1 to 2: the key's capacity and reservation, and the leases table.
fn upgrade(t: &str) -> Vec<String> {
    vec![
        format!(
            "ALTER TABLE {t} \
             ADD COLUMN IF NOT EXISTS capacity BIGINT NOT NULL DEFAULT {}, \
             ADD COLUMN IF NOT EXISTS res_owner BYTEA, \
             ADD COLUMN IF NOT EXISTS res_weight BIGINT NOT NULL DEFAULT 0, \
             ADD COLUMN IF NOT EXISTS res_expires_at TIMESTAMPTZ NOT NULL DEFAULT 'epoch'",
            lockcore::driver::READ_WRITE_CAPACITY
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_leases (lock_key BYTEA NOT NULL, \
             owner BYTEA NOT NULL, label TEXT NOT NULL, weight BIGINT NOT NULL, \
             fence BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, \
             PRIMARY KEY (lock_key, owner))"
        ),
    ]
}

/// Creates the lock table `t` and its schema stamp unless they exist, upgrades an older
/// one in place; refuses a table stamped by a newer version.
pub(super) fn migrate<'c>(conn: &'c mut PgConnection, t: &'c str) -> Migration<'c> {
    Box::pin(async move {
        use sqlx::Connection;
        let err = |e| migration_failed(Pg::NAME, t, e);
        // Look before reading the version: a query on a missing table would be an error the
        // server logs, and sqlx with it at debug level, on every first start.
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(format!("{t}_schema"))
            .fetch_one(&mut *conn)
            .await
            .map_err(err)?;
        let version = version_statement(t);
        if exists {
            if let Some(ready) = settled(t, stamp::<Postgres>(conn, &version).await.map_err(err)?) {
                return ready;
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
        let version = DDL.run::<Postgres>(&mut *tx, t).await.map_err(err)?;
        tx.commit().await.map_err(err)?;
        check_version(t, version)
    })
}

/// Version 2 to 3: the one-call paths of shared claims, plpgsql functions beside the table
/// (created or replaced).
fn upgrade_v3(t: &str) -> Vec<String> {
    routines(t, &channel_name(t))
}

/// Version 3 to 4: nothing left (it made the waiters' queue of a layout since removed).
fn upgrade_v4(_: &str) -> Vec<String> {
    Vec::new()
}

/// Version 4 to 5: the reservation's arrival, which orders long waits' marks.
fn upgrade_v5(t: &str) -> Vec<String> {
    vec![format!(
        "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS res_since BIGINT"
    )]
}

/// Version 5 to 6: nothing left (it remade the queue's routine).
fn upgrade_v6(_: &str) -> Vec<String> {
    Vec::new()
}

/// Version 6 to 7: a key's first lease inline in its row (`lease_weight`, and `lease_fence`
/// naming the grant that wrote it; see `inline`), and the claim function that takes a free
/// key so.
fn upgrade_v7(t: &str) -> Vec<String> {
    let mut statements = vec![format!(
        "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS lease_weight BIGINT NOT NULL DEFAULT 0, \
         ADD COLUMN IF NOT EXISTS lease_fence BIGINT"
    )];
    statements.extend(routines(t, &channel_name(t)));
    statements
}

#[cfg(test)]
mod tests {
    use super::DDL;

    #[test]
    fn what_a_table_holds_changes_only_with_the_schema_version() {
        crate::schema::assert_stored(&DDL, "PostgreSQL", (7, "71bac36e93200ebcd9405c8f"));
    }
}
