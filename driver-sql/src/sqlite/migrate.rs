//! Creates SQLite's lock table, or checks the one there.

use lockcore::LockError;

use super::file::SqliteFile;
use super::triggers;
use crate::run::Run;
use crate::schema::{check_version, settled, stamp, version_statement, Ddl};
use sqlx::{Connection, Sqlite};

/// SQLite's tables: the lock table without row ids (its key is the primary key).
const DDL: Ddl = Ddl {
    columns: [
        "BLOB", "BLOB", "TEXT", "INTEGER", "INTEGER", "INTEGER", "INTEGER",
    ],
    after: [" WITHOUT ROWID", ""],
    insert: ["INSERT OR IGNORE INTO", ""],
    upgrades: [
        upgrade, upgrade_v3, upgrade_v4, upgrade_v5, upgrade_v6, upgrade_v7,
    ],
};

/// Version 1 to 2: the key's capacity and reservation, and the leases table (one column per
/// `ALTER TABLE`, as SQLite takes them; the migration's `BEGIN IMMEDIATE` keeps this to one
/// run).
fn upgrade(t: &str) -> Vec<String> {
    let rw = lockcore::driver::READ_WRITE_CAPACITY;
    vec![
        format!("ALTER TABLE {t} ADD COLUMN capacity INTEGER NOT NULL DEFAULT {rw}"),
        format!("ALTER TABLE {t} ADD COLUMN res_owner BLOB"),
        format!("ALTER TABLE {t} ADD COLUMN res_weight INTEGER NOT NULL DEFAULT 0"),
        format!("ALTER TABLE {t} ADD COLUMN res_expires_at INTEGER NOT NULL DEFAULT 0"),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_leases (lock_key BLOB NOT NULL, owner BLOB NOT NULL, \
             label TEXT NOT NULL, weight INTEGER NOT NULL, fence INTEGER NOT NULL, \
             expires_at INTEGER NOT NULL, PRIMARY KEY (lock_key, owner)) WITHOUT ROWID"
        ),
    ]
}

/// Version 2 to 3: each lease carries its key's capacity, and triggers keep the key's row
/// in step with its leases ([`triggers`]), so a lease is claimed, released or renewed by one
/// statement.
fn upgrade_v3(t: &str) -> Vec<String> {
    let mut statements = vec![
        format!("ALTER TABLE {t}_leases ADD COLUMN capacity INTEGER NOT NULL DEFAULT 0"),
        format!(
            "UPDATE {t}_leases SET capacity = COALESCE((SELECT l.capacity FROM {t} l \
             WHERE l.lock_key = {t}_leases.lock_key), 0)"
        ),
    ];
    statements.extend(triggers::create(t));
    statements
}

/// Version 3 to 4: nothing left (it made the waiters' queue of a layout since removed).
fn upgrade_v4(_: &str) -> Vec<String> {
    Vec::new()
}

/// Creates the lock table `t` and its schema stamp unless they exist, upgrades an older
/// one in place; refuses a table stamped by a newer version.
pub(super) async fn migrate(file: &SqliteFile, t: &str) -> Result<(), LockError> {
    let (pool, err) = (&file.pool, |e| file.error(e));
    let version = version_statement(t);
    // Look before reading the version: a missing table is not an error to log (and a file
    // that is not a database is reported as such, not taken for one without the table).
    let exists: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1 COLLATE NOCASE",
    )
    .bind(format!("{t}_schema"))
    .fetch_one(pool)
    .await
    .map_err(err)?;
    if exists > 0 {
        let mut conn = pool.acquire().await.map_err(err)?;
        if let Some(ready) = settled(t, stamp::<Sqlite>(&mut conn, &version).await.map_err(err)?) {
            return ready;
        }
    }
    // One migration at a time: the write lock from the first statement on, and the stamp
    // read again under it.
    let mut conn = pool.acquire().await.map_err(err)?;
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
    let version = DDL.run::<Sqlite>(&mut tx, t).await.map_err(err)?;
    tx.commit().await.map_err(err)?;
    check_version(t, version)
}

/// Version 4 to 5: the reservation's arrival, which orders long waits' marks.
fn upgrade_v5(t: &str) -> Vec<String> {
    vec![format!("ALTER TABLE {t} ADD COLUMN res_since INTEGER")]
}

/// Version 5 to 6: nothing on SQLite; the stamp moves with the other databases'.
fn upgrade_v6(_: &str) -> Vec<String> {
    Vec::new()
}

/// Version 6 to 7: nothing on SQLite. PostgreSQL and MySQL/MariaDB write a key's first lease
/// into its row; SQLite's claims stay on the leases table, one statement each way (its
/// triggers keep the row in step), which costs little more than the exclusive pair.
fn upgrade_v7(_: &str) -> Vec<String> {
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::DDL;

    #[test]
    fn what_a_table_holds_changes_only_with_the_schema_version() {
        crate::schema::assert_stored(&DDL, "SQLite", (7, "e81026743729441e5cd9f2ab"));
    }
}
