//! SQLite's lock statements.

use crate::decide::kind::GRANT_LEASE;
use crate::gc::GC_BATCH;
use crate::statements::{BatchRenewal, Bound, Calls, ClaimStatements, Statements, P};

/// SQLite's own clock in whole microseconds (millisecond resolution). `'now'` is fixed for
/// the duration of one statement step, so every use in a statement sees the same instant.
pub(super) const NOW_US: &str = "(CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)";

/// The owner of a key's row while shared leases hold it: 16 zero bytes, which no random
/// owner token is.
pub(super) const MARKER: &str = "X'00000000000000000000000000000000'";

/// The capacity of an exclusive or read-write key ([`lockcore::driver::READ_WRITE_CAPACITY`]).
const RW: u64 = lockcore::driver::READ_WRITE_CAPACITY;

/// 1 when `cond` holds, else 0 (also for NULL).
fn flag(cond: &str) -> String {
    format!("CASE WHEN {cond} THEN 1 ELSE 0 END")
}

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

/// The shared claims' statements of lock table `t`; each runs in a transaction begun with
/// `BEGIN IMMEDIATE`, which holds the database's write lock throughout.
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

fn claims(t: &str) -> ClaimStatements {
    let now = NOW_US;
    // The row as the claim transaction reads it (see `decide::RowSeen`); `?2` the owner.
    let row = [
        flag(&format!("expires_at > {now}")),
        flag("owner = ?2"),
        flag(&format!("owner = {MARKER}")),
        "fence".into(),
        "capacity".into(),
        flag(&format!("res_expires_at > {now}")),
        flag("res_owner = ?2"),
        "res_weight".into(),
        format!("expires_at - {now}"),
        format!("res_expires_at - {now}"),
        now.into(),
    ]
    .join(", ");
    let not_mine = "CASE WHEN res_owner = ?2 THEN 0 ELSE res_expires_at END";
    ClaimStatements {
        row: Bound::new(
            format!(
                "INSERT INTO {t} (lock_key, owner, label, fence, expires_at) \
                 VALUES (?1, {MARKER}, '(shared)', 0, 0) \
                 ON CONFLICT (lock_key) DO UPDATE SET fence = fence RETURNING {row}"
            ),
            &[P::Key, P::Owner],
        ),
        create: None,
        row_locked: Bound::new(
            format!("SELECT {row} FROM {t} WHERE lock_key = ?1"),
            &[P::Key, P::Owner],
        ),
        peek: None,
        leases: Bound::new(
            format!(
                "SELECT {}, weight, fence, expires_at - {now} FROM {t}_leases \
                 WHERE lock_key = ?1 AND expires_at > {now}",
                flag("owner = ?2")
            ),
            &[P::Key, P::Owner],
        ),
        shown: Bound::new(
            format!(
                "SELECT s.label, s.fence, s.weight, l.capacity, s.expires_at - {now} \
                 FROM {t}_leases s JOIN {t} l ON l.lock_key = s.lock_key \
                 WHERE s.lock_key = ?1 AND s.expires_at > {now} ORDER BY s.fence"
            ),
            &[P::Key],
        ),
        grant_exclusive: vec![Bound::new(
            format!(
                "UPDATE {t} SET owner = ?2, label = ?3, fence = ?4, expires_at = {now} + ?5, \
                 capacity = {RW}, res_expires_at = {not_mine} WHERE lock_key = ?1"
            ),
            &[P::Key, P::Owner, P::Label, P::Token, P::Ttl],
        )],
        // The lease alone: the triggers of `migrate.rs` bring the key's row along (held by
        // the marker until the latest lease expires, the token as its fence, the claim's
        // capacity, the owner's reservation cleared), for a new lease as for one written
        // over the owner's expired lease.
        grant_lease: vec![Bound::new(
            format!(
                "INSERT INTO {t}_leases \
                   (lock_key, owner, label, weight, fence, expires_at, capacity) \
                 VALUES (?1, ?2, ?3, ?4, ?5, {now} + ?6, ?7) \
                 ON CONFLICT (lock_key, owner) DO UPDATE SET label = excluded.label, \
                   weight = excluded.weight, fence = excluded.fence, \
                   expires_at = excluded.expires_at, capacity = excluded.capacity"
            ),
            &[
                P::Key,
                P::Owner,
                P::Label,
                P::Weight,
                P::Token,
                P::Ttl,
                P::Capacity,
            ],
        )],
        renew_row: vec![Bound::new(
            format!("UPDATE {t} SET expires_at = MAX(expires_at, {now} + ?2) WHERE lock_key = ?1"),
            &[P::Key, P::Ttl],
        )],
        // The row's expiry follows by trigger.
        renew_lease: vec![Bound::new(renew_lease(t), &[P::Key, P::Owner, P::Ttl])],
        reserve: vec![Bound::new(
            format!(
                "UPDATE {t} SET res_since = CASE WHEN res_owner = ?2 \
                   AND res_expires_at > {now} AND res_since < {now} - ?5 \
                   THEN res_since ELSE {now} - ?5 END, \
                 res_owner = ?2, res_weight = ?3, res_expires_at = {now} + ?4 \
                 WHERE lock_key = ?1"
            ),
            &[P::Key, P::Owner, P::Weight, P::Ttl, P::Waited],
        )],
        // The row follows by trigger: its expiry becomes the latest live lease's and its
        // fence moves on, so a waiter that read the old one knows a lease went.
        release_lease: vec![Bound::new(release_lease(t), &[P::Key, P::Owner])],
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
        calls: calls(t),
    }
}

/// The owner's live lease on a key its leases hold.
fn owner_lease(t: &str) -> String {
    let now = NOW_US;
    format!(
        "lock_key = ?1 AND owner = ?2 AND expires_at > {now} AND EXISTS (SELECT 1 FROM {t} \
         WHERE lock_key = ?1 AND owner = {MARKER} AND expires_at > {now})"
    )
}

/// Deletes the owner's live lease (the row follows by trigger). Binds key, owner.
fn release_lease(t: &str) -> String {
    format!("DELETE FROM {t}_leases WHERE {}", owner_lease(t))
}

/// Pushes the owner's live lease's expiry out, never in (the row's follows by trigger).
/// Binds key, owner, TTL.
fn renew_lease(t: &str) -> String {
    let now = NOW_US;
    format!(
        "UPDATE {t}_leases SET expires_at = MAX(expires_at, {now} + ?3) WHERE {}",
        owner_lease(t)
    )
}

/// The one-statement paths of lock table `t`: the claim, release and renewal of a lease.
///
/// A write statement in autocommit starts on the latest snapshot with the database's write
/// lock (or fails busy, and is retried), so its subqueries and the triggers it fires see
/// and change both tables atomically, like the `BEGIN IMMEDIATE` transaction. A release or
/// renewal of an owner without a live lease changes nothing and answers no row (a
/// `DELETE`/`UPDATE … RETURNING` cannot answer for a row it did not touch): the transaction
/// then says `NotHeld`.
fn calls(t: &str) -> Calls {
    let now = NOW_US;
    // The claim: a lease for a claim that is not exclusive, when the transaction would
    // grant it (`decide`): the key is free, or held by leases of the same capacity; the
    // owner has no lease row (a live one is a renewal, an expired one is overwritten: the
    // transaction's); the other live leases, this claim and another owner's live
    // reservation fit the capacity. The token is the transaction's, max(fence + 1, now) (a
    // missing row has fence 0). The key's row follows by trigger. Anything else inserts
    // nothing and answers no row: the transaction decides.
    let claim = format!(
        "INSERT INTO {t}_leases (lock_key, owner, label, weight, fence, expires_at, capacity) \
         SELECT ?1, ?2, ?3, ?4, MAX(COALESCE(l.fence, 0) + 1, {now}), {now} + ?5, ?6 \
         FROM (SELECT 1) LEFT JOIN {t} l ON l.lock_key = ?1 \
         WHERE NOT (?4 = {RW} AND ?6 = {RW}) \
           AND NOT EXISTS (SELECT 1 FROM {t}_leases m WHERE m.lock_key = ?1 AND m.owner = ?2) \
           AND (l.lock_key IS NULL OR ( \
             (l.capacity = ?6 OR (l.expires_at <= {now} AND l.res_expires_at <= {now})) \
             AND (l.expires_at <= {now} OR l.owner = {MARKER}) \
             AND CASE WHEN l.expires_at > {now} THEN (SELECT COALESCE(SUM(s.weight), 0) \
                   FROM {t}_leases s WHERE s.lock_key = ?1 AND s.expires_at > {now}) \
                 ELSE 0 END \
               + ?4 \
               + CASE WHEN l.res_expires_at > {now} AND l.res_owner IS NOT ?2 \
                   THEN l.res_weight ELSE 0 END \
               <= ?6)) \
         RETURNING {GRANT_LEASE}, fence, 0, 0, 0"
    );
    Calls {
        claim: Some(Bound::new(
            claim,
            &[P::Key, P::Owner, P::Label, P::Weight, P::Ttl, P::Capacity],
        )),
        release: Some(Bound::new(
            format!("{} RETURNING 1", release_lease(t)),
            &[P::Key, P::Owner],
        )),
        extend: Some(Bound::new(
            format!("{} RETURNING fence", renew_lease(t)),
            &[P::Key, P::Owner, P::Ttl],
        )),
    }
}
