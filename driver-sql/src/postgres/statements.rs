//! PostgreSQL's lock statements: `lock.sql` and `leases.sql`, and the functions they call.

use crate::store::{load, named, BatchRenewal, Statements};

/// The server's clock for this statement: fixed for the statement's whole run.
const NOW: &str = "statement_timestamp()";

const LOCK: &str = include_str!("../store/postgres/lock.sql");
const LEASES: &str = include_str!("../store/postgres/leases.sql");

/// The lock table `t`'s statements.
pub(super) fn statements(t: &str) -> Statements {
    Statements {
        transaction_hold: named(super::transaction::TRANSACTION, "held", t),
        ..load(LOCK, LEASES, t, extend_many)
    }
}

/// The batch renewal of `rows` rows (see [`Statements::extend_many`]).
fn extend_many(t: &str, rows: usize) -> BatchRenewal {
    let values: Vec<String> = (0..rows)
        .map(|r| {
            let p = 4 * r;
            format!(
                "(${}::bigint, ${}::bytea, ${}::bytea, ${}::bigint)",
                p + 1,
                p + 2,
                p + 3,
                p + 4
            )
        })
        .collect();
    // Planned by the table's statistics alone, the batch can take 20 s: statistics
    // taken while every row had expired (autoanalyze after a release of everything)
    // estimate one live row, and the planner scans the whole table and compares each
    // row with every batch row (a nested loop: 1,024 × 100,000 comparisons once the
    // rows are held again), every pool connection stuck in one, every hold lost. So
    // the keys come once more as a list the primary key answers, and the expiry test
    // is an expression the statistics do not cover (a third of the rows by default):
    // the index finds the rows and a hash join matches them, whatever the statistics
    // say.
    let keys: Vec<String> = (0..rows).map(|r| format!("${}", 4 * r + 2)).collect();
    BatchRenewal {
        update: None,
        answer: format!(
            "UPDATE {t} l SET expires_at = GREATEST(l.expires_at, {NOW} + (b.d * interval '1 microsecond')) \
             FROM (VALUES {}) AS b(i, k, o, d) \
             WHERE l.lock_key IN ({}) AND l.lock_key = b.k AND l.owner = b.o \
             AND (l.expires_at + interval '0 seconds') > {NOW} \
             RETURNING b.i, l.fence",
            values.join(", "),
            keys.join(", ")
        )
        .into(),
    }
}

/// The NOTIFY channel of a table's releases.
pub(super) fn channel_name(table: &str) -> String {
    format!("{table}_released")
}

#[cfg(test)]
mod tests {
    use super::super::MARKER;
    use super::*;

    /// Every statement is in its file, made for the table, spelling the driver's values.
    #[test]
    fn every_statement_is_loaded_for_the_table() {
        let s = statements("locks");
        crate::store::assert_loaded(&s);
        let c = &s.claims;
        assert!(c
            .claim
            .sql
            .contains("FROM locks_claim($1, $2, $3, $4, $5, $6)"));
        let set = c.claim_set.as_ref().map(|b| (&*b.sql, b.params.first()));
        let set = set.filter(|(sql, _)| sql.contains("FROM locks_claim_set($1, $2, $3"));
        assert_eq!(
            set.map(|(_, keys)| keys),
            Some(Some(&crate::store::P::Keys))
        );
        assert_eq!(&*c.release.sql, "SELECT locks_release_lease($1, $2)");
        assert_eq!(&*c.extend.sql, "SELECT locks_extend_lease($1, $2, $3)");
        assert!(s
            .release
            .sql
            .contains(&format!("pg_notify('{}'", channel_name("locks"))));
        let rw = lockcore::driver::READ_WRITE_CAPACITY;
        assert!(s.mark.sql.contains(&format!("res_weight = {rw}")));
        assert!(LOCK.contains(MARKER) && LEASES.contains(MARKER));
    }
}
