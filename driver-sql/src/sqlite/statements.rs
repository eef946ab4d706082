//! SQLite's lock statements.

use crate::gc::GC_BATCH;
use crate::statements::Statements;

/// SQLite's own clock in whole microseconds (millisecond resolution). `'now'` is fixed for
/// the duration of one statement step, so every use in a statement sees the same instant.
const NOW_US: &str = "(CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)";

/// The lock table `t`'s statements.
pub(super) fn statements(t: &str) -> Statements {
    let now = NOW_US;
    Statements {
        // Take the row if it is free or expired, re-grant it to its owner (same token,
        // expiry never shortened), or change nothing and return no row.
        acquire: format!(
            "INSERT INTO {t} (lock_key, owner, label, fence, expires_at) \
             VALUES (?1, ?2, ?3, {now}, {now} + ?4) \
             ON CONFLICT (lock_key) DO UPDATE SET \
               owner = excluded.owner, \
               label = CASE WHEN expires_at <= {now} THEN excluded.label ELSE label END, \
               fence = CASE WHEN expires_at <= {now} THEN MAX(fence + 1, {now}) ELSE fence END, \
               expires_at = MAX(expires_at, excluded.expires_at) \
             WHERE expires_at <= {now} OR owner = excluded.owner \
             RETURNING fence"
        )
        .into(),
        state: format!(
            "SELECT label, fence, expires_at - {now} FROM {t} \
             WHERE lock_key = ?1 AND expires_at > {now}"
        )
        .into(),
        extend: format!(
            "UPDATE {t} SET expires_at = MAX(expires_at, {now} + ?3) \
             WHERE lock_key = ?1 AND owner = ?2 AND expires_at > {now} RETURNING fence"
        )
        .into(),
        // Released rows stay (expired) so the next holder's token counts up from this
        // one's; the garbage collector removes them later.
        release: format!(
            "UPDATE {t} SET expires_at = 0 \
             WHERE lock_key = ?1 AND owner = ?2 AND expires_at > {now}"
        )
        .into(),
        force_release: format!(
            "UPDATE {t} SET expires_at = 0 WHERE lock_key = ?1 AND expires_at > {now}"
        )
        .into(),
        gc: format!(
            "DELETE FROM {t} WHERE lock_key IN (SELECT lock_key FROM {t} \
             WHERE expires_at <= {now} AND fence < {now} - ?1 LIMIT {GC_BATCH})"
        )
        .into(),
    }
}
