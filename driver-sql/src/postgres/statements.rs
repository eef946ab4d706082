//! PostgreSQL's lock statements.

use crate::statements::Statements;

/// The server's clock for this statement: fixed for the statement's whole run.
const NOW: &str = "statement_timestamp()";
const NOW_US: &str = "(extract(epoch FROM statement_timestamp()) * 1000000)::bigint";

/// The lock table `t`'s statements; releases notify `channel`.
pub(super) fn statements(t: &str, channel: &str) -> Statements {
    let ttl = "($4::bigint * interval '1 microsecond')";
    let remaining = format!("(extract(epoch FROM expires_at - {NOW}) * 1000000)::bigint");
    Statements {
        // Take a free or expired row, re-grant it to its owner (same token, expiry never
        // shortened), or leave it and return no row.
        acquire: format!(
            "INSERT INTO {t} AS l (lock_key, owner, label, fence, expires_at) \
             VALUES ($1, $2, $3, {NOW_US}, {NOW} + {ttl}) \
             ON CONFLICT (lock_key) DO UPDATE SET \
               owner = EXCLUDED.owner, \
               label = CASE WHEN l.expires_at <= {NOW} THEN EXCLUDED.label ELSE l.label END, \
               fence = CASE WHEN l.expires_at <= {NOW} \
                         THEN GREATEST(l.fence + 1, EXCLUDED.fence) ELSE l.fence END, \
               expires_at = GREATEST(l.expires_at, EXCLUDED.expires_at) \
             WHERE l.expires_at <= {NOW} OR l.owner = EXCLUDED.owner \
             RETURNING l.fence"
        )
        .into(),
        state: format!(
            "SELECT label, fence, {remaining} FROM {t} \
             WHERE lock_key = $1 AND expires_at > {NOW}"
        )
        .into(),
        extend: format!(
            "UPDATE {t} SET expires_at = GREATEST(expires_at, {NOW} + ($3::bigint * interval '1 microsecond')) \
             WHERE lock_key = $1 AND owner = $2 AND expires_at > {NOW} RETURNING fence"
        )
        .into(),
        // The row stays, expired, so the next holder's token counts up from it; the
        // NOTIFY goes out when the release commits. The key travels hex-encoded: any
        // key fits the payload limit and the server encoding.
        release: format!(
            "WITH released AS (\
               UPDATE {t} SET expires_at = 'epoch' \
               WHERE lock_key = $1 AND owner = $2 AND expires_at > {NOW} RETURNING lock_key) \
             SELECT pg_notify('{channel}', encode(lock_key, 'hex')) FROM released"
        )
        .into(),
        force_release: format!(
            "WITH released AS (\
               UPDATE {t} SET expires_at = 'epoch' \
               WHERE lock_key = $1 AND expires_at > {NOW} RETURNING lock_key) \
             SELECT pg_notify('{channel}', encode(lock_key, 'hex')) FROM released"
        )
        .into(),
        gc: format!("DELETE FROM {t} WHERE expires_at <= {NOW} AND fence < {NOW_US} - $1")
            .into(),
    }
}

/// The NOTIFY channel of a table's releases.
pub(super) fn channel_name(table: &str) -> String {
    format!("{table}_released")
}
