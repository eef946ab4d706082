//! SQLite's lock statements.

use crate::gc::GC_BATCH;
use crate::statements::{from_file, BatchRenewal, Bound, ClaimStatements, Statements, P};

/// SQLite's own clock in whole microseconds (millisecond resolution). `'now'` is fixed for
/// the duration of one statement step, so every use in a statement sees the same instant.
pub(super) const NOW_US: &str = "(CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)";

/// The owner of a key's row while shared leases hold it: 16 zero bytes, which no random
/// owner token is.
pub(super) const MARKER: &str = "X'00000000000000000000000000000000'";

/// The capacity of an exclusive or read-write key ([`lockcore::driver::READ_WRITE_CAPACITY`]).
const RW: u64 = lockcore::driver::READ_WRITE_CAPACITY;

/// The lock table `t`'s statements.
pub(super) fn statements(t: &str) -> Statements {
    let now = NOW_US;
    Statements {
        // Take the row if it is free or expired and no other owner's reservation lives,
        // re-grant it to its owner (same token, expiry never shortened), or change nothing
        // and return no row.
        acquire: format!(
            "INSERT INTO {t} (lock_key, owner, label, fence, expires_at) \
             VALUES (?1, ?2, ?3, {now}, {now} + ?4) \
             ON CONFLICT (lock_key) DO UPDATE SET \
               owner = excluded.owner, \
               label = CASE WHEN expires_at <= {now} THEN excluded.label ELSE label END, \
               fence = CASE WHEN expires_at <= {now} THEN MAX(fence + 1, {now}) ELSE fence END, \
               expires_at = MAX(expires_at, excluded.expires_at), \
               capacity = {RW}, \
               res_expires_at = CASE WHEN res_owner = excluded.owner \
                                  THEN 0 ELSE res_expires_at END \
             WHERE (expires_at <= {now} \
                    AND (res_expires_at <= {now} OR res_owner = excluded.owner)) \
                OR (owner = excluded.owner AND expires_at > {now}) \
             RETURNING fence"
        )
        .into(),
        // A key held by leases: the soonest lease's expiry, and its capacity.
        state: format!(
            "SELECT label, fence, \
               COALESCE(CASE WHEN owner = {MARKER} THEN (SELECT MIN(s.expires_at) \
                 FROM {t}_leases s WHERE s.lock_key = l.lock_key AND s.expires_at > {now}) END, \
               expires_at) - {now}, \
               CASE WHEN owner = {MARKER} THEN capacity ELSE 0 END \
             FROM {t} l WHERE lock_key = ?1 AND expires_at > {now}"
        )
        .into(),
        // Released rows stay (expired) so the next holder's token counts up from this
        // one's; the garbage collector removes them later.
        extend_many: extend_many(t),
        release: format!(
            "UPDATE {t} SET expires_at = 0 \
             WHERE lock_key = ?1 AND owner = ?2 AND expires_at > {now}"
        )
        .into(),
        force_release: vec![
            Bound::new(
                format!(
                    "UPDATE {t} SET expires_at = 0, res_expires_at = 0, res_owner = NULL \
                     WHERE lock_key = ?1 AND (expires_at > {now} OR res_expires_at > {now})"
                ),
                &[P::Key],
            ),
            Bound::new(
                format!("DELETE FROM {t}_leases WHERE lock_key = ?1"),
                &[P::Key],
            ),
        ],
        gc: format!(
            "DELETE FROM {t} WHERE lock_key IN (SELECT lock_key FROM {t} \
             WHERE expires_at <= {now} AND fence < {now} - ?1 AND res_expires_at <= {now} \
             LIMIT {GC_BATCH})"
        )
        .into(),
        mark: Bound::new(
            format!(
                "UPDATE {t} SET res_since = CASE WHEN res_owner = ?2 \
                   AND res_expires_at > {now} AND res_since < {now} - ?4 \
                   THEN res_since ELSE {now} - ?4 END, \
                 res_owner = ?2, res_weight = {rw}, res_expires_at = {now} + ?3 \
                 WHERE lock_key = ?1 AND capacity = {rw} AND (res_expires_at <= {now} \
                   OR res_owner = ?2 OR res_since IS NULL OR res_since > {now} - ?4)",
                rw = lockcore::driver::READ_WRITE_CAPACITY
            ),
            &[P::Key, P::Owner, P::Ttl, P::Waited],
        ),
        claims: claims(t),
    }
}

/// The batch renewals (see [`Statements::extend_many`]): per power of two of rows, up to
/// [`lockcore::driver::RENEWAL_BATCH`], an `UPDATE … FROM` the bound rows, then a `SELECT` of the
/// rows it left live and the owner's (a row it did not renew is expired or another owner's,
/// so the two agree without a transaction).
fn extend_many(t: &str) -> Vec<BatchRenewal> {
    let now = NOW_US;
    let mut statements = Vec::new();
    let mut rows = 1;
    while rows <= lockcore::driver::RENEWAL_BATCH {
        // Rows of `VALUES`, not a compound `SELECT`: SQLite allows at most 500 terms in one.
        let values = vec!["(?, ?, ?, ?)"; rows].join(", ");
        let bound = format!("WITH b(i, k, o, d) AS (VALUES {values})");
        statements.push(BatchRenewal {
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
        });
        rows *= 2;
    }
    statements
}

/// The shared claims' statements of lock table `t`. The claim is one statement
/// (`claim.sql`); its trigger and those keeping the key's row in step with its leases are
/// in `triggers.sql`. A write statement in autocommit starts on the latest snapshot with the
/// database's write lock (or fails busy, and is retried), so its subqueries and the triggers
/// it fires see and change both tables atomically. A release or renewal of an owner without
/// a live lease changes nothing and answers no row: `NotHeld`.
fn claims(t: &str) -> ClaimStatements {
    let now = NOW_US;
    // The owner's live lease on a key its leases hold.
    let owner_lease = format!(
        "lock_key = ?1 AND owner = ?2 AND expires_at > {now} AND EXISTS (SELECT 1 FROM {t} \
         WHERE lock_key = ?1 AND owner = {MARKER} AND expires_at > {now})"
    );
    ClaimStatements {
        claim: Bound::new(
            from_file(CLAIM, t),
            &[P::Key, P::Owner, P::Label, P::Weight, P::Ttl, P::Capacity],
        ),
        // The row follows by trigger: its expiry becomes the latest live lease's and its
        // fence moves on, so a waiter that read the old one knows a lease went.
        release: Bound::new(
            format!("DELETE FROM {t}_leases WHERE {owner_lease} RETURNING 1"),
            &[P::Key, P::Owner],
        ),
        // The row's expiry follows by trigger.
        extend: Bound::new(
            format!(
                "UPDATE {t}_leases SET expires_at = MAX(expires_at, {now} + ?3) \
                 WHERE {owner_lease} RETURNING fence"
            ),
            &[P::Key, P::Owner, P::Ttl],
        ),
        peek: None,
        shown: Bound::new(
            format!(
                "SELECT s.label, s.fence, s.weight, l.capacity, s.expires_at - {now} \
                 FROM {t}_leases s JOIN {t} l ON l.lock_key = s.lock_key \
                 WHERE s.lock_key = ?1 AND s.expires_at > {now} ORDER BY s.fence"
            ),
            &[P::Key],
        ),
        abandon: vec![Bound::new(
            format!(
                "UPDATE {t} SET res_owner = NULL, res_expires_at = 0 \
                 WHERE lock_key = ?1 AND res_owner = ?2 AND res_expires_at > {now}"
            ),
            &[P::Key, P::Owner],
        )],
        gc: format!(
            "DELETE FROM {t}_leases WHERE (lock_key, owner) IN (SELECT lock_key, owner \
             FROM {t}_leases WHERE expires_at <= {now} LIMIT {GC_BATCH})"
        )
        .into(),
    }
}

/// The claim: decided and written in one statement (see the file).
const CLAIM: &str = include_str!("claim.sql");
