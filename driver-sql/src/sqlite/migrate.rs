//! Creates SQLite's lock table, or checks the one there.

use lockcore::LockError;
use sqlx::{Connection, Sqlite};

use super::file::SqliteFile;
use super::triggers;
use crate::run::Run;
use crate::schema::{check_version, Schema, SCHEMA_VERSION};

/// SQLite's lock table, without row ids (its key is the primary key).
const SCHEMA: Schema = Schema {
    exists: "SELECT count(*) FROM sqlite_master WHERE type = 'table' \
             AND name = ?1 COLLATE NOCASE",
    ddl,
};

/// The lock table `t` (see `docs/sql.md`, "The table"), its leases (each with its key's
/// capacity), the triggers keeping the key's row in step with them ([`triggers`]) and its
/// stamp.
fn ddl(t: &str) -> Vec<String> {
    let rw = lockcore::driver::READ_WRITE_CAPACITY;
    let mut statements = vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (lock_key BLOB NOT NULL PRIMARY KEY, \
             owner BLOB NOT NULL, label TEXT NOT NULL, fence INTEGER NOT NULL, \
             expires_at INTEGER NOT NULL, capacity INTEGER NOT NULL DEFAULT {rw}, \
             res_owner BLOB, res_weight INTEGER NOT NULL DEFAULT 0, \
             res_expires_at INTEGER NOT NULL DEFAULT 0, res_since INTEGER) WITHOUT ROWID"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_leases (lock_key BLOB NOT NULL, \
             owner BLOB NOT NULL, label TEXT NOT NULL, weight INTEGER NOT NULL, \
             fence INTEGER NOT NULL, expires_at INTEGER NOT NULL, \
             capacity INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (lock_key, owner)) WITHOUT ROWID"
        ),
    ];
    statements.extend(triggers::create(t));
    statements.extend([
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_version (id INTEGER NOT NULL PRIMARY KEY, \
             version INTEGER NOT NULL)"
        ),
        format!("INSERT OR IGNORE INTO {t}_version (id, version) VALUES (1, {SCHEMA_VERSION})"),
    ]);
    statements
}

/// Creates the lock table `t` and its stamp unless they exist; refuses a table made by a
/// development build or stamped by a newer version. (A file that is not a database is
/// reported as such by the first look, not taken for one without the table.)
pub(super) async fn migrate(file: &SqliteFile, t: &str) -> Result<(), LockError> {
    let err = |e| file.error(e);
    let mut conn = file.pool.acquire().await.map_err(err)?;
    if SCHEMA.check::<Sqlite>(&mut conn, t).await.map_err(err)?? {
        return Ok(());
    }
    // One migration at a time: the write lock from the first statement on.
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
    let version = SCHEMA.make::<Sqlite>(&mut tx, t).await.map_err(err)?;
    tx.commit().await.map_err(err)?;
    check_version(t, version)
}

#[cfg(test)]
mod tests {
    use super::SCHEMA;

    #[test]
    fn what_a_table_holds_changes_only_with_the_schema_version() {
        crate::schema::assert_stored(&SCHEMA, "SQLite", (1, "eeb760d3fff7813667e9d61d"));
    }
}
