-- MySQL/MariaDB's statements of shared leases, each under `-- name:`, written for the
-- table distlock_locks (replaced as in lock.sql). The claim, the release and the renewal
-- of a lease are the procedures of claim.sql, release_lease.sql and extend_lease.sql.

-- name: claim key owner label weight ttl capacity
CALL distlock_locks_claim(?, ?, ?, ?, ?, ?)

-- name: release_lease key owner
CALL distlock_locks_release_lease(?, ?)

-- name: extend_lease key owner ttl
CALL distlock_locks_extend_lease(?, ?, ?)

-- name: shown key key
-- A key's live leases, and the inline lease of its row, as `holders` shows them, in grant
-- order. Binds the key twice.
SELECT s.label, s.fence, s.weight, l.capacity,
  TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), s.expires_at)
FROM distlock_locks_leases s JOIN distlock_locks l ON l.lock_key = s.lock_key
WHERE s.lock_key = ? AND s.expires_at > UTC_TIMESTAMP(6)
UNION ALL
SELECT label, fence, lease_weight, capacity,
  TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)
FROM distlock_locks
WHERE lock_key = ? AND expires_at > UTC_TIMESTAMP(6)
  AND owner <> X'00000000000000000000000000000000' AND COALESCE(lease_fence = fence, FALSE)
ORDER BY 2

-- name: abandon key owner
-- Removes the owner's live reservation of a key (key, owner).
UPDATE distlock_locks SET res_owner = NULL, res_expires_at = '1970-01-01 00:00:00'
WHERE lock_key = ? AND res_owner = ? AND res_expires_at > UTC_TIMESTAMP(6)

-- name: gc_leases
-- Deletes up to GC_BATCH (1000) expired leases.
DELETE FROM distlock_locks_leases WHERE expires_at <= UTC_TIMESTAMP(6) LIMIT 1000

-- name: claim_set keys owner label weight ttl capacity
-- A set's claims in one call, all or nothing (claim_set.sql); the first value is the keys
-- packed.
CALL distlock_locks_claim_set(?, ?, ?, ?, ?, ?)
