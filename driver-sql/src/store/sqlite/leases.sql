-- SQLite's statements of shared leases, each under `-- name:` and what it binds,
-- written for the table distlock_locks (replaced by the backend's table wherever it
-- occurs); clock and marker as in lock.sql. The key's row follows each write by trigger
-- (triggers.sql). A release or renewal of an owner without a live lease on a key its
-- leases hold changes nothing and answers no row: `NotHeld`.

-- name: claim key owner label weight ttl capacity
-- A claim of key ?1 by owner ?2 (label ?3) of weight ?4 for ?5 µs, on a key of capacity ?6,
-- decided and written in ONE statement: the decision is inserted into distlock_locks_claims,
-- whose trigger (triggers.sql, distlock_locks_claimed) writes it and deletes it again. It
-- answers `kind, token, remaining, by_reservation, revision` as PostgreSQL's and MySQL's
-- claim routines do (see backend/claims.rs, `kind`).
--
-- The rule (docs/sql.md, "Shared claims"): a key held (or reserved) with another capacity is
-- a mismatch; an owner holding the key gets its token again; otherwise the claim is granted
-- when the live leases (or an exclusive holder's whole capacity), the claim's weight and
-- another owner's live reservation fit the capacity, with the token max(fence + 1, now).
-- A refusal records the owner's reservation unless another owner's lives (a writer behind
-- a writer needs none).
--
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs.
-- 4294967295 is READ_WRITE_CAPACITY; X'000…' is the marker owner of a key held by leases;
-- 9223372036854775806 keeps `fence + 1` from overflowing. 'now' is fixed for the statement.
WITH n AS (
  SELECT CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000 AS now_us),
r AS (
  SELECT n.now_us, l.owner,
    COALESCE(l.fence, 0) AS fence,
    COALESCE(l.capacity, 4294967295) AS capacity,
    COALESCE(l.expires_at, 0) AS expires_at,
    COALESCE(l.res_expires_at, 0) AS res_expires_at,
    COALESCE(l.res_weight, 0) AS res_weight,
    COALESCE(l.expires_at > n.now_us, 0) AS live,
    COALESCE(l.owner = X'00000000000000000000000000000000', 0) AS marker,
    COALESCE(l.res_expires_at > n.now_us AND l.res_owner IS NOT ?2, 0) AS res_other
  FROM n LEFT JOIN distlock_locks l ON l.lock_key = ?1),
s AS (
  SELECT max(CASE WHEN owner = ?2 THEN fence END) AS own_fence,
    COALESCE(sum(CASE WHEN owner <> ?2 THEN weight END), 0) AS others,
    min(CASE WHEN owner <> ?2 THEN expires_at END) AS soonest
  FROM distlock_locks_leases
  WHERE lock_key = ?1 AND expires_at > (SELECT now_us FROM n)),
d AS (
  SELECT r.*, s.*,
    r.live AND NOT r.marker AS held,
    r.live AND r.marker AS leased,
    CASE WHEN NOT r.live THEN 0 WHEN r.marker THEN s.others ELSE 4294967295 END AS used,
    CASE WHEN r.res_other THEN r.res_weight ELSE 0 END AS reserved,
    ?4 = 4294967295 AND ?6 = 4294967295 AS exclusive_claim
  FROM r, s),
k AS (
  -- 0 mismatch, 1 the row renewed, 2 the lease renewed, 3 the whole key, 4 a lease,
  -- 5 refused.
  SELECT d.*, CASE
      WHEN (live OR res_expires_at > now_us) AND capacity <> ?6 THEN 0
      WHEN held AND owner = ?2 THEN 1
      WHEN leased AND own_fence IS NOT NULL THEN 2
      WHEN used + ?4 + reserved <= ?6 AND exclusive_claim THEN 3
      WHEN used + ?4 + reserved <= ?6 THEN 4
      ELSE 5 END AS kind
  FROM d)
INSERT INTO distlock_locks_claims (lock_key, owner, label, weight, capacity, ttl, now_us,
    kind, token, remaining, by_reservation, revision)
SELECT ?1, ?2, ?3, ?4, ?6, ?5, now_us, kind,
  CASE kind WHEN 0 THEN capacity WHEN 1 THEN fence WHEN 2 THEN own_fence WHEN 5 THEN fence
    ELSE max(min(fence, 9223372036854775806) + 1, now_us) END,
  -- A refusal: until the holder, or the soonest blocking lease, or the reservation, expires.
  CASE WHEN kind <> 5 THEN -1
    WHEN held THEN expires_at - now_us
    WHEN used + ?4 > ?6 THEN COALESCE(soonest - now_us, -1)
    WHEN res_other THEN res_expires_at - now_us
    ELSE -1 END,
  -- 2: the refusal records the owner's reservation; 1: only a reservation stands in the way.
  CASE WHEN kind <> 5 THEN 0
    WHEN NOT res_other AND (NOT exclusive_claim OR leased) THEN 2
    WHEN used + ?4 <= ?6 THEN 1
    ELSE 0 END,
  fence
FROM k
RETURNING kind, token, remaining, by_reservation, revision

-- name: release_lease key owner
-- Deletes owner ?2's live lease of key ?1: the row's expiry becomes the latest live
-- lease's and its fence moves on, so a waiter that read the old one knows a lease went.
DELETE FROM distlock_locks_leases
WHERE lock_key = ?1 AND owner = ?2
  AND expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
  AND EXISTS (SELECT 1 FROM distlock_locks WHERE lock_key = ?1
    AND owner = X'00000000000000000000000000000000'
    AND expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000))
RETURNING 1

-- name: extend_lease key owner ttl
-- Pushes owner ?2's live lease of key ?1 out to ?3 µs from now, never in: its token.
UPDATE distlock_locks_leases
SET expires_at = MAX(expires_at, (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000) + ?3)
WHERE lock_key = ?1 AND owner = ?2
  AND expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
  AND EXISTS (SELECT 1 FROM distlock_locks WHERE lock_key = ?1
    AND owner = X'00000000000000000000000000000000'
    AND expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000))
RETURNING fence

-- name: shown key
-- Key ?1's live leases as `holders` shows them, in grant order.
SELECT s.label, s.fence, s.weight, l.capacity,
  s.expires_at - (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
FROM distlock_locks_leases s JOIN distlock_locks l ON l.lock_key = s.lock_key
WHERE s.lock_key = ?1
  AND s.expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
ORDER BY s.fence

-- name: abandon key owner
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
