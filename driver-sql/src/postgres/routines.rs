//! PostgreSQL's shared claims: plpgsql functions beside the lock table that decide a claim
//! (the claim rule's one copy for PostgreSQL, see docs/sql.md, "Shared claims"), release a
//! lease or renew one inside the database, in one round trip, each taking the key's row
//! lock before its leases. Their SQL is in `claim.sql`, `release_lease.sql` and
//! `extend_lease.sql`, written for the default table (see [`from_file`]).
//!
//! Why functions and not one statement: a statement's subqueries and CTEs all read the
//! snapshot taken when the statement began, before it waited for the key's row lock, so
//! one statement locking the row and reading the leases could miss a lease committed while
//! it waited. Under READ COMMITTED every statement inside a VOLATILE plpgsql function takes
//! a snapshot of its own: the leases read after the row's lock is granted include every
//! lease committed before.
//!
//! The clock is `statement_timestamp()`, fixed for the calling statement: one call judges
//! every expiry at one instant, as the other statements do.

use crate::statements::from_file;

/// The name of lock table `t`'s claim function.
pub(super) fn claim_name(t: &str) -> String {
    format!("{t}_claim")
}

/// The name of lock table `t`'s lease release function.
pub(super) fn release_name(t: &str) -> String {
    format!("{t}_release_lease")
}

/// The name of lock table `t`'s lease renewal function.
pub(super) fn extend_name(t: &str) -> String {
    format!("{t}_extend_lease")
}

/// The functions' files: the claim, the lease release (which notifies the table's channel,
/// `<table>_released`) and the lease renewal.
const FILES: [&str; 3] = [
    include_str!("claim.sql"),
    include_str!("release_lease.sql"),
    include_str!("extend_lease.sql"),
];

/// The statements creating (or replacing) lock table `t`'s functions.
pub(super) fn routines(t: &str) -> Vec<String> {
    FILES.iter().map(|file| from_file(file, t)).collect()
}

#[cfg(test)]
mod tests {
    use super::super::statements::channel_name;
    use super::super::MARKER;
    use super::*;
    use crate::shared::kind::KEPT;

    #[test]
    fn each_function_is_made_for_the_table_under_its_name() {
        let [claim, release, extend] = [0, 1, 2].map(|i| routines("locks")[i].clone());
        for (made, name) in [
            (&claim, claim_name("locks")),
            (&release, release_name("locks")),
            (&extend, extend_name("locks")),
        ] {
            assert!(
                made.starts_with(&format!("CREATE OR REPLACE FUNCTION {name}(p_key bytea")),
                "{made}"
            );
            assert!(!made.contains("distlock_locks"), "{made}");
            assert!(!made.contains("\n--"), "comments are left out: {made}");
        }
        assert!(release.contains(&format!("pg_notify('{}'", channel_name("locks"))));
        assert!(claim.contains("FROM locks_leases s"));
    }

    /// The files spell out the values the rest of the driver names.
    #[test]
    fn the_files_spell_the_drivers_constants() {
        // `fence + 1`, saturating.
        let next = format!(", {}) + 1)", i64::MAX - 1);
        for file in FILES {
            assert!(file.contains(MARKER), "the marker owner {MARKER}");
            assert_eq!(file.matches("LEAST(").count(), file.matches(&next).count());
        }
        let rw = lockcore::driver::READ_WRITE_CAPACITY;
        assert!(FILES[0].contains(&format!("p_weight = {rw} AND p_capacity = {rw}")));
        assert!(FILES[0].contains(&format!("by_reservation := {KEPT};")));
    }
}
