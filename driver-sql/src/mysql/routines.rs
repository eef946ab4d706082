//! MySQL's stored procedures: a shared claim, a lease release and a lease renewal, each one
//! `CALL` (one round trip) deciding inside the database (the claim rule's one copy for
//! MySQL/MariaDB, see docs/sql.md, "Shared claims"). Their SQL is
//! in `claim.sql`, `release_lease.sql` and `extend_lease.sql`, written for the default
//! table (see [`from_file`]).
//!
//! Each procedure is a transaction of its own (`START TRANSACTION` … `COMMIT`): called in
//! autocommit mode, its statements would otherwise commit one by one. It runs READ
//! COMMITTED (set for that one transaction), so the leases read after the key's row is
//! locked are the committed ones, and takes the locks in one order: the key's row first
//! (created free when missing), then the leases. Any error rolls the transaction back
//! before it reaches the caller (a deadlock or a lock wait timeout is then retried).
//!
//! Keys and owners are byte strings (`VARBINARY`, `BINARY`): compared byte for byte, as in
//! the tables. The answer is one row of integers, after the `COMMIT`.

use crate::statements::from_file;

/// Each procedure's name after the table, and its file.
const PROCEDURES: [(&str, &str); 3] = [
    ("claim", include_str!("claim.sql")),
    ("release_lease", include_str!("release_lease.sql")),
    ("extend_lease", include_str!("extend_lease.sql")),
];

/// The statements (re)creating the procedures of lock table `t`. MySQL has no
/// `CREATE OR REPLACE PROCEDURE`: each is dropped first.
pub(super) fn routines(t: &str) -> Vec<String> {
    (PROCEDURES.iter())
        .flat_map(|(name, file)| {
            [
                format!("DROP PROCEDURE IF EXISTS {t}_{name}"),
                from_file(file, t),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::{CLAIM_MARK, MARKER, RW};
    use super::*;
    use crate::shared::kind::KEPT;

    #[test]
    fn every_one_call_path_is_a_procedure_of_the_table() {
        let calls = super::super::statements::statements("locks").claims;
        let [claim, release, extend] = [calls.claim, calls.release, calls.extend];
        assert_eq!(&*claim.sql, "CALL locks_claim(?, ?, ?, ?, ?, ?)");
        assert_eq!(&*release.sql, "CALL locks_release_lease(?, ?)");
        assert_eq!(&*extend.sql, "CALL locks_extend_lease(?, ?, ?)");
        let created = routines("locks");
        for name in ["locks_claim", "locks_release_lease", "locks_extend_lease"] {
            assert!(created.contains(&format!("DROP PROCEDURE IF EXISTS {name}")));
            assert!(
                created
                    .iter()
                    .any(|s| s
                        .starts_with(&format!("CREATE PROCEDURE {name}(p_key VARBINARY(255), ")))
            );
        }
        for made in created {
            assert!(
                !made.contains("distlock_locks") && !made.contains("\n--"),
                "{made}"
            );
        }
    }

    /// The files spell out the values the rest of the driver names.
    #[test]
    fn the_files_spell_the_drivers_constants() {
        for (_, file) in PROCEDURES {
            assert!(file.contains(MARKER), "the marker owner {MARKER}");
        }
        let claim = PROCEDURES[0].1;
        assert!(claim.contains(&format!("p_weight = {RW} AND p_capacity = {RW}")));
        assert!(claim.contains(&format!("LAST_INSERT_ID({CLAIM_MARK})")));
        assert!(claim.contains(&format!("IF v_taken < {CLAIM_MARK} THEN")));
        assert!(claim.contains(&format!("SET v_by_res = {KEPT};")));
    }
}
