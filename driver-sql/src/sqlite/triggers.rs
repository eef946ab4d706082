//! The triggers that keep a key's row in the lock table in step with its leases, so that one statement on the leases table claims, releases or renews a lease.
//!
//! While leases live, the key's row is held by the marker owner until the latest lease
//! expires, with the last token as its fence: that is what the exclusive statements and the
//! pollers read without looking at the leases. Every write of a lease, by the one-statement
//! paths and by the claim transaction alike, goes through these triggers; no statement
//! writes those columns of the row by hand as well.
//!
//! A trigger runs inside the statement that fired it (the same write lock, the same
//! `'now'`), so the lease and the row change together or not at all.

use super::statements::{MARKER, NOW_US};

/// What the triggers of lock table `t` are named after the table, in creation order.
const NAMES: [&str; 4] = [
    "lease_granted",
    "lease_regranted",
    "lease_renewed",
    "lease_released",
];

/// The statements (re)creating the triggers of lock table `t`.
pub(super) fn create(t: &str) -> Vec<String> {
    let now = NOW_US;
    // A lease granted (inserted, or written over the owner's expired lease, which always
    // takes a new token): the row is created if missing, held by the marker at least until
    // the lease expires, the lease's token is its fence, its capacity the claim's, and the
    // owner's reservation is spent.
    let granted = format!(
        "INSERT INTO {t} (lock_key, owner, label, fence, expires_at) \
         SELECT NEW.lock_key, {MARKER}, '(shared)', NEW.fence, NEW.expires_at \
         WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE lock_key = NEW.lock_key); \
         UPDATE {t} SET owner = {MARKER}, label = '(shared)', fence = NEW.fence, \
           capacity = NEW.capacity, expires_at = MAX(expires_at, NEW.expires_at), \
           res_expires_at = CASE WHEN res_owner = NEW.owner THEN 0 ELSE res_expires_at END \
         WHERE lock_key = NEW.lock_key;"
    );
    let bodies = [
        format!("AFTER INSERT ON {t}_leases BEGIN {granted} END"),
        format!(
            "AFTER UPDATE OF fence ON {t}_leases WHEN NEW.fence <> OLD.fence \
             BEGIN {granted} END"
        ),
        // A lease renewed (same token): the row lives at least as long.
        format!(
            "AFTER UPDATE OF expires_at ON {t}_leases WHEN NEW.fence = OLD.fence BEGIN \
             UPDATE {t} SET expires_at = MAX(expires_at, NEW.expires_at) \
             WHERE lock_key = NEW.lock_key; END"
        ),
        // A live lease of a key its leases hold released: the row's expiry becomes the
        // latest live lease's (0, free, when none is left) and its fence moves on, so a
        // waiter that read the old one knows a lease went. Deleting expired leases (the
        // garbage collector) or the leases of a key already freed (force release) leaves
        // the row alone.
        format!(
            "AFTER DELETE ON {t}_leases WHEN OLD.expires_at > {now} AND EXISTS (SELECT 1 \
               FROM {t} WHERE lock_key = OLD.lock_key AND owner = {MARKER} \
               AND expires_at > {now}) BEGIN \
             UPDATE {t} SET expires_at = COALESCE((SELECT MAX(expires_at) FROM {t}_leases \
               WHERE lock_key = OLD.lock_key AND expires_at > {now}), 0), \
               fence = MAX(fence + 1, {now}) \
             WHERE lock_key = OLD.lock_key; END"
        ),
    ];
    NAMES
        .iter()
        .zip(bodies)
        .flat_map(|(name, body)| {
            [
                format!("DROP TRIGGER IF EXISTS {t}_{name}"),
                format!("CREATE TRIGGER {t}_{name} {body}"),
            ]
        })
        .collect()
}
