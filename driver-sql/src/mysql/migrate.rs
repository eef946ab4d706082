//! Creates MySQL's lock table, or checks the one there.

use sqlx::mysql::MySqlConnection;
use sqlx::MySql;

use super::My;
use crate::dialect::Dialect;
use crate::error::migration_failed;
use crate::open::Migration;
use crate::schema::{check_version, Schema};
use crate::store::from_file;

/// MySQL's lock table: InnoDB, the label byte-exact UTF-8 text.
const SCHEMA: Schema = Schema {
    exists: "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = ?",
    ddl,
};

/// The lock table `t` and its leases (`tables.sql`), its procedures and its stamp
/// (`version.sql`), each file run as one text of statements; a procedure, whose body holds
/// `;`, is dropped and made by a text of its own (MySQL has no `CREATE OR REPLACE
/// PROCEDURE`).
fn ddl(t: &str) -> Vec<String> {
    let mut statements = vec![from_file(TABLES, t)];
    for (name, file) in PROCEDURES {
        statements.push(format!("DROP PROCEDURE IF EXISTS {t}_{name}"));
        statements.push(from_file(file, t));
    }
    statements.push(from_file(VERSION, t));
    statements
}

const TABLES: &str = include_str!("../store/mysql/tables.sql");

/// The procedures, each one `CALL` (one round trip) deciding inside the database: a shared
/// claim, the claims of a set, a lease release and a lease renewal.
///
/// The claim rule's one copy for MySQL/MariaDB (see docs/sql.md, "Shared claims") is
/// `<table>_decide`, which starts and ends no transaction: `<table>_claim` and
/// `<table>_claim_set` run it in a transaction of their own. Every procedure but `decide` is
/// a transaction of its own (`START TRANSACTION` … `COMMIT`): called in autocommit mode, its
/// statements would otherwise commit one by one. Each transaction runs READ COMMITTED (set
/// for that one transaction), so the leases read after a key's row is locked are the
/// committed ones, and takes the locks in one order: the key's row first (created free when
/// missing), then the leases. Any error rolls the transaction back before it reaches the
/// caller (a deadlock or a lock wait timeout is then retried). Keys and owners are byte
/// strings (`VARBINARY`, `BINARY`): compared byte for byte, as in the tables. The answer is
/// rows of integers.
const PROCEDURES: [(&str, &str); 5] = [
    ("decide", include_str!("../store/mysql/decide.sql")),
    ("claim", include_str!("../store/mysql/claim.sql")),
    ("claim_set", include_str!("../store/mysql/claim_set.sql")),
    (
        "release_lease",
        include_str!("../store/mysql/release_lease.sql"),
    ),
    (
        "extend_lease",
        include_str!("../store/mysql/extend_lease.sql"),
    ),
];

/// The stamp, [`SCHEMA_VERSION`](crate::SCHEMA_VERSION).
const VERSION: &str = include_str!("../store/mysql/version.sql");

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
    use super::super::{CLAIM_MARK, MARKER, RW};
    use super::*;
    use crate::backend::claims::kind::KEPT;

    #[test]
    fn every_procedure_is_made_for_the_table() {
        let made = ddl("locks");
        for (name, _) in PROCEDURES {
            let name = format!("locks_{name}");
            assert!(made.contains(&format!("DROP PROCEDURE IF EXISTS {name}")));
            let prefix = format!("CREATE PROCEDURE {name}(p_key");
            assert!(made.iter().any(|s| s.starts_with(&prefix)), "{name}");
        }
        for made in made {
            assert!(
                !made.contains("distlock_locks") && !made.contains("\n--"),
                "{made}"
            );
        }
        let rw = lockcore::driver::READ_WRITE_CAPACITY;
        assert!(TABLES.contains(&format!("capacity BIGINT NOT NULL DEFAULT {rw},")));
        let stamp = format!("VALUES (1, {})", crate::schema::SCHEMA_VERSION);
        assert!(VERSION.contains(&stamp));
    }

    /// The procedure files spell out the values the rest of the driver names.
    #[test]
    fn the_procedure_files_spell_the_drivers_constants() {
        let file = |name| PROCEDURES.iter().find(|(n, _)| *n == name).map(|(_, f)| *f);
        for name in ["decide", "release_lease", "extend_lease"] {
            let file = file(name).unwrap();
            assert!(file.contains(MARKER), "the marker owner {MARKER} in {name}");
        }
        let (claim, decide) = (file("claim").unwrap(), file("decide").unwrap());
        for file in [claim, decide] {
            assert!(file.contains(&format!("p_weight = {RW} AND p_capacity = {RW}")));
        }
        assert!(claim.contains(&format!("LAST_INSERT_ID({CLAIM_MARK})")));
        assert!(claim.contains(&format!("IF v_taken < {CLAIM_MARK} THEN")));
        assert!(decide.contains(&format!("SET v_by_res = {KEPT};")));
    }

    #[test]
    fn what_a_table_holds_changes_only_with_the_schema_version() {
        crate::schema::tests::assert_stored(
            &SCHEMA,
            "MySQL/MariaDB",
            (1, "84b0908fead928e7b10034ec"),
        );
    }
}
