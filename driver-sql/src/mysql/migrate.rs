//! Creates MySQL's lock table, or checks the one there.

use sqlx::mysql::MySqlConnection;

use super::routines::routines;
use super::My;
use crate::dialect::Dialect;
use crate::error::migration_failed;
use crate::open::Migration;
use crate::schema::{check_version, settled, stamp, version_statement, Ddl};
use sqlx::MySql;

/// MySQL's tables: InnoDB, the label byte-exact UTF-8 text.
const DDL: Ddl = Ddl {
    columns: [
        "VARBINARY(255)",
        "BINARY(16)",
        "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        "BIGINT",
        "DATETIME(6)",
        "INT",
        "BIGINT",
    ],
    after: [" ENGINE=InnoDB"; 2],
    insert: ["INSERT IGNORE INTO", ""],
    upgrades: [
        upgrade, upgrade_v3, upgrade_v4, upgrade_v5, upgrade_v6, upgrade_v7,
    ],
};

/// Version 1 to 2: the key's capacity and reservation, and the leases table. (MySQL has no
/// `ADD COLUMN IF NOT EXISTS`: the migration lock and the stamp read under it keep this to
/// one run.)
fn upgrade(t: &str) -> Vec<String> {
    vec![
        format!(
            "ALTER TABLE {t} ADD COLUMN capacity BIGINT NOT NULL DEFAULT {}, \
             ADD COLUMN res_owner BINARY(16) NULL, \
             ADD COLUMN res_weight BIGINT NOT NULL DEFAULT 0, \
             ADD COLUMN res_expires_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00'",
            lockcore::driver::READ_WRITE_CAPACITY
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_leases (lock_key VARBINARY(255) NOT NULL, \
             owner BINARY(16) NOT NULL, \
             label VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
             weight BIGINT NOT NULL, fence BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
             PRIMARY KEY (lock_key, owner)) ENGINE=InnoDB"
        ),
    ]
}

/// Creates the lock table `t` and its schema stamp unless they exist, upgrades an older
/// one in place; refuses a table stamped by a newer version.
pub(super) fn migrate<'c>(conn: &'c mut MySqlConnection, t: &'c str) -> Migration<'c> {
    Box::pin(async move {
        let err = |e| migration_failed(My::NAME, t, e);
        let version = version_statement(t);
        // Look before reading the version: a query on a missing table would be an error logged
        // on every first start.
        let exists: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = ?",
        )
        .bind(format!("{t}_schema"))
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
        if exists > 0 {
            if let Some(ready) = settled(t, stamp::<MySql>(conn, &version).await.map_err(err)?) {
                return ready;
            }
        }
        // Serialise concurrent migrations of this table (the lock ends with the session, or
        // is released below).
        sqlx::query("SELECT GET_LOCK(CONCAT('distlock:', ?), 30)")
            .bind(t)
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        let result = DDL.run::<MySql>(&mut *conn, t).await.map_err(err);
        let _ = sqlx::query("SELECT RELEASE_LOCK(CONCAT('distlock:', ?))")
            .bind(t)
            .execute(&mut *conn)
            .await;
        check_version(t, result?)
    })
}

/// Version 2 to 3: the one-call paths of shared claims, stored procedures (see
/// `routines.rs`).
fn upgrade_v3(t: &str) -> Vec<String> {
    routines(t)
}

/// Version 3 to 4: nothing left (it made the waiters' queue of a layout since removed).
fn upgrade_v4(_: &str) -> Vec<String> {
    Vec::new()
}

/// Version 4 to 5: the reservation's arrival, which orders long waits' marks.
fn upgrade_v5(t: &str) -> Vec<String> {
    vec![format!("ALTER TABLE {t} ADD COLUMN res_since BIGINT NULL")]
}

/// Version 5 to 6: nothing left (it remade the queue's procedure).
fn upgrade_v6(_: &str) -> Vec<String> {
    Vec::new()
}

/// Version 6 to 7: a key's first lease inline in its row (`lease_weight`, and `lease_fence`
/// naming the grant that wrote it; see `inline`), and the claim procedure that takes a free
/// key so in one statement.
fn upgrade_v7(t: &str) -> Vec<String> {
    let mut statements = vec![format!(
        "ALTER TABLE {t} ADD COLUMN lease_weight BIGINT NOT NULL DEFAULT 0, \
         ADD COLUMN lease_fence BIGINT NULL"
    )];
    statements.extend(routines(t));
    statements
}

#[cfg(test)]
mod tests {
    use super::DDL;

    #[test]
    fn what_a_table_holds_changes_only_with_the_schema_version() {
        crate::schema::assert_stored(&DDL, "MySQL/MariaDB", (7, "fe07613e5f54138c107d7714"));
    }
}
