//! The lock table's schema version.

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use std::sync::Arc;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use lockcore::LockError;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use crate::{db::Db, run::Conn, statements::Call};

/// The version of the lock table layout this crate writes. A table stamped with a newer
/// version was created by a newer distlock and is refused rather than misused; an older one
/// is upgraded in place.
///
/// 1. The lock table.
/// 2. Shared claims: the key's capacity and reservation on the lock table, and a leases
///    table beside it.
/// 3. The one-call paths of shared claims (stored routines or triggers, per database).
/// 4. The waiters' queue of `fair` backends, a table beside the lock table.
/// 5. The reservation's arrival (`res_since`, µs since the epoch on the database's clock):
///    a long wait's mark is taken over by an earlier arrival
///    ([`ClaimRequest::waited`](lockcore::driver::ClaimRequest::waited)).
/// 6. The fair backends' routines (PostgreSQL, MySQL/MariaDB) drop only the lapsed places
///    ahead of a key's first live one, so an attempt's cost does not grow with the queue;
///    PostgreSQL's refusal carries the waiter's ticket, which releases name.
/// 7. A key's first lease inline in its row (PostgreSQL, MySQL/MariaDB): a claim that takes
///    a free key writes its lease into the row as the exclusive lock is written, and its
///    release and renewal are the exclusive statements; a second lease moves it to the
///    leases table. `lease_weight` and `lease_fence` (the grant that wrote it, so that a
///    later grant by an older driver is never taken for one). SQLite: unchanged.
pub const SCHEMA_VERSION: i64 = 7;

/// The version the tables are created with; upgrades bring them to [`SCHEMA_VERSION`].
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
const FIRST_VERSION: i64 = 1;

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

/// Whether a table stamped `version` is ready for this driver as it is (or refused as
/// newer): `None` when it needs the migration.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn settled(table: &str, version: Option<i64>) -> Option<Result<(), LockError>> {
    version
        .filter(|v| *v >= SCHEMA_VERSION)
        .map(|v| check_version(table, v))
}

/// A database's lock table and schema table: the column types (key, owner, label, fence,
/// expiry; id, version), what follows each table's column list, how the stamp is inserted
/// unless there is one (the verb before the table, what follows the values), and the
/// statements upgrading each version to the next for a table name (1 to 2, 2 to 3, and so on).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) struct Ddl {
    pub(crate) columns: [&'static str; 7],
    pub(crate) after: [&'static str; 2],
    pub(crate) insert: [&'static str; 2],
    pub(crate) upgrades: [fn(&str) -> Vec<String>; (SCHEMA_VERSION - FIRST_VERSION) as usize],
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
impl Ddl {
    /// The statements creating the tables of `t` and stamping them.
    fn statements(&self, t: &str) -> [String; 3] {
        let [key, owner, label, fence, expires_at, id, version] = self.columns;
        let [insert, on_conflict] = self.insert;
        [
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (lock_key {key} NOT NULL PRIMARY KEY, \
                 owner {owner} NOT NULL, label {label} NOT NULL, fence {fence} NOT NULL, \
                 expires_at {expires_at} NOT NULL){}",
                self.after[0]
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_schema (id {id} NOT NULL PRIMARY KEY, \
                 version {version} NOT NULL){}",
                self.after[1]
            ),
            format!("{insert} {t}_schema (id, version) VALUES (1, {FIRST_VERSION}){on_conflict}"),
        ]
    }

    /// Creates the tables of `t` unless they exist and upgrades them to
    /// [`SCHEMA_VERSION`], up to the first statement that fails; the caller keeps other
    /// migrations of the table out meanwhile. The version the table is stamped with then.
    pub(crate) async fn run<DB: Db>(
        &self,
        conn: &mut Conn<DB>,
        t: &str,
    ) -> Result<i64, sqlx::Error> {
        for statement in self.statements(t) {
            execute::<DB>(conn, statement).await?;
        }
        let version = version_statement(t);
        let found = stamp::<DB>(conn, &version).await.and_then(stamped)?;
        for (to, upgrade) in (FIRST_VERSION + 1..).zip(self.upgrades) {
            if found >= to {
                continue;
            }
            for statement in upgrade(t) {
                execute::<DB>(conn, statement).await?;
            }
            let restamp = format!("UPDATE {t}_schema SET version = {to} WHERE id = 1");
            execute::<DB>(conn, restamp).await?;
        }
        stamp::<DB>(conn, &version).await.and_then(stamped)
    }
}

/// Checks that what a `database` table of version [`SCHEMA_VERSION`] holds (tables, columns,
/// routines, triggers: every statement `ddl` runs to make one from nothing) is still what
/// `recorded` says that version holds: `(version, digest)`.
///
/// A table already stamped with a version never runs these statements again. A change to
/// them (a routine fixed, a column added) that keeps the version would reach new tables
/// only, and the tables of every running deployment would keep what they have. The change
/// needs a new version and an upgrade step that makes it.
#[cfg(all(test, any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
pub(crate) fn assert_stored(ddl: &Ddl, database: &str, recorded: (i64, &str)) {
    use sha2::{Digest, Sha256};
    let t = "distlock_locks";
    let mut hasher = Sha256::new();
    let upgrades = ddl.upgrades.iter().flat_map(|upgrade| upgrade(t));
    for statement in ddl.statements(t).into_iter().chain(upgrades) {
        hasher.update(statement.as_bytes());
        hasher.update(b"\n;\n");
    }
    let digest: String = hasher
        .finalize()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect();
    let (version, expected) = recorded;
    assert!(
        version == SCHEMA_VERSION,
        "SCHEMA_VERSION is now {SCHEMA_VERSION}: record ({SCHEMA_VERSION}, \"{digest}\") for \
         {database} here (recorded: version {version})"
    );
    assert!(
        expected == digest,
        "the statements making a {database} lock table of schema version {SCHEMA_VERSION} \
         changed: they digest to {digest}, not to the {expected} recorded for it.\n\
         A table already at version {SCHEMA_VERSION} never runs them again, so a change that \
         keeps the version would reach new tables only. Give it version {} with an upgrade \
         step that makes it (routines are made again in full), then record the digest this \
         test prints.",
        SCHEMA_VERSION + 1,
    );
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
/// Runs a DDL statement unprepared (MySQL does not prepare `CREATE PROCEDURE`).
async fn execute<DB: Db>(conn: &mut Conn<DB>, statement: String) -> Result<(), sqlx::Error> {
    DB::execute_text(conn, &statement.into()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_created_as_the_database_wants() {
        let ddl = Ddl {
            columns: [
                "BLOB", "BLOB", "TEXT", "INTEGER", "INTEGER", "INT", "BIGINT",
            ],
            after: [" WITHOUT ROWID", " ENGINE=InnoDB"],
            insert: ["INSERT INTO", " ON CONFLICT (id) DO NOTHING"],
            upgrades: [
                |_| Vec::new(),
                |_| Vec::new(),
                |_| Vec::new(),
                |_| Vec::new(),
                |_| Vec::new(),
                |_| Vec::new(),
            ],
        };
        assert_eq!(
            ddl.statements("t"),
            [
                "CREATE TABLE IF NOT EXISTS t (lock_key BLOB NOT NULL PRIMARY KEY, owner BLOB NOT \
                 NULL, label TEXT NOT NULL, fence INTEGER NOT NULL, expires_at INTEGER NOT NULL) \
                 WITHOUT ROWID",
                "CREATE TABLE IF NOT EXISTS t_schema (id INT NOT NULL PRIMARY KEY, version BIGINT \
                 NOT NULL) ENGINE=InnoDB",
                "INSERT INTO t_schema (id, version) VALUES (1, 1) ON CONFLICT (id) DO NOTHING",
            ]
        );
    }
}
