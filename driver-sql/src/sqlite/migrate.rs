//! Creates SQLite's lock table, or checks the one there.

use lockcore::LockError;
use sqlx::{Connection, Sqlite};

use super::file::SqliteFile;
use crate::run::Run;
use crate::schema::{check_version, Schema};
use crate::store::from_file;

/// SQLite's lock table, without row ids (its key is the primary key).
const SCHEMA: Schema = Schema {
    exists: "SELECT count(*) FROM sqlite_master WHERE type = 'table' \
             AND name = ?1 COLLATE NOCASE",
    ddl,
};

/// The lock table `t` (see `docs/sql.md`, "The table"), its leases and claims
/// (`tables.sql`), the triggers (`triggers.sql`) and its stamp (`version.sql`), each file
/// run as one text of statements.
fn ddl(t: &str) -> Vec<String> {
    [TABLES, TRIGGERS, VERSION]
        .iter()
        .map(|file| from_file(file, t))
        .collect()
}

const TABLES: &str = include_str!("../store/sqlite/tables.sql");

/// The triggers keeping a key's row in step with its leases, and writing a claim's
/// decision.
const TRIGGERS: &str = include_str!("../store/sqlite/triggers.sql");

/// The stamp, [`SCHEMA_VERSION`](crate::SCHEMA_VERSION).
const VERSION: &str = include_str!("../store/sqlite/version.sql");

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
    use super::super::statements::{MARKER, NOW_US};
    use super::*;

    /// The files spell out the values the rest of the driver names.
    #[test]
    fn the_files_spell_the_drivers_constants() {
        let rw = lockcore::driver::READ_WRITE_CAPACITY;
        assert!(TABLES.contains(&format!("capacity INTEGER NOT NULL DEFAULT {rw},")));
        assert!(TRIGGERS.contains(MARKER) && TRIGGERS.contains(NOW_US));
        let stamp = format!("VALUES (1, {})", crate::schema::SCHEMA_VERSION);
        assert!(VERSION.contains(&stamp));
    }

    #[test]
    fn the_triggers_are_made_for_the_table() {
        let made = from_file(TRIGGERS, "locks");
        for name in [
            "lease_granted",
            "lease_renewed",
            "lease_released",
            "claimed",
        ] {
            assert!(made.contains(&format!("DROP TRIGGER IF EXISTS locks_{name};")));
            assert!(made.contains(&format!("CREATE TRIGGER locks_{name} AFTER ")));
        }
        assert!(!made.contains("distlock_locks"), "{made}");
    }

    #[test]
    fn what_a_table_holds_changes_only_with_the_schema_version() {
        crate::schema::tests::assert_stored(&SCHEMA, "SQLite", (1, "e2e09414dccb986b3efecd40"));
    }
}
