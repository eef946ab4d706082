//! MySQL's lock statements.

use super::HELD_MARK;
use crate::gc::GC_BATCH;
use crate::statements::Statements;

/// The server's UTC clock, evaluated once per statement. `NOW()` would follow the session
/// time zone of a pool the application may have configured differently.
const NOW: &str = "UTC_TIMESTAMP(6)";
const NOW_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// The lock table `t`'s statements.
pub(super) fn statements(t: &str) -> Statements {
    Statements {
        // MySQL applies ON DUPLICATE KEY UPDATE assignments left to right, each seeing
        // the columns already assigned: `fence`, `label` and `owner` decide on the old
        // row; `expires_at` then sees the new owner, which is ours exactly when the row
        // was taken or re-granted. Every path calls LAST_INSERT_ID(expr) once, last:
        // the token, or HELD_MARK + the holder's remaining microseconds.
        acquire: format!(
            "INSERT INTO {t} (lock_key, owner, label, fence, expires_at) \
             VALUES (?, ?, ?, LAST_INSERT_ID({NOW_US}), {NOW} + INTERVAL ? MICROSECOND) \
             ON DUPLICATE KEY UPDATE \
               fence = IF(expires_at <= {NOW}, \
                          LAST_INSERT_ID(GREATEST(fence + 1, {NOW_US})), \
                          IF(owner = VALUES(owner), \
                             LAST_INSERT_ID(fence), \
                             fence + 0 * LAST_INSERT_ID({HELD_MARK} + \
                               GREATEST(0, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at))))), \
               label = IF(expires_at <= {NOW}, VALUES(label), label), \
               owner = IF(expires_at <= {NOW}, VALUES(owner), owner), \
               expires_at = IF(owner = VALUES(owner), \
                               GREATEST(expires_at, VALUES(expires_at)), expires_at)"
        )
        .into(),
        state: format!(
            "SELECT label, fence, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at) FROM {t} \
             WHERE lock_key = ? AND expires_at > {NOW}"
        )
        .into(),
        extend: format!(
            "UPDATE {t} SET fence = LAST_INSERT_ID(fence), \
               expires_at = GREATEST(expires_at, {NOW} + INTERVAL ? MICROSECOND) \
             WHERE lock_key = ? AND owner = ? AND expires_at > {NOW}"
        )
        .into(),
        // The row stays, expired, so the next holder's token counts up from it.
        release: format!(
            "UPDATE {t} SET expires_at = '1970-01-01 00:00:00' \
             WHERE lock_key = ? AND owner = ? AND expires_at > {NOW}"
        )
        .into(),
        force_release: format!(
            "UPDATE {t} SET expires_at = '1970-01-01 00:00:00' \
             WHERE lock_key = ? AND expires_at > {NOW}"
        )
        .into(),
        gc: format!(
            "DELETE FROM {t} WHERE expires_at <= {NOW} AND fence < {NOW_US} - ? \
             LIMIT {GC_BATCH}"
        )
        .into(),
    }
}
