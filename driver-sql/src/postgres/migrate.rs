//! Creates PostgreSQL's lock table, or checks the one there.

use sqlx::postgres::PgConnection;
use sqlx::Postgres;

use super::Pg;
use crate::dialect::Dialect;
use crate::error::migration_failed;
use crate::open::Migration;
use crate::schema::{check_version, Schema};
use crate::store::from_file;

/// PostgreSQL's lock table.
const SCHEMA: Schema = Schema {
    exists: "SELECT CASE WHEN to_regclass($1::text) IS NULL THEN 0 ELSE 1 END::bigint",
    ddl,
};

/// The lock table `t` and its leases (`tables.sql`), its functions and its stamp
/// (`version.sql`), each file run as one text of statements.
fn ddl(t: &str) -> Vec<String> {
    [
        TABLES,
        GATE,
        CLAIM,
        CLAIM_SET,
        RELEASE_LEASE,
        EXTEND_LEASE,
        VERSION,
    ]
    .iter()
    .map(|file| from_file(file, t))
    .collect()
}

/// The lock table and its leases.
const TABLES: &str = include_str!("../store/postgres/tables.sql");

/// The gate of a key, which a lock inside a transaction holds and every claim passes.
const GATE: &str = include_str!("../store/postgres/gate.sql");

/// The functions that decide a claim (the claim rule's one copy for PostgreSQL, see
/// docs/sql.md, "Shared claims"), release a lease (and NOTIFY) or renew one, in one round
/// trip each, the key's row lock taken before its leases are read.
///
/// Why functions and not one statement: a statement's subqueries and CTEs all read the
/// snapshot taken when the statement began, before it waited for the key's row lock, so
/// one statement locking the row and reading the leases could miss a lease committed while
/// it waited. Under READ COMMITTED every statement inside a VOLATILE plpgsql function takes
/// a snapshot of its own: the leases read after the row's lock is granted include every
/// lease committed before. The clock is `statement_timestamp()`, fixed for the calling
/// statement: one call judges every expiry at one instant.
const CLAIM: &str = include_str!("../store/postgres/claim.sql");
/// A set's claims in one call: the claim function per key, all undone at the first key
/// not granted (a subtransaction rolled back).
const CLAIM_SET: &str = include_str!("../store/postgres/claim_set.sql");
const RELEASE_LEASE: &str = include_str!("../store/postgres/release_lease.sql");
const EXTEND_LEASE: &str = include_str!("../store/postgres/extend_lease.sql");

/// The stamp, [`SCHEMA_VERSION`](crate::SCHEMA_VERSION).
const VERSION: &str = include_str!("../store/postgres/version.sql");

/// Creates the lock table `t` and its stamp unless they exist; refuses a table made by a
/// development build or stamped by a newer version.
pub(super) fn migrate<'c>(conn: &'c mut PgConnection, t: &'c str) -> Migration<'c> {
    Box::pin(async move {
        use sqlx::Connection;
        let err = |e| migration_failed(Pg::NAME, t, e);
        if SCHEMA.check::<Postgres>(conn, t).await.map_err(err)?? {
            return Ok(());
        }
        let mut tx = conn.begin().await.map_err(err)?;
        // Concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog: serialise
        // the migrations of this table.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('distlock migration ' || $1))")
            .bind(t)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let version = SCHEMA.make::<Postgres>(&mut *tx, t).await.map_err(err)?;
        tx.commit().await.map_err(err)?;
        check_version(t, version)
    })
}

#[cfg(test)]
mod tests {
    use super::super::MARKER;
    use super::*;
    use crate::backend::claims::kind::KEPT;

    #[test]
    fn each_function_is_made_for_the_table_under_its_name() {
        for (file, name) in [
            (CLAIM, "locks_claim"),
            (RELEASE_LEASE, "locks_release_lease"),
            (EXTEND_LEASE, "locks_extend_lease"),
        ] {
            let made = from_file(file, "locks");
            assert!(
                made.starts_with(&format!("CREATE OR REPLACE FUNCTION {name}(p_key bytea")),
                "{made}"
            );
            assert!(!made.contains("distlock_locks"), "{made}");
            assert!(!made.contains("\n--"), "comments are left out: {made}");
        }
        let set = from_file(CLAIM_SET, "locks");
        assert!(set.starts_with("CREATE OR REPLACE FUNCTION locks_claim_set(p_keys bytea"));
        assert!(set.contains("FROM locks_claim(substring(p_keys") && !set.contains("\n--"));
        assert!(from_file(RELEASE_LEASE, "locks").contains("pg_notify('locks_released'"));
        assert!(from_file(CLAIM, "locks").contains("FROM locks_leases s"));
    }

    /// The function files spell out the values the rest of the driver names.
    #[test]
    fn the_function_files_spell_the_drivers_constants() {
        // `fence + 1`, saturating.
        let next = format!(", {}) + 1)", i64::MAX - 1);
        for file in [CLAIM, RELEASE_LEASE, EXTEND_LEASE] {
            assert!(file.contains(MARKER), "the marker owner {MARKER}");
            assert_eq!(file.matches("LEAST(").count(), file.matches(&next).count());
        }
        let rw = lockcore::driver::READ_WRITE_CAPACITY;
        assert!(CLAIM.contains(&format!("p_weight = {rw} AND p_capacity = {rw}")));
        assert!(CLAIM.contains(&format!("by_reservation := {KEPT};")));
        // A key a transaction holds: try again after TRANSACTION_POLL.
        let poll = crate::transaction::TRANSACTION_POLL.as_micros();
        assert!(CLAIM.contains(&format!("remaining := {poll};")));
    }

    /// The files spell out the values the rest of the driver names.
    #[test]
    fn the_files_spell_the_drivers_constants() {
        let rw = lockcore::driver::READ_WRITE_CAPACITY;
        assert!(super::TABLES.contains(&format!("capacity BIGINT NOT NULL DEFAULT {rw},")));
        let stamp = format!("VALUES (1, {})", crate::schema::SCHEMA_VERSION);
        assert!(super::VERSION.contains(&stamp));
    }

    #[test]
    fn what_a_table_holds_changes_only_with_the_schema_version() {
        crate::schema::tests::assert_stored(&SCHEMA, "PostgreSQL", (1, "8d73b9a30b79e15c825cc5a2"));
    }
}
