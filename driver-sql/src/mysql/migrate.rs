//! Creates MySQL's lock table, or checks the one there.

use sqlx::mysql::MySqlConnection;
use sqlx::MySql;

use super::routines::routines;
use super::My;
use crate::dialect::Dialect;
use crate::error::migration_failed;
use crate::open::Migration;
use crate::schema::{check_version, Schema, SCHEMA_VERSION};

/// MySQL's lock table: InnoDB, the label byte-exact UTF-8 text.
const SCHEMA: Schema = Schema {
    exists: "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = ?",
    ddl,
};

/// The lock table `t` (see `docs/sql.md`, "The table"), its leases, its procedures (see
/// `routines.rs`) and its stamp.
fn ddl(t: &str) -> Vec<String> {
    let rw = lockcore::driver::READ_WRITE_CAPACITY;
    let label = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";
    let mut statements = vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (lock_key VARBINARY(255) NOT NULL PRIMARY KEY, \
             owner BINARY(16) NOT NULL, label {label} NOT NULL, fence BIGINT NOT NULL, \
             expires_at DATETIME(6) NOT NULL, capacity BIGINT NOT NULL DEFAULT {rw}, \
             res_owner BINARY(16) NULL, res_weight BIGINT NOT NULL DEFAULT 0, \
             res_expires_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00', \
             res_since BIGINT NULL, lease_weight BIGINT NOT NULL DEFAULT 0, \
             lease_fence BIGINT NULL) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_leases (lock_key VARBINARY(255) NOT NULL, \
             owner BINARY(16) NOT NULL, label {label} NOT NULL, weight BIGINT NOT NULL, \
             fence BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
             PRIMARY KEY (lock_key, owner)) ENGINE=InnoDB"
        ),
    ];
    statements.extend(routines(t));
    statements.extend([
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_version (id INT NOT NULL PRIMARY KEY, \
             version BIGINT NOT NULL) ENGINE=InnoDB"
        ),
        format!("INSERT IGNORE INTO {t}_version (id, version) VALUES (1, {SCHEMA_VERSION})"),
    ]);
    statements
}

/// Creates the lock table `t` and its stamp unless they exist; refuses a table made by a
/// development build or stamped by a newer version.
pub(super) fn migrate<'c>(conn: &'c mut MySqlConnection, t: &'c str) -> Migration<'c> {
    Box::pin(async move {
        let err = |e| migration_failed(My::NAME, t, e);
        if SCHEMA.check::<MySql>(conn, t).await.map_err(err)?? {
            return Ok(());
        }
        // Serialise concurrent migrations of this table (the lock ends with the session, or
        // is released below). MySQL commits each DDL statement by itself: the stamp, made
        // last, says the rest is there.
        sqlx::query("SELECT GET_LOCK(CONCAT('distlock:', ?), 30)")
            .bind(t)
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        let result = SCHEMA.make::<MySql>(&mut *conn, t).await.map_err(err);
        let _ = sqlx::query("SELECT RELEASE_LOCK(CONCAT('distlock:', ?))")
            .bind(t)
            .execute(&mut *conn)
            .await;
        check_version(t, result?)
    })
}

#[cfg(test)]
mod tests {
    use super::SCHEMA;

    #[test]
    fn what_a_table_holds_changes_only_with_the_schema_version() {
        crate::schema::assert_stored(&SCHEMA, "MySQL/MariaDB", (1, "26601cda2d8b60828e19aa95"));
    }
}
