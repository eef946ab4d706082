//! Creates PostgreSQL's lock table, or checks the one there.

use sqlx::postgres::PgConnection;
use sqlx::Postgres;

use super::routines::routines;
use super::Pg;
use crate::dialect::Dialect;
use crate::error::migration_failed;
use crate::open::Migration;
use crate::schema::{check_version, Schema};
use crate::statements::from_file;

/// PostgreSQL's lock table.
const SCHEMA: Schema = Schema {
    exists: "SELECT CASE WHEN to_regclass($1::text) IS NULL THEN 0 ELSE 1 END::bigint",
    ddl,
};

/// The lock table `t` and its leases (`tables.sql`), its functions (see `routines.rs`) and
/// its stamp (`version.sql`), each file run as one text of statements.
fn ddl(t: &str) -> Vec<String> {
    let mut statements = vec![from_file(TABLES, t)];
    statements.extend(routines(t));
    statements.push(from_file(VERSION, t));
    statements
}

/// The lock table and its leases.
const TABLES: &str = include_str!("tables.sql");

/// The stamp, [`SCHEMA_VERSION`](crate::SCHEMA_VERSION).
const VERSION: &str = include_str!("version.sql");

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

    /// The files spell out the values the rest of the driver names.
    #[test]
    fn the_files_spell_the_drivers_constants() {
        let rw = lockcore::driver::READ_WRITE_CAPACITY;
        assert!(super::TABLES.contains(&format!("capacity BIGINT NOT NULL DEFAULT {rw},")));
        let stamp = format!("VALUES (1, {})", crate::schema::SCHEMA_VERSION);
        assert!(super::VERSION.contains(&stamp));
    }

    #[test]
    fn what_a_table_holds_changes_only_with_the_schema_version() {
        crate::schema::assert_stored(&SCHEMA, "PostgreSQL", (1, "5e72175f9a9ddf5c3cd0c8c6"));
    }
}
