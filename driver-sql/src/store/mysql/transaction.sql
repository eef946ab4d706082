-- MySQL/MariaDB's statements of a lock inside the caller's transaction (src/transaction.rs),
-- each under `-- name:`, written for the table distlock_locks (replaced by the backend's
-- table wherever it occurs). The transaction holds the key's row locked until it ends; a
-- claim of the key waits for that lock at most the session's innodb_lock_wait_timeout
-- (1 s on the backend's own connections), then answers the key held. X'000…' is the marker
-- owner; a free key is one whose row expired and whose reservation, if any, lapsed.

-- name: look owner key
-- On the backend's connections, before the transaction locks anything: the key's row, 1 and
-- the µs until it may be free when it is held (by a lease, or another owner's reservation),
-- 0 and 0 when free (or reserved for the transaction's owner, ?1); no row when it has none.
-- The transaction locks a row only when it looks free, so that it seldom holds a held
-- key's row, which it cannot give back before it ends; and never looks for a row that is
-- not there, which under REPEATABLE READ would lock the gap where the key's row goes, and
-- keep every insert of it out until the transaction ends. A transaction refused marks the
-- key as its next turn (the `mark` statement of lock.sql), so no lease is granted between
-- its look and its lock.
SELECT IF(expires_at > UTC_TIMESTAMP(6)
    OR (res_expires_at > UTC_TIMESTAMP(6) AND res_owner <> ?), 1, 0),
  GREATEST(0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6),
    IF(expires_at > UTC_TIMESTAMP(6), expires_at, res_expires_at)))
FROM distlock_locks WHERE lock_key = ?

-- name: row key
-- On the backend's connections: a free row for a key that has none, so the transaction has
-- a row to lock, its fence the clock's floor as a grant's would be (so the garbage
-- collector leaves it a while).
INSERT IGNORE INTO distlock_locks (lock_key, owner, label, fence, expires_at)
VALUES (?, X'00000000000000000000000000000000', '(transaction)',
  TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)), '1970-01-01 00:00:00')

-- name: lock owner key
-- In the caller's transaction: locks the key's row for the rest of the transaction, or skips
-- it at once while another transaction holds it, or a claim of the key is being decided.
-- Answers 1 when the row is free (or reserved for the transaction's owner, ?1), 0 when held
-- (a lease or a reservation taken since the look), no row when it is locked (or was
-- collected since the look). SKIP LOCKED rather than NOWAIT: a refusal is then an empty
-- answer, not an error, which a caller that drops the attempt leaves unread on its
-- connection, and sqlx hands an unread error to the connection's next statement. A locking
-- read sees the latest committed row, whatever the transaction's isolation level.
SELECT IF(expires_at <= UTC_TIMESTAMP(6)
    AND (res_expires_at <= UTC_TIMESTAMP(6) OR res_owner = ?), 1, 0)
FROM distlock_locks WHERE lock_key = ? FOR UPDATE SKIP LOCKED

-- name: take owner key
-- In the caller's transaction, the row locked and free: moves the fence on and reports it
-- in LAST_INSERT_ID, and ends the owner's (?1) reservation. The row stays expired: while
-- the transaction lasts, its lock of the row is the hold; a rollback takes the new fence
-- back with the transaction's writes (and leaves the reservation to lapse).
UPDATE distlock_locks
SET fence = LAST_INSERT_ID(GREATEST(fence + 1,
    TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))),
  res_expires_at = IF(res_owner = ?, '1970-01-01 00:00:00', res_expires_at)
WHERE lock_key = ?
