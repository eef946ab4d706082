//! Creates SQLite's lock table, or checks the one there.

use lockcore::LockError;

use super::file::SqliteFile;
use crate::run::Run;
use crate::schema::{check_version, stamp, stamped, version_statement, Ddl};
use sqlx::Sqlite;

/// SQLite's tables: the lock table without row ids (its key is the primary key).
const DDL: Ddl = Ddl {
    columns: [
        "BLOB", "BLOB", "TEXT", "INTEGER", "INTEGER", "INTEGER", "INTEGER",
    ],
    after: [" WITHOUT ROWID", ""],
    insert: ["INSERT OR IGNORE INTO", ""],
};

/// Creates the lock table `t` and its schema stamp unless they exist; refuses a table
/// stamped by a newer version.
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
    let found = if exists > 0 {
        let mut conn = pool.acquire().await.map_err(err)?;
        stamp::<Sqlite>(&mut conn, &version).await.map_err(err)?
    } else {
        None
    };
    let version = match found {
        Some(v) => v,
        None => {
            let mut conn = pool.acquire().await.map_err(err)?;
            DDL.run::<Sqlite>(&mut conn, t).await.map_err(err)?;
            let version = stamp::<Sqlite>(&mut conn, &version).await;
            version.and_then(stamped).map_err(err)?
        }
    };
    check_version(t, version)
}
