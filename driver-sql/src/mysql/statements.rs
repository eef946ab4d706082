//! MySQL's lock statements.

use super::{inline, CLAIM_MARK, EPOCH, HELD_MARK, MARKER, NOW, NOW_US, RW};
use crate::gc::GC_BATCH;
use crate::statements::{BatchRenewal, Bound, ClaimStatements, Statements, P};

/// Microseconds from now to the time `at`.
fn until(at: &str) -> String {
    format!("TIMESTAMPDIFF(MICROSECOND, {NOW}, {at})")
}

/// The lock table `t`'s statements.
pub(super) fn statements(t: &str) -> Statements {
    Statements {
        // MySQL applies ON DUPLICATE KEY UPDATE assignments left to right, each seeing
        // the columns already assigned: `fence`, `label`, `capacity` and `owner` decide on
        // the old row (FREE: expired, and no live reservation, whoever's); `expires_at` then
        // sees the new owner, which is ours exactly when the row was taken or re-granted
        // (ours, expired, but held back by a reservation: the marker owner, so not ours).
        // Every path calls LAST_INSERT_ID(expr) once, first: the token, HELD_MARK + the
        // holder's remaining microseconds, or CLAIM_MARK when leases hold the key or a
        // reservation lives (the claim call then decides, and clears its owner's own).
        // The common case, a free key, costs what the plain statement does: one more time
        // comparison in FREE, one more assignment. An inline lease (see `inline`) is left to the claim call, as leases are (a writer behind it reserves),
        // and so is the owner's own of another capacity (the claim call refuses it).
        acquire: {
            let free = format!("(expires_at <= {NOW} AND res_expires_at <= {NOW})");
            format!(
                "INSERT INTO {t} (lock_key, owner, label, fence, expires_at) \
                 VALUES (?, ?, ?, LAST_INSERT_ID({NOW_US}), {NOW} + INTERVAL ? MICROSECOND) \
                 ON DUPLICATE KEY UPDATE \
                   fence = IF({free}, \
                              LAST_INSERT_ID(GREATEST(fence + 1, {NOW_US})), \
                              IF(owner = VALUES(owner) AND expires_at > {NOW} \
                                   AND capacity = {RW}, \
                                 LAST_INSERT_ID(fence), \
                                 IF(owner = {MARKER} OR expires_at <= {NOW} OR {inline} \
                                      OR owner = VALUES(owner), \
                                    fence + 0 * LAST_INSERT_ID({CLAIM_MARK}), \
                                    fence + 0 * LAST_INSERT_ID({HELD_MARK} + \
                                      GREATEST(0, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at)))))), \
                   label = IF({free}, VALUES(label), label), \
                   capacity = IF({free}, {RW}, capacity), \
                   owner = IF({free}, VALUES(owner), \
                              IF(owner = VALUES(owner) AND expires_at <= {NOW}, {MARKER}, owner)), \
                   expires_at = IF(owner = VALUES(owner) AND capacity = {RW}, \
                                   GREATEST(expires_at, VALUES(expires_at)), expires_at)",
                inline = inline("")
            )
            .into()
        },
        // A key held by leases (or its inline lease): the soonest lease's expiry, and its
        // capacity.
        state: format!(
            "SELECT label, fence, {}, \
               CASE WHEN owner = {MARKER} OR {} THEN capacity ELSE 0 END \
             FROM {t} l WHERE lock_key = ? AND expires_at > {NOW}",
            until(&format!(
                "COALESCE(CASE WHEN owner = {MARKER} THEN (SELECT MIN(s.expires_at) \
                 FROM {t}_leases s WHERE s.lock_key = l.lock_key AND s.expires_at > {NOW}) END, \
                 expires_at)"
            )),
            inline("l.")
        )
        .into(),
        // The row stays, expired, so the next holder's token counts up from it.
        extend_many: extend_many(t),
        release: format!(
            "UPDATE {t} SET expires_at = '1970-01-01 00:00:00' \
             WHERE lock_key = ? AND owner = ? AND expires_at > {NOW}"
        )
        .into(),
        force_release: vec![
            Bound::new(
                format!(
                    "UPDATE {t} SET expires_at = {EPOCH}, res_expires_at = {EPOCH}, \
                     res_owner = NULL \
                     WHERE lock_key = ? AND (expires_at > {NOW} OR res_expires_at > {NOW})"
                ),
                &[P::Key],
            ),
            Bound::new(
                format!("DELETE FROM {t}_leases WHERE lock_key = ?"),
                &[P::Key],
            ),
        ],
        gc: format!(
            "DELETE FROM {t} WHERE expires_at <= {NOW} AND fence < {NOW_US} - ? \
             AND res_expires_at <= {NOW} LIMIT {GC_BATCH}"
        )
        .into(),
        // MySQL assigns left to right, each assignment seeing the ones before: the arrival
        // first, while the old reservation is still there to read.
        mark: Bound::new(
            format!(
                "UPDATE {t} SET res_since = CASE WHEN res_owner = ? \
                   AND res_expires_at > {NOW} AND res_since < {NOW_US} - ? \
                   THEN res_since ELSE {NOW_US} - ? END, \
                 res_owner = ?, res_weight = {RW}, \
                 res_expires_at = {NOW} + INTERVAL ? MICROSECOND \
                 WHERE lock_key = ? AND capacity = {RW} AND (res_expires_at <= {NOW} \
                   OR res_owner = ? OR res_since IS NULL OR res_since > {NOW_US} - ?)"
            ),
            &[
                P::Owner,
                P::Waited,
                P::Waited,
                P::Owner,
                P::Ttl,
                P::Key,
                P::Owner,
                P::Waited,
            ],
        ),
        claims: claims(t),
    }
}

/// The shared claims' statements of lock table `t`.
/// The batch renewals (see [`Statements::extend_many`]): per power of two of rows, up to
/// [`lockcore::driver::RENEWAL_BATCH`], an `UPDATE` joined with the bound rows, then a `SELECT` of
/// the rows it left live and the owner's (a row it did not renew is expired or another
/// owner's, so the two agree without a transaction).
fn extend_many(t: &str) -> Vec<BatchRenewal> {
    let mut statements = Vec::new();
    let mut rows = 1;
    while rows <= lockcore::driver::RENEWAL_BATCH {
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
        statements.push(BatchRenewal {
            update: Some(
                format!(
                    "UPDATE {joined} \
                     SET l.expires_at = GREATEST(l.expires_at, {NOW} + INTERVAL b.d MICROSECOND) \
                     WHERE l.expires_at > {NOW}"
                )
                .into(),
            ),
            answer: format!("SELECT b.i, l.fence FROM {joined} WHERE l.expires_at > {NOW}").into(),
        });
        rows *= 2;
    }
    statements
}

/// The shared claims' statements of lock table `t`: the procedures of `routines.rs`.
fn claims(t: &str) -> ClaimStatements {
    ClaimStatements {
        claim: Bound::new(
            format!("CALL {t}_claim(?, ?, ?, ?, ?, ?)"),
            &[P::Key, P::Owner, P::Label, P::Weight, P::Ttl, P::Capacity],
        ),
        release: Bound::new(format!("CALL {t}_release_lease(?, ?)"), &[P::Key, P::Owner]),
        extend: Bound::new(
            format!("CALL {t}_extend_lease(?, ?, ?)"),
            &[P::Key, P::Owner, P::Ttl],
        ),
        peek: None,
        // The leases, and the inline lease of the row.
        shown: Bound::new(
            format!(
                "SELECT s.label, s.fence, s.weight, l.capacity, {} \
                 FROM {t}_leases s JOIN {t} l ON l.lock_key = s.lock_key \
                 WHERE s.lock_key = ? AND s.expires_at > {NOW} \
                 UNION ALL SELECT label, fence, lease_weight, capacity, {} FROM {t} \
                 WHERE lock_key = ? AND expires_at > {NOW} AND {} ORDER BY 2",
                until("s.expires_at"),
                until("expires_at"),
                inline("")
            ),
            &[P::Key, P::Key],
        ),
        abandon: vec![Bound::new(
            format!(
                "UPDATE {t} SET res_owner = NULL, res_expires_at = {EPOCH} \
                 WHERE lock_key = ? AND res_owner = ? AND res_expires_at > {NOW}"
            ),
            &[P::Key, P::Owner],
        )],
        gc: format!("DELETE FROM {t}_leases WHERE expires_at <= {NOW} LIMIT {GC_BATCH}").into(),
    }
}
