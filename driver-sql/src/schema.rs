//! The lock table's schema version.

use std::sync::Arc;

use lockcore::LockError;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use crate::{db::Db, run::Conn, statements::Call};

/// The version of the lock table layout this crate writes. A table stamped with a newer
/// version was created by a newer distlock and is refused rather than misused.
pub const SCHEMA_VERSION: i64 = 1;

/// Refuses a table stamped by a newer version of the driver.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn check_version(table: &str, version: i64) -> Result<(), LockError> {
    if version > SCHEMA_VERSION {
        return Err(LockError::config(format!(
            "lock table {table} has schema version {version}, newer than this driver's \
             {SCHEMA_VERSION}: upgrade distlock or use another table"
        )));
    }
    Ok(())
}

/// The statement reading the version the schema table of `t` is stamped with.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn version_statement(t: &str) -> Arc<str> {
    format!("SELECT version FROM {t}_schema WHERE id = 1").into()
}

/// The version read with `version` (see [`version_statement`]), if the table has one.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) async fn stamp<DB: Db>(
    conn: &mut Conn<DB>,
    version: &Arc<str>,
) -> Result<Option<i64>, sqlx::Error> {
    let call = Call {
        statement: version,
        values: &[],
    };
    DB::scalar(conn, call).await
}

/// A stamp that must be there (just written).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn stamped(version: Option<i64>) -> Result<i64, sqlx::Error> {
    version.ok_or(sqlx::Error::RowNotFound)
}

/// The DDL of the lock table `t` and its schema table, from the database's column types:
/// `lock` for key, owner, label, fence and expiry, `schema` for id and version, and what
/// follows each table's column list (`after`: table options).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn create_tables(
    t: &str,
    lock: [&str; 5],
    schema: [&str; 2],
    after: [&str; 2],
) -> [String; 2] {
    let [key, owner, label, fence, expires_at] = lock;
    let [id, version] = schema;
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (lock_key {key} NOT NULL PRIMARY KEY, \
             owner {owner} NOT NULL, label {label} NOT NULL, fence {fence} NOT NULL, \
             expires_at {expires_at} NOT NULL){}",
            after[0]
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_schema (id {id} NOT NULL PRIMARY KEY, \
             version {version} NOT NULL){}",
            after[1]
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_created_as_each_database_wants() {
        let pg = create_tables(
            "t",
            ["BYTEA", "BYTEA", "TEXT", "BIGINT", "TIMESTAMPTZ"],
            ["INTEGER", "BIGINT"],
            ["", ""],
        );
        assert_eq!(
            pg,
            [
                "CREATE TABLE IF NOT EXISTS t (lock_key BYTEA NOT NULL PRIMARY KEY, owner BYTEA \
                 NOT NULL, label TEXT NOT NULL, fence BIGINT NOT NULL, expires_at TIMESTAMPTZ \
                 NOT NULL)",
                "CREATE TABLE IF NOT EXISTS t_schema (id INTEGER NOT NULL PRIMARY KEY, version \
                 BIGINT NOT NULL)"
            ]
        );
        let mysql = create_tables(
            "t",
            [
                "VARBINARY(255)",
                "BINARY(16)",
                "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
                "BIGINT",
                "DATETIME(6)",
            ],
            ["INT", "BIGINT"],
            [" ENGINE=InnoDB"; 2],
        );
        assert_eq!(
            mysql,
            [
                "CREATE TABLE IF NOT EXISTS t (lock_key VARBINARY(255) NOT NULL PRIMARY KEY, owner \
                 BINARY(16) NOT NULL, label VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin \
                 NOT NULL, fence BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB",
                "CREATE TABLE IF NOT EXISTS t_schema (id INT NOT NULL PRIMARY KEY, version BIGINT \
                 NOT NULL) ENGINE=InnoDB"
            ]
        );
        let sqlite = create_tables(
            "t",
            ["BLOB", "BLOB", "TEXT", "INTEGER", "INTEGER"],
            ["INTEGER", "INTEGER"],
            [" WITHOUT ROWID", ""],
        );
        assert_eq!(
            sqlite,
            [
                "CREATE TABLE IF NOT EXISTS t (lock_key BLOB NOT NULL PRIMARY KEY, owner BLOB NOT \
                 NULL, label TEXT NOT NULL, fence INTEGER NOT NULL, expires_at INTEGER NOT NULL) \
                 WITHOUT ROWID",
                "CREATE TABLE IF NOT EXISTS t_schema (id INTEGER NOT NULL PRIMARY KEY, version \
                 INTEGER NOT NULL)"
            ]
        );
    }
}
