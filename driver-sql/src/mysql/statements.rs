//! MySQL's lock statements: `lock.sql` and `leases.sql`, and the procedures they call.

use crate::store::{load, BatchRenewal, Statements};

/// The server's UTC clock, evaluated once per statement. `NOW()` would follow the session
/// time zone of a pool the application may have configured differently.
const NOW: &str = "UTC_TIMESTAMP(6)";

const LOCK: &str = include_str!("../store/mysql/lock.sql");
const LEASES: &str = include_str!("../store/mysql/leases.sql");

/// The lock table `t`'s statements.
pub(super) fn statements(t: &str) -> Statements {
    load(LOCK, LEASES, t, extend_many)
}

/// The batch renewal of `rows` rows (see [`Statements::extend_many`]): an `UPDATE` joined
/// with the bound rows, then a `SELECT` of the rows it left live and the owner's (a row it
/// did not renew is expired or another owner's, so the two agree without a transaction).
fn extend_many(t: &str, rows: usize) -> BatchRenewal {
    let mut bound = String::from("SELECT ? AS i, ? AS k, ? AS o, ? AS d");
    for _ in 1..rows {
        bound.push_str(" UNION ALL SELECT ?, ?, ?, ?");
    }
    // Each bound row finds its row by the primary key, whatever the table's statistics
    // say. Left to them, MariaDB read the whole table and compared each row with every
    // bound row (6 s per batch of 1,024 at 61,000 rows) after statistics taken while
    // the table was nearly empty (`ANALYZE TABLE … PERSISTENT FOR ALL`: they are never
    // refreshed by themselves and estimate 0 rows), and neither the join order nor
    // the index alone, nor the keys as an `IN` list, kept it from that plan. Reading
    // the whole table, the `UPDATE` also waited for any row another transaction held
    // locked (a small table is read whole), not only for the batch's own.
    let joined = format!(
        "({bound}) b STRAIGHT_JOIN {t} l FORCE INDEX (PRIMARY) \
         ON l.lock_key = b.k AND l.owner = b.o"
    );
    BatchRenewal {
        update: Some(
            format!(
                "UPDATE {joined} \
                 SET l.expires_at = GREATEST(l.expires_at, {NOW} + INTERVAL b.d MICROSECOND) \
                 WHERE l.expires_at > {NOW}"
            )
            .into(),
        ),
        answer: format!("SELECT b.i, l.fence FROM {joined} WHERE l.expires_at > {NOW}").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{CLAIM_MARK, HELD_MARK, MARKER};
    use super::*;

    /// Every statement is in its file, made for the table, spelling the driver's values.
    #[test]
    fn every_statement_is_loaded_for_the_table() {
        let s = statements("locks");
        crate::store::assert_loaded(&s);
        let c = &s.claims;
        assert_eq!(&*c.claim.sql, "CALL locks_claim(?, ?, ?, ?, ?, ?)");
        let set = c.claim_set.as_ref().map(|b| (&*b.sql, b.params.first()));
        let set = set.filter(|(sql, _)| *sql == "CALL locks_claim_set(?, ?, ?, ?, ?, ?)");
        assert_eq!(
            set.map(|(_, keys)| keys),
            Some(Some(&crate::store::P::Keys))
        );
        assert_eq!(&*c.release.sql, "CALL locks_release_lease(?, ?)");
        assert_eq!(&*c.extend.sql, "CALL locks_extend_lease(?, ?, ?)");
        let batch = format!("LIMIT {}", crate::gc::GC_BATCH);
        assert!(s.gc.ends_with(&batch) && c.gc.ends_with(&batch));
        for mark in [CLAIM_MARK, HELD_MARK] {
            assert!(s.acquire.sql.contains(&format!("LAST_INSERT_ID({mark}")));
        }
        let rw = lockcore::driver::READ_WRITE_CAPACITY;
        assert!(s.mark.sql.contains(&format!("res_weight = {rw}")));
        assert!(LOCK.contains(MARKER) && LEASES.contains(MARKER));
    }
}
