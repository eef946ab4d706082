-- PostgreSQL's statements of the exclusive lock, each under `-- name:`, written for the
-- table distlock_locks (replaced by the backend's table wherever it occurs, also in the
-- NOTIFY channel distlock_locks_released). The clock is statement_timestamp(), fixed for the
-- statement; 4294967295 is READ_WRITE_CAPACITY; '\x000…'::bytea the marker owner of a key
-- held by leases. A row holds an inline lease while its owner is not the marker and
-- lease_fence = fence (docs/sql.md, "The inline lease").

-- name: acquire key owner label ttl
-- Takes a free or expired row of key $1 for owner $2 (label $3, TTL $4 µs) unless another
-- owner's reservation lives, re-grants it to its owner (same token, expiry never
-- shortened), or leaves it and returns no row. The owner's inline lease of another
-- capacity is left to the claim function, which refuses it. So is a key a transaction
-- holds (its gate taken, see gate.sql), which the claim function reports.
INSERT INTO distlock_locks AS l (lock_key, owner, label, fence, expires_at)
SELECT $1, $2, $3, (extract(epoch FROM statement_timestamp()) * 1000000)::bigint,
  statement_timestamp() + ($4::bigint * interval '1 microsecond')
WHERE pg_try_advisory_xact_lock_shared(distlock_locks_gate($1))
ON CONFLICT (lock_key) DO UPDATE SET
  owner = EXCLUDED.owner,
  label = CASE WHEN l.expires_at <= statement_timestamp() THEN EXCLUDED.label ELSE l.label END,
  fence = CASE WHEN l.expires_at <= statement_timestamp()
    THEN GREATEST(l.fence + 1, EXCLUDED.fence) ELSE l.fence END,
  expires_at = GREATEST(l.expires_at, EXCLUDED.expires_at),
  capacity = 4294967295,
  res_expires_at = CASE WHEN l.res_owner = EXCLUDED.owner THEN 'epoch' ELSE l.res_expires_at END
WHERE (l.expires_at <= statement_timestamp()
    AND (l.res_expires_at <= statement_timestamp() OR l.res_owner = EXCLUDED.owner))
  OR (l.owner = EXCLUDED.owner AND l.expires_at > statement_timestamp()
    AND l.capacity = 4294967295)
RETURNING l.fence

-- name: state key
-- The live row of key $1: label, fence, remaining µs (a key held by leases: the soonest
-- lease's), and the capacity of a key held by leases or an inline lease (0 for an
-- exclusive hold).
SELECT label, fence,
  (extract(epoch FROM COALESCE(
    CASE WHEN owner = '\x00000000000000000000000000000000'::bytea THEN
      (SELECT min(s.expires_at) FROM distlock_locks_leases s
        WHERE s.lock_key = l.lock_key AND s.expires_at > statement_timestamp()) END,
    expires_at) - statement_timestamp()) * 1000000)::bigint,
  CASE WHEN owner = '\x00000000000000000000000000000000'::bytea
    OR COALESCE(l.lease_fence = l.fence, FALSE) THEN capacity ELSE 0 END
FROM distlock_locks l WHERE lock_key = $1 AND expires_at > statement_timestamp()

-- name: release key owner
-- Marks owner $2's live row of key $1 expired and NOTIFYs (at commit). The row stays, so
-- the next holder's token counts up from it. The key travels hex-encoded: any key fits
-- the payload limit and the server encoding.
WITH released AS (
  UPDATE distlock_locks SET expires_at = 'epoch'
  WHERE lock_key = $1 AND owner = $2 AND expires_at > statement_timestamp()
  RETURNING lock_key)
SELECT pg_notify('distlock_locks_released', encode(lock_key, 'hex')) FROM released

-- name: force_release key
-- Frees key $1 whoever holds it: every lease and the reservation; NOTIFYs.
WITH leases AS (DELETE FROM distlock_locks_leases WHERE lock_key = $1),
released AS (
  UPDATE distlock_locks SET expires_at = 'epoch', res_expires_at = 'epoch', res_owner = NULL
  WHERE lock_key = $1
    AND (expires_at > statement_timestamp() OR res_expires_at > statement_timestamp())
  RETURNING lock_key)
SELECT pg_notify('distlock_locks_released', encode(lock_key, 'hex')) FROM released

-- name: gc
-- Deletes rows expired and granted longer than $1 µs ago, without a live reservation.
DELETE FROM distlock_locks WHERE expires_at <= statement_timestamp()
  AND fence < (extract(epoch FROM statement_timestamp()) * 1000000)::bigint - $1
  AND res_expires_at <= statement_timestamp()

-- name: mark key owner ttl waited
-- Marks key $1 as the next turn of owner $2 for $3 µs, its arrival $4 µs ago (see
-- Statements::mark), on a key of the exclusive or read-write capacity only.
UPDATE distlock_locks SET
  res_since = CASE WHEN res_owner = $2 AND res_expires_at > statement_timestamp()
      AND res_since < (extract(epoch FROM statement_timestamp()) * 1000000)::bigint - $4
    THEN res_since ELSE (extract(epoch FROM statement_timestamp()) * 1000000)::bigint - $4 END,
  res_owner = $2, res_weight = 4294967295,
  res_expires_at = statement_timestamp() + ($3::bigint * interval '1 microsecond')
WHERE lock_key = $1 AND capacity = 4294967295
  AND (res_expires_at <= statement_timestamp() OR res_owner = $2 OR res_since IS NULL
    OR res_since > (extract(epoch FROM statement_timestamp()) * 1000000)::bigint - $4)
