//! The lock table's schema: the version this crate writes, the stamp that records it, and
//! the migration every database runs (each supplies its statements).

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use std::sync::Arc;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use lockcore::LockError;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use crate::{
    db::Db,
    run::Conn,
    store::{Call, Value},
};

/// The version of the lock table layout this crate writes, recorded in `<table>_version`:
/// 1, the first released schema. A table stamped with a newer version was made by a newer
/// distlock and is refused rather than misused.
///
/// Development builds stamped their tables 1 to 8 in another table, `<table>_schema`, whose
/// layouts no release reads: a table that has one is refused (see `docs/sql.md`), so a
/// development stamp can never pass for a released one.
pub const SCHEMA_VERSION: i64 = 1;

/// A database's lock table: how it tells that a table exists, and the statements making
/// everything a lock table holds.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) struct Schema {
    /// Answers 1 when the table named by its one bound (text) parameter exists, else 0.
    pub(crate) exists: &'static str,
    /// The statements making the tables of a lock table `t` (and its routines or
    /// triggers) unless they exist, each run as it is; the last two create and fill the
    /// stamp, so a table is stamped only once everything else is there.
    pub(crate) ddl: fn(&str) -> Vec<String>,
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
impl Schema {
    /// Whether the tables of `t` are ready as they are (stamped with [`SCHEMA_VERSION`]),
    /// `Ok(false)` when they are to be made; refused when they were made by a development
    /// build or a newer distlock. Changes nothing.
    pub(crate) async fn check<DB: Db>(
        &self,
        conn: &mut Conn<DB>,
        t: &str,
    ) -> Result<Result<bool, LockError>, sqlx::Error> {
        // Each table looked for before it is read: a query on a missing table is an error
        // the server logs, on every first start.
        if self
            .table_exists::<DB>(conn, &format!("{t}_schema"))
            .await?
        {
            let stamp = read::<DB>(
                conn,
                &format!("SELECT version FROM {t}_schema WHERE id = 1"),
                &[],
            )
            .await
            .ok()
            .flatten();
            return Ok(Err(development(t, stamp)));
        }
        if !self
            .table_exists::<DB>(conn, &format!("{t}_version"))
            .await?
        {
            return Ok(Ok(false));
        }
        Ok(match read::<DB>(conn, &version_statement(t), &[]).await? {
            Some(version) => check_version(t, version).map(|()| true),
            None => Ok(false),
        })
    }

    /// Makes the tables of `t` unless they exist, up to the first statement that fails; the
    /// caller keeps other migrations of the table out meanwhile. The version the table is
    /// stamped with then.
    pub(crate) async fn make<DB: Db>(
        &self,
        conn: &mut Conn<DB>,
        t: &str,
    ) -> Result<i64, sqlx::Error> {
        for statement in (self.ddl)(t) {
            // Unprepared: MySQL does not prepare `CREATE PROCEDURE`.
            DB::execute_text(conn, &statement.into()).await?;
        }
        read::<DB>(conn, &version_statement(t), &[])
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }

    async fn table_exists<DB: Db>(
        &self,
        conn: &mut Conn<DB>,
        table: &str,
    ) -> Result<bool, sqlx::Error> {
        Ok(read::<DB>(conn, self.exists, &[Value::Text(table)]).await? == Some(1))
    }
}

/// Refuses a table stamped with any version but this driver's.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn check_version(table: &str, version: i64) -> Result<(), LockError> {
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    let whose = if version > SCHEMA_VERSION {
        "newer than this driver's"
    } else {
        "which no distlock writes; this driver's is"
    };
    Err(LockError::config(format!(
        "lock table {table} has schema version {version}, {whose} {SCHEMA_VERSION}: \
         upgrade distlock or use another table"
    )))
}

/// The one line refusing lock table `t`, made by a development build (its stamp in
/// `<t>_schema`, if it could be read), with what to do.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn development(t: &str, stamp: Option<i64>) -> LockError {
    let stamp = stamp.map_or_else(String::new, |v| format!("stamp {v} in "));
    LockError::config(format!(
        "lock table {t} was made by a development build of distlock ({stamp}{t}_schema), \
         which this release does not use: drop its tables ({t}, {t}_leases, {t}_schema \
         and, if there, {t}_queue) or choose another table name (SqlOptions::table, or \
         distlock_table=NAME in the URL)"
    ))
}

/// The statement reading the version `<t>_version` is stamped with.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn version_statement(t: &str) -> String {
    format!("SELECT version FROM {t}_version WHERE id = 1")
}

/// The one integer `statement`, binding `values`, answers, if it answers a row.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
async fn read<DB: Db>(
    conn: &mut Conn<DB>,
    statement: &str,
    values: &[Value<'_>],
) -> Result<Option<i64>, sqlx::Error> {
    let statement = Arc::from(statement);
    let rows = DB::ints(
        conn,
        Call {
            statement: &statement,
            values,
        },
    )
    .await?;
    Ok(rows.first().and_then(|row| row.first()).copied())
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Checks that what a `database` table of version [`SCHEMA_VERSION`] holds (tables,
    /// columns, routines, triggers, the stamp: every statement `schema` runs to make one from
    /// nothing) is still what `recorded` says that version holds: `(version, digest)`.
    ///
    /// A table already stamped with a version never runs these statements again. A change to
    /// them (a routine fixed, a column added) that keeps the version would reach new tables
    /// only, and the tables of every running deployment would keep what they have. The change
    /// needs a new version and an upgrade step that makes it.
    pub(crate) fn assert_stored(schema: &Schema, database: &str, recorded: (i64, &str)) {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        for statement in (schema.ddl)("distlock_locks") {
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
             step that makes it, then record the digest this test prints.",
            SCHEMA_VERSION + 1,
        );
    }

    #[test]
    fn only_this_version_is_used() {
        assert!(check_version("t", SCHEMA_VERSION).is_ok());
        for other in [SCHEMA_VERSION + 1, 0] {
            let err = check_version("t", other).unwrap_err().to_string();
            assert!(err.contains(&format!("schema version {other}")), "{err}");
        }
    }

    #[test]
    fn a_development_table_is_refused_in_one_line_naming_what_to_do() {
        let err = development("locks", Some(7)).to_string();
        assert!(!err.contains('\n'), "{err}");
        for said in [
            "development build",
            "stamp 7 in locks_schema",
            "locks, locks_leases, locks_schema",
            "locks_queue",
            "SqlOptions::table",
            "distlock_table",
        ] {
            assert!(err.contains(said), "{said:?} missing from: {err}");
        }
        let err = development("locks", None).to_string();
        assert!(err.contains("(locks_schema)"), "{err}");
    }
}
