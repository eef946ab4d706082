-- PostgreSQL's statements of shared leases, each under `-- name:`, written for the table
-- distlock_locks (replaced as in lock.sql). The claim, the release and the renewal of a
-- lease are the functions of claim.sql, release_lease.sql and extend_lease.sql.

-- name: claim key owner label weight ttl capacity
SELECT kind, token, remaining, by_reservation, revision
FROM distlock_locks_claim($1, $2, $3, $4, $5, $6)

-- name: release_lease key owner
SELECT distlock_locks_release_lease($1, $2)

-- name: extend_lease key owner ttl
SELECT distlock_locks_extend_lease($1, $2, $3)

-- name: peek key
-- Key $1's row without locking it: whether a reservation lives, and the fence.
SELECT (CASE WHEN res_expires_at > statement_timestamp() THEN 1 ELSE 0 END)::bigint, fence
FROM distlock_locks WHERE lock_key = $1

-- name: shown key
-- Key $1's live leases, and the inline lease of its row, as `holders` shows them, in
-- grant order.
SELECT s.label, s.fence, s.weight, l.capacity,
  (extract(epoch FROM s.expires_at - statement_timestamp()) * 1000000)::bigint
FROM distlock_locks_leases s JOIN distlock_locks l ON l.lock_key = s.lock_key
WHERE s.lock_key = $1 AND s.expires_at > statement_timestamp()
UNION ALL
SELECT label, fence, lease_weight, capacity,
  (extract(epoch FROM expires_at - statement_timestamp()) * 1000000)::bigint
FROM distlock_locks
WHERE lock_key = $1 AND expires_at > statement_timestamp()
  AND owner <> '\x00000000000000000000000000000000'::bytea
  AND COALESCE(lease_fence = fence, FALSE)
ORDER BY 2

-- name: abandon key owner
-- Removes owner $2's live reservation of key $1, and NOTIFYs.
WITH gone AS (
  UPDATE distlock_locks SET res_owner = NULL, res_expires_at = 'epoch'
  WHERE lock_key = $1 AND res_owner = $2 AND res_expires_at > statement_timestamp()
  RETURNING lock_key)
SELECT pg_notify('distlock_locks_released', encode(lock_key, 'hex')) FROM gone

-- name: gc_leases
DELETE FROM distlock_locks_leases WHERE expires_at <= statement_timestamp()

-- name: claim_set keys owner label weight ttl capacity
-- A set's claims in one call, all or nothing (claim_set.sql); $1 is the keys packed.
SELECT kind, token, remaining, by_reservation, revision
FROM distlock_locks_claim_set($1, $2, $3, $4, $5, $6)
