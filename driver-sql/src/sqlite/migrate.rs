//! Creates SQLite's lock table, or checks the one there.

use lockcore::LockError;
use sqlx::AssertSqlSafe;

use super::file::SqliteFile;
use crate::run::Run;
use crate::schema::{check_version, SCHEMA_VERSION};

/// Creates the lock table `t` and its schema stamp unless they exist; refuses a table
/// stamped by a newer version.
pub(super) async fn migrate(file: &SqliteFile, t: &str) -> Result<(), LockError> {
    let (pool, err) = (&file.pool, |e| file.error(e));
    let version_sql = format!("SELECT version FROM {t}_schema WHERE id = 1");
    // Look before reading the version: a missing table is not an error to log (and a file
    // that is not a database is reported as such, not taken for one without the table).
    let exists: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1 COLLATE NOCASE",
    )
    .bind(format!("{t}_schema"))
    .fetch_one(pool)
    .await
    .map_err(err)?;
    let version: Option<i64> = if exists > 0 {
        sqlx::query_scalar(AssertSqlSafe(version_sql.clone()))
            .fetch_optional(pool)
            .await
            .map_err(err)?
    } else {
        None
    };
    let version = match version {
        Some(v) => v,
        None => {
            let ddl = [
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\
                       lock_key BLOB NOT NULL PRIMARY KEY, \
                       owner BLOB NOT NULL, \
                       label TEXT NOT NULL, \
                       fence INTEGER NOT NULL, \
                       expires_at INTEGER NOT NULL\
                     ) WITHOUT ROWID"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {t}_schema (\
                       id INTEGER NOT NULL PRIMARY KEY, version INTEGER NOT NULL)"
                ),
                format!(
                    "INSERT OR IGNORE INTO {t}_schema (id, version) VALUES (1, {SCHEMA_VERSION})"
                ),
            ];
            for statement in ddl {
                sqlx::query(AssertSqlSafe(statement))
                    .execute(pool)
                    .await
                    .map_err(err)?;
            }
            sqlx::query_scalar(AssertSqlSafe(version_sql))
                .fetch_one(pool)
                .await
                .map_err(err)?
        }
    };
    check_version(t, version)
}
