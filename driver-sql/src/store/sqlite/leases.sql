-- SQLite's statements of shared leases but the claim (claim.sql), each under `-- name:`,
-- written for the table distlock_locks (replaced by the backend's table wherever it
-- occurs); clock and marker as in lock.sql. The key's row follows each write by trigger
-- (triggers.sql). A release or renewal of an owner without a live lease on a key its
-- leases hold changes nothing and answers no row: `NotHeld`.

-- name: release_lease
-- Deletes owner ?2's live lease of key ?1: the row's expiry becomes the latest live
-- lease's and its fence moves on, so a waiter that read the old one knows a lease went.
DELETE FROM distlock_locks_leases
WHERE lock_key = ?1 AND owner = ?2
  AND expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
  AND EXISTS (SELECT 1 FROM distlock_locks WHERE lock_key = ?1
    AND owner = X'00000000000000000000000000000000'
    AND expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000))
RETURNING 1

-- name: extend_lease
-- Pushes owner ?2's live lease of key ?1 out to ?3 µs from now, never in: its token.
UPDATE distlock_locks_leases
SET expires_at = MAX(expires_at, (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000) + ?3)
WHERE lock_key = ?1 AND owner = ?2
  AND expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
  AND EXISTS (SELECT 1 FROM distlock_locks WHERE lock_key = ?1
    AND owner = X'00000000000000000000000000000000'
    AND expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000))
RETURNING fence

-- name: shown
-- Key ?1's live leases as `holders` shows them, in grant order.
SELECT s.label, s.fence, s.weight, l.capacity,
  s.expires_at - (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
FROM distlock_locks_leases s JOIN distlock_locks l ON l.lock_key = s.lock_key
WHERE s.lock_key = ?1
  AND s.expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
ORDER BY s.fence

-- name: abandon
-- Removes owner ?2's live reservation of key ?1.
UPDATE distlock_locks SET res_owner = NULL, res_expires_at = 0
WHERE lock_key = ?1 AND res_owner = ?2
  AND res_expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)

-- name: gc_leases
-- Deletes up to GC_BATCH (1000) expired leases.
DELETE FROM distlock_locks_leases WHERE (lock_key, owner) IN (SELECT lock_key, owner
  FROM distlock_locks_leases
  WHERE expires_at <= (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
  LIMIT 1000)
