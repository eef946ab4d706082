//! Creates MySQL's lock table, or checks the one there.

use lockcore::LockError;
use sqlx::mysql::MySqlConnection;
use sqlx::AssertSqlSafe;

use super::My;
use crate::db::BoxFuture;
use crate::dialect::Dialect;
use crate::error::map_err;
use crate::schema::{
    check_version, create_tables, stamp, stamped, version_statement, SCHEMA_VERSION,
};
use sqlx::MySql;

/// The label column: byte-exact UTF-8 text.
const LABEL: &str = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";

/// Creates the lock table `t` and its schema stamp unless they exist; refuses a table
/// stamped by a newer version.
pub(super) fn migrate<'c>(
    conn: &'c mut MySqlConnection,
    t: &'c str,
) -> BoxFuture<'c, Result<(), LockError>> {
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
        let [table, schema] = create_tables(
            t,
            [
                "VARBINARY(255)",
                "BINARY(16)",
                LABEL,
                "BIGINT",
                "DATETIME(6)",
            ],
            ["INT", "BIGINT"],
            [" ENGINE=InnoDB"; 2],
        );
        let ddl = [
            table,
            schema,
            format!("INSERT IGNORE INTO {t}_schema (id, version) VALUES (1, {SCHEMA_VERSION})"),
        ];
        let mut result = Ok(());
        for statement in ddl {
            if let Err(e) = sqlx::query(AssertSqlSafe(statement))
                .execute(&mut *conn)
                .await
            {
                result = Err(err(e));
                break;
            }
        }
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
