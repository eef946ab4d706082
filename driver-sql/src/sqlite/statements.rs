//! SQLite's lock statements: `lock.sql` and `leases.sql`.

use crate::store::{load, BatchRenewal, Statements};

/// SQLite's own clock in whole microseconds (millisecond resolution). `'now'` is fixed for
/// the duration of one statement step, so every use in a statement sees the same instant.
pub(super) const NOW_US: &str = "(CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)";

/// The owner of a key's row while shared leases hold it, as the files spell it: 16 zero
/// bytes, which no random owner token is.
#[cfg(test)]
pub(super) const MARKER: &str = "X'00000000000000000000000000000000'";

const LOCK: &str = include_str!("../store/sqlite/lock.sql");
const LEASES: &str = include_str!("../store/sqlite/leases.sql");

/// The lock table `t`'s statements.
pub(super) fn statements(t: &str) -> Statements {
    load(LOCK, LEASES, t, extend_many)
}

/// The batch renewal of `rows` rows (see [`Statements::extend_many`]): an `UPDATE … FROM`
/// the bound rows, then a `SELECT` of the rows it left live and the owner's (a row it did
/// not renew is expired or another owner's, so the two agree without a transaction).
fn extend_many(t: &str, rows: usize) -> BatchRenewal {
    let now = NOW_US;
    // Rows of `VALUES`, not a compound `SELECT`: SQLite allows at most 500 terms in one.
    let values = vec!["(?, ?, ?, ?)"; rows].join(", ");
    let bound = format!("WITH b(i, k, o, d) AS (VALUES {values})");
    BatchRenewal {
        update: Some(
            format!(
                "{bound} UPDATE {t} AS l SET expires_at = MAX(l.expires_at, {now} + b.d) \
                 FROM b WHERE l.lock_key = b.k AND l.owner = b.o AND l.expires_at > {now}"
            )
            .into(),
        ),
        answer: format!(
            "{bound} SELECT b.i, l.fence FROM {t} l JOIN b \
             ON l.lock_key = b.k AND l.owner = b.o WHERE l.expires_at > {now}"
        )
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every statement is in its file, made for the table, spelling the driver's values.
    #[test]
    fn every_statement_is_loaded_for_the_table() {
        let s = statements("locks");
        crate::store::assert_loaded(&s);
        let c = &s.claims;
        let batch = format!("LIMIT {})", crate::gc::GC_BATCH);
        assert!(s.gc.contains(&batch) && c.gc.contains(&batch));
        let rw = lockcore::driver::READ_WRITE_CAPACITY;
        assert!(s.mark.sql.contains(&format!("res_weight = {rw}")));
        for file in [LOCK, LEASES] {
            assert!(file.contains(NOW_US.trim_matches(['(', ')'])) && file.contains(MARKER));
        }
    }
}
