-- MySQL/MariaDB's statements of the exclusive lock, each under `-- name:`, written for the
-- table distlock_locks (replaced by the backend's table wherever it occurs). The clock is
-- UTC_TIMESTAMP(6) (NOW() follows the session time zone); 4294967295 is
-- READ_WRITE_CAPACITY; X'000…' the marker owner of a key held by leases. A row holds an
-- inline lease while its owner is not the marker and lease_fence = fence (docs/sql.md,
-- "The inline lease"). Parameters are `?`, bound in order.

-- name: acquire key owner label ttl
-- Key, owner, label, TTL µs. MySQL applies ON DUPLICATE KEY UPDATE assignments left to
-- right, each seeing the columns already assigned: `fence`, `label`, `capacity` and `owner`
-- decide on the old row (free: expired, and no live reservation, whoever's); `expires_at`
-- then sees the new owner, which is ours exactly when the row was taken or re-granted
-- (ours, expired, but held back by a reservation: the marker owner, so not ours). Every
-- path calls LAST_INSERT_ID(expr) once, first: the token, HELD_MARK (2^62) + the holder's
-- remaining µs, or CLAIM_MARK (2^61) when leases hold the key, an inline lease or the
-- owner's own of another capacity does, or a reservation lives: the claim call then
-- decides (a writer behind an inline lease reserves; the other capacity is refused).
INSERT INTO distlock_locks (lock_key, owner, label, fence, expires_at)
VALUES (?, ?, ?,
  LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))),
  UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
  fence = IF(expires_at <= UTC_TIMESTAMP(6) AND res_expires_at <= UTC_TIMESTAMP(6),
    LAST_INSERT_ID(GREATEST(fence + 1,
      TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))),
    IF(owner = VALUES(owner) AND expires_at > UTC_TIMESTAMP(6) AND capacity = 4294967295,
      LAST_INSERT_ID(fence),
      IF(owner = X'00000000000000000000000000000000' OR expires_at <= UTC_TIMESTAMP(6)
          OR COALESCE(lease_fence = fence, FALSE) OR owner = VALUES(owner),
        fence + 0 * LAST_INSERT_ID(2305843009213693952),
        fence + 0 * LAST_INSERT_ID(4611686018427387904
          + GREATEST(0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)))))),
  label = IF(expires_at <= UTC_TIMESTAMP(6) AND res_expires_at <= UTC_TIMESTAMP(6),
    VALUES(label), label),
  capacity = IF(expires_at <= UTC_TIMESTAMP(6) AND res_expires_at <= UTC_TIMESTAMP(6),
    4294967295, capacity),
  owner = IF(expires_at <= UTC_TIMESTAMP(6) AND res_expires_at <= UTC_TIMESTAMP(6),
    VALUES(owner),
    IF(owner = VALUES(owner) AND expires_at <= UTC_TIMESTAMP(6),
      X'00000000000000000000000000000000', owner)),
  expires_at = IF(owner = VALUES(owner) AND capacity = 4294967295,
    GREATEST(expires_at, VALUES(expires_at)), expires_at)

-- name: state key
-- The live row of a key: label, fence, remaining µs (a key held by leases: the soonest
-- lease's), and the capacity of a key held by leases or an inline lease (0 for an
-- exclusive hold).
SELECT label, fence,
  TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), COALESCE(
    CASE WHEN owner = X'00000000000000000000000000000000' THEN
      (SELECT MIN(s.expires_at) FROM distlock_locks_leases s
        WHERE s.lock_key = l.lock_key AND s.expires_at > UTC_TIMESTAMP(6)) END,
    expires_at)),
  CASE WHEN owner = X'00000000000000000000000000000000'
    OR COALESCE(l.lease_fence = l.fence, FALSE) THEN capacity ELSE 0 END
FROM distlock_locks l WHERE lock_key = ? AND expires_at > UTC_TIMESTAMP(6)

-- name: release key owner
-- Marks the owner's live row of a key (key, owner) expired. The row stays, so the next
-- holder's token counts up from it.
UPDATE distlock_locks SET expires_at = '1970-01-01 00:00:00'
WHERE lock_key = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)

-- name: force_release key
-- Frees a key whoever holds it, and its reservation (then its leases go: force_leases).
UPDATE distlock_locks SET expires_at = '1970-01-01 00:00:00',
  res_expires_at = '1970-01-01 00:00:00', res_owner = NULL
WHERE lock_key = ? AND (expires_at > UTC_TIMESTAMP(6) OR res_expires_at > UTC_TIMESTAMP(6))

-- name: force_leases key
DELETE FROM distlock_locks_leases WHERE lock_key = ?

-- name: gc
-- Deletes up to GC_BATCH (1000) rows expired and granted longer than the grace (µs) ago,
-- without a live reservation.
DELETE FROM distlock_locks WHERE expires_at <= UTC_TIMESTAMP(6)
  AND fence < TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) - ?
  AND res_expires_at <= UTC_TIMESTAMP(6)
LIMIT 1000

-- name: mark owner waited waited owner ttl key owner waited
-- Marks a key as the next turn of an owner (see Statements::mark), on a key of the
-- exclusive or read-write capacity only. Binds owner, waited, waited, owner, the mark's
-- TTL, key, owner, waited. MySQL assigns left to right, each assignment seeing the ones
-- before: the arrival first, while the old reservation is still there to read.
UPDATE distlock_locks SET
  res_since = CASE WHEN res_owner = ? AND res_expires_at > UTC_TIMESTAMP(6)
      AND res_since < TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) - ?
    THEN res_since
    ELSE TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) - ? END,
  res_owner = ?, res_weight = 4294967295,
  res_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE lock_key = ? AND capacity = 4294967295
  AND (res_expires_at <= UTC_TIMESTAMP(6) OR res_owner = ? OR res_since IS NULL
    OR res_since > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) - ?)
