//! PostgreSQL's lock statements.

use super::routines::{claim_name, extend_name, release_name};
use super::{inline, MARKER};
use crate::statements::{BatchRenewal, Bound, ClaimStatements, Statements, P};

/// The server's clock for this statement: fixed for the statement's whole run.
const NOW: &str = "statement_timestamp()";
const NOW_US: &str = "(extract(epoch FROM statement_timestamp()) * 1000000)::bigint";

/// The capacity of an exclusive or read-write key ([`lockcore::driver::READ_WRITE_CAPACITY`]).
const RW: u64 = lockcore::driver::READ_WRITE_CAPACITY;

/// Microseconds from now to the timestamp `at`.
fn until(at: &str) -> String {
    format!("(extract(epoch FROM {at} - {NOW}) * 1000000)::bigint")
}

/// 1 when `cond` holds, else 0 (also for NULL).
fn flag(cond: &str) -> String {
    format!("(CASE WHEN {cond} THEN 1 ELSE 0 END)::bigint")
}

/// `$n` microseconds as an interval.
fn micros(n: u8) -> String {
    format!("(${n}::bigint * interval '1 microsecond')")
}

/// The lock table `t`'s statements; releases notify `channel`.
pub(super) fn statements(t: &str, channel: &str) -> Statements {
    let ttl = "($4::bigint * interval '1 microsecond')";
    Statements {
        // Take a free or expired row unless another owner's reservation lives, re-grant it
        // to its owner (same token, expiry never shortened), or leave it and return no row.
        // The owner's inline lease of another capacity is left to the claim function, which
        // refuses it.
        acquire: format!(
            "INSERT INTO {t} AS l (lock_key, owner, label, fence, expires_at) \
             VALUES ($1, $2, $3, {NOW_US}, {NOW} + {ttl}) \
             ON CONFLICT (lock_key) DO UPDATE SET \
               owner = EXCLUDED.owner, \
               label = CASE WHEN l.expires_at <= {NOW} THEN EXCLUDED.label ELSE l.label END, \
               fence = CASE WHEN l.expires_at <= {NOW} \
                         THEN GREATEST(l.fence + 1, EXCLUDED.fence) ELSE l.fence END, \
               expires_at = GREATEST(l.expires_at, EXCLUDED.expires_at), \
               capacity = {RW}, \
               res_expires_at = CASE WHEN l.res_owner = EXCLUDED.owner \
                                  THEN 'epoch' ELSE l.res_expires_at END \
             WHERE (l.expires_at <= {NOW} \
                    AND (l.res_expires_at <= {NOW} OR l.res_owner = EXCLUDED.owner)) \
                OR (l.owner = EXCLUDED.owner AND l.expires_at > {NOW} AND l.capacity = {RW}) \
             RETURNING l.fence"
        )
        .into(),
        // A key held by leases (or its inline lease): the soonest lease's expiry, and its
        // capacity.
        state: format!(
            "SELECT label, fence, {}, \
               CASE WHEN owner = {MARKER} OR {} THEN capacity ELSE 0 END \
             FROM {t} l WHERE lock_key = $1 AND expires_at > {NOW}",
            until(&format!(
                "COALESCE(CASE WHEN owner = {MARKER} THEN (SELECT min(s.expires_at) \
                 FROM {t}_leases s WHERE s.lock_key = l.lock_key AND s.expires_at > {NOW}) END, \
                 expires_at)"
            )),
            inline("l.")
        )
        .into(),
        // The row stays, expired, so the next holder's token counts up from it; the
        // NOTIFY goes out when the release commits. The key travels hex-encoded: any
        // key fits the payload limit and the server encoding.
        extend_many: extend_many(t),
        release: format!(
            "WITH released AS (\
               UPDATE {t} SET expires_at = 'epoch' \
               WHERE lock_key = $1 AND owner = $2 AND expires_at > {NOW} RETURNING lock_key) \
             SELECT pg_notify('{channel}', encode(lock_key, 'hex')) FROM released"
        )
        .into(),
        force_release: vec![Bound::new(
            format!(
                "WITH leases AS (DELETE FROM {t}_leases WHERE lock_key = $1), \
                 released AS (\
                   UPDATE {t} SET expires_at = 'epoch', res_expires_at = 'epoch', res_owner = NULL \
                   WHERE lock_key = $1 AND (expires_at > {NOW} OR res_expires_at > {NOW}) \
                   RETURNING lock_key) \
                 SELECT pg_notify('{channel}', encode(lock_key, 'hex')) FROM released"
            ),
            &[P::Key],
        )],
        gc: format!(
            "DELETE FROM {t} WHERE expires_at <= {NOW} AND fence < {NOW_US} - $1 \
             AND res_expires_at <= {NOW}"
        )
        .into(),
        mark: Bound::new(
            format!(
                "UPDATE {t} SET res_since = CASE WHEN res_owner = $2 \
                   AND res_expires_at > {NOW} AND res_since < {NOW_US} - $4 \
                   THEN res_since ELSE {NOW_US} - $4 END, \
                 res_owner = $2, res_weight = {RW}, res_expires_at = {NOW} + {} \
                 WHERE lock_key = $1 AND capacity = {RW} AND (res_expires_at <= {NOW} \
                   OR res_owner = $2 OR res_since IS NULL OR res_since > {NOW_US} - $4)",
                micros(3)
            ),
            &[P::Key, P::Owner, P::Ttl, P::Waited],
        ),
        claims: claims(t, channel),
    }
}

/// The shared claims' statements of lock table `t`: the functions of `routines.rs`, each
/// answering one row of `bigint`s.
fn claims(t: &str, channel: &str) -> ClaimStatements {
    ClaimStatements {
        claim: Bound::new(
            format!(
                "SELECT kind, token, remaining, by_reservation, revision \
                 FROM {}($1, $2, $3, $4, $5, $6)",
                claim_name(t)
            ),
            &[P::Key, P::Owner, P::Label, P::Weight, P::Ttl, P::Capacity],
        ),
        release: Bound::new(
            format!("SELECT {}($1, $2)", release_name(t)),
            &[P::Key, P::Owner],
        ),
        extend: Bound::new(
            format!("SELECT {}($1, $2, $3)", extend_name(t)),
            &[P::Key, P::Owner, P::Ttl],
        ),
        peek: Some(Bound::new(
            format!(
                "SELECT {}, fence FROM {t} WHERE lock_key = $1",
                flag(&format!("res_expires_at > {NOW}"))
            ),
            &[P::Key],
        )),
        // The leases, and the inline lease of the row.
        shown: Bound::new(
            format!(
                "SELECT s.label, s.fence, s.weight, l.capacity, {} \
                 FROM {t}_leases s JOIN {t} l ON l.lock_key = s.lock_key \
                 WHERE s.lock_key = $1 AND s.expires_at > {NOW} \
                 UNION ALL SELECT label, fence, lease_weight, capacity, {} FROM {t} \
                 WHERE lock_key = $1 AND expires_at > {NOW} AND {} ORDER BY 2",
                until("s.expires_at"),
                until("expires_at"),
                inline("")
            ),
            &[P::Key],
        ),
        abandon: vec![Bound::new(
            format!(
                "WITH gone AS (\
                   UPDATE {t} SET res_owner = NULL, res_expires_at = 'epoch' \
                   WHERE lock_key = $1 AND res_owner = $2 AND res_expires_at > {NOW} \
                   RETURNING lock_key) \
                 SELECT pg_notify('{channel}', encode(lock_key, 'hex')) FROM gone"
            ),
            &[P::Key, P::Owner],
        )],
        gc: format!("DELETE FROM {t}_leases WHERE expires_at <= {NOW}").into(),
    }
}

/// The batch renewals (see [`Statements::extend_many`]): one statement per power of two of
/// rows, up to [`lockcore::driver::RENEWAL_BATCH`], so that few statements are prepared.
fn extend_many(t: &str) -> Vec<BatchRenewal> {
    let mut statements = Vec::new();
    let mut rows = 1;
    while rows <= lockcore::driver::RENEWAL_BATCH {
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
        // say (5 ms per batch against 366 ms and worse).
        let keys: Vec<String> = (0..rows).map(|r| format!("${}", 4 * r + 2)).collect();
        statements.push(BatchRenewal {
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
        });
        rows *= 2;
    }
    statements
}

/// The NOTIFY channel of a table's releases.
pub(super) fn channel_name(table: &str) -> String {
    format!("{table}_released")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shared_operation_has_its_one_call() {
        let calls = statements("locks", "locks_released").claims;
        let claim = calls.claim;
        assert!(claim
            .sql
            .contains("FROM locks_claim($1, $2, $3, $4, $5, $6)"));
        assert_eq!(claim.params.len(), 6);
        let release = calls.release;
        assert_eq!(&*release.sql, "SELECT locks_release_lease($1, $2)");
        let extend = calls.extend;
        assert_eq!(&*extend.sql, "SELECT locks_extend_lease($1, $2, $3)");
    }
}
