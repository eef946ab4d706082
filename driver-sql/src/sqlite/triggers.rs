//! The triggers that keep a key's row in the lock table in step with its leases, so that
//! one statement on the leases table claims, releases or renews a lease. Their SQL is in
//! `triggers.sql`, written for the default table (see [`from_file`]), which says what each
//! does.

use crate::statements::from_file;

/// The triggers of the lock table, each dropped and created again.
const TRIGGERS: &str = include_str!("triggers.sql");

/// The statements (re)creating the triggers of lock table `t`: one text of statements.
pub(super) fn create(t: &str) -> Vec<String> {
    vec![from_file(TRIGGERS, t)]
}

#[cfg(test)]
mod tests {
    use super::super::statements::{MARKER, NOW_US};
    use super::*;

    #[test]
    fn the_four_triggers_are_made_for_the_table() {
        let [made] = <[String; 1]>::try_from(create("locks")).expect("one text");
        for name in [
            "lease_granted",
            "lease_regranted",
            "lease_renewed",
            "lease_released",
        ] {
            assert!(made.contains(&format!("DROP TRIGGER IF EXISTS locks_{name};")));
            assert!(made.contains(&format!("CREATE TRIGGER locks_{name} AFTER ")));
        }
        assert!(
            !made.contains("distlock_locks") && !made.contains("--"),
            "{made}"
        );
    }

    /// The file spells the marker owner and the clock as the statements do.
    #[test]
    fn the_file_spells_the_drivers_constants() {
        assert!(TRIGGERS.contains(MARKER));
        assert!(TRIGGERS.contains(NOW_US));
    }
}
