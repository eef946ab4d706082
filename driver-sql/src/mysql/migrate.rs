//! Creates MySQL's lock table, or checks the one there.

use sqlx::mysql::MySqlConnection;

use super::My;
use crate::dialect::Dialect;
use crate::error::map_err;
use crate::open::Migration;
use crate::schema::{check_version, stamp, stamped, version_statement, Ddl};
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
};

/// Creates the lock table `t` and its schema stamp unless they exist; refuses a table
/// stamped by a newer version.
pub(super) fn migrate<'c>(conn: &'c mut MySqlConnection, t: &'c str) -> Migration<'c> {
    Box::pin(async move {
        let err = |e| map_err(My::NAME, e);
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
            if let Some(stamped) = stamp::<MySql>(conn, &version).await.map_err(err)? {
                return check_version(t, stamped);
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
        result?;
        let version = stamp::<MySql>(&mut *conn, &version).await;
        let version = version.and_then(stamped).map_err(err)?;
        check_version(t, version)
    })
}
