-- SQLite's statements of the exclusive lock, each under `-- name:`, written for the table
-- distlock_locks (replaced by the backend's table wherever it occurs). The clock is SQLite's
-- own in whole µs, fixed for the statement: (CAST(ROUND(unixepoch('subsec') * 1000) AS
-- INTEGER) * 1000). 4294967295 is READ_WRITE_CAPACITY; X'000…' the marker owner of a key
-- held by leases.

-- name: acquire key owner label ttl
-- Takes the row (key ?1, owner ?2, label ?3, TTL µs ?4) if it is free or expired and no
-- other owner's reservation lives, re-grants it to its owner (same token, expiry never
-- shortened), or changes nothing and returns no row.
INSERT INTO distlock_locks (lock_key, owner, label, fence, expires_at)
VALUES (?1, ?2, ?3, (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000),
  (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000) + ?4)
ON CONFLICT (lock_key) DO UPDATE SET
  owner = excluded.owner,
  label = CASE WHEN expires_at <= excluded.fence THEN excluded.label ELSE label END,
  fence = CASE WHEN expires_at <= excluded.fence THEN MAX(fence + 1, excluded.fence)
    ELSE fence END,
  expires_at = MAX(expires_at, excluded.expires_at),
  capacity = 4294967295,
  res_expires_at = CASE WHEN res_owner = excluded.owner THEN 0 ELSE res_expires_at END
WHERE (expires_at <= excluded.fence
    AND (res_expires_at <= excluded.fence OR res_owner = excluded.owner))
  OR (owner = excluded.owner AND expires_at > excluded.fence)
RETURNING fence

-- name: state key
-- The live row of key ?1: label, fence, remaining µs (a key held by leases: the soonest
-- lease's), and the capacity of a key held by leases (0 for an exclusive hold).
SELECT label, fence,
  COALESCE(CASE WHEN owner = X'00000000000000000000000000000000' THEN
    (SELECT MIN(s.expires_at) FROM distlock_locks_leases s WHERE s.lock_key = l.lock_key
      AND s.expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)) END,
    expires_at) - (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000),
  CASE WHEN owner = X'00000000000000000000000000000000' THEN capacity ELSE 0 END
FROM distlock_locks l
WHERE lock_key = ?1 AND expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)

-- name: release key owner
-- Marks owner ?2's live row of key ?1 expired. Released rows stay so the next holder's
-- token counts up from this one's; the garbage collector removes them later.
UPDATE distlock_locks SET expires_at = 0
WHERE lock_key = ?1 AND owner = ?2
  AND expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)

-- name: force_release key
-- Frees key ?1 whoever holds it, and its reservation (then its leases go: force_leases).
UPDATE distlock_locks SET expires_at = 0, res_expires_at = 0, res_owner = NULL
WHERE lock_key = ?1
  AND (expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
    OR res_expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000))

-- name: force_leases key
DELETE FROM distlock_locks_leases WHERE lock_key = ?1

-- name: gc
-- Deletes up to GC_BATCH (1000) rows expired and granted longer than ?1 µs ago, without a
-- live reservation.
DELETE FROM distlock_locks WHERE lock_key IN (SELECT lock_key FROM distlock_locks
  WHERE expires_at <= (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
    AND fence < (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000) - ?1
    AND res_expires_at <= (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
  LIMIT 1000)

-- name: mark key owner ttl waited
-- Marks key ?1 as the next turn of owner ?2 for ?3 µs, its arrival ?4 µs ago (see
-- Statements::mark), on a key of the exclusive or read-write capacity only.
UPDATE distlock_locks SET
  res_since = CASE WHEN res_owner = ?2
      AND res_expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
      AND res_since < (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000) - ?4
    THEN res_since ELSE (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000) - ?4 END,
  res_owner = ?2, res_weight = 4294967295,
  res_expires_at = (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000) + ?3
WHERE lock_key = ?1 AND capacity = 4294967295
  AND (res_expires_at <= (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
    OR res_owner = ?2 OR res_since IS NULL
    OR res_since > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000) - ?4)
