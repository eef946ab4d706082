-- PostgreSQL's statements of a lock inside the caller's transaction (src/transaction.rs),
-- each under `-- name:`, written for the table distlock_locks (replaced by the backend's
-- table wherever it occurs, also in the NOTIFY channel distlock_locks_released).

-- name: gate key
-- Run in the caller's transaction, inside a savepoint: takes key $1's gate (gate.sql) for
-- the rest of the transaction if no claim of the key is being decided and no other
-- transaction holds it, and then announces a release for when the transaction commits
-- (dropped with the savepoint if the key turns out held). Answers 1 taken, 0 not.
SELECT g.taken::int::bigint
FROM (SELECT pg_try_advisory_xact_lock(distlock_locks_gate($1)) AS taken) g
LEFT JOIN LATERAL (SELECT pg_notify('distlock_locks_released', encode($1, 'hex'))
  WHERE g.taken) n ON TRUE

-- name: held key
-- On the backend's connections, for `holders`: key $1's fence while a transaction holds
-- its gate, no row otherwise. The probe takes the gate shared, as a claim does, and gives
-- it back with this statement's own transaction: a transaction's attempt at that instant
-- is refused and tries again, as it would behind a claim. The row is expired while a
-- transaction holds the key (its `take` leaves it so), and its fence is the transaction's
-- token (moved on by `take`, committed at once).
SELECT fence FROM distlock_locks
WHERE lock_key = $1 AND expires_at <= statement_timestamp()
  AND NOT pg_try_advisory_xact_lock_shared(distlock_locks_gate($1))

-- name: take key
-- Run on the backend's own connections while the caller's transaction holds key $1's gate,
-- so no claim of the key can be decided meanwhile: if the key is free (its row expired or
-- missing, and no other owner's reservation lives), moves its fence on, committed at once,
-- and answers it, the transaction's fencing token; a key held answers no row. The row stays
-- expired: while the transaction lasts its gate is the hold.
INSERT INTO distlock_locks AS l (lock_key, owner, label, fence, expires_at)
VALUES ($1, '\x00000000000000000000000000000000'::bytea, '(transaction)',
  (extract(epoch FROM statement_timestamp()) * 1000000)::bigint, 'epoch')
ON CONFLICT (lock_key) DO UPDATE SET
  fence = GREATEST((LEAST(l.fence, 9223372036854775806) + 1), EXCLUDED.fence)
WHERE l.expires_at <= statement_timestamp() AND l.res_expires_at <= statement_timestamp()
RETURNING l.fence
