-- SQLite's statements of a lock inside the caller's transaction (src/transaction.rs), each
-- under `-- name:`, written for the table distlock_locks (replaced by the backend's table
-- wherever it occurs). The transaction writes the key's row, so it holds the database's
-- write lock until it ends: every other writer, a claim of any key included, waits for it
-- (its busy timeout). The clock is SQLite's own in whole µs: (CAST(ROUND(unixepoch('subsec')
-- * 1000) AS INTEGER) * 1000). X'000…' is the marker owner.

-- name: look key owner
-- On the backend's connections, before the transaction writes: the key's row, 1 and the µs
-- until it may be free while it is held (by a lease, or another owner's reservation), 0
-- and 0 when free (or reserved for the transaction's owner, ?2); no row when it has none.
-- The transaction writes only when the key looks free, so that it seldom holds the write
-- lock over a held key, whose holder could then not renew or release it; a transaction
-- refused marks the key as its next turn (the `mark` statement of lock.sql), so no lease
-- is granted between its look and its write.
SELECT CASE
    WHEN expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
      OR (res_expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
        AND res_owner <> ?2)
    THEN 1 ELSE 0 END,
  MAX(0, CASE
    WHEN expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
    THEN expires_at ELSE res_expires_at END
  - (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000))
FROM distlock_locks WHERE lock_key = ?1

-- name: take key owner
-- In the caller's transaction: if the key is free (its row expired or missing, and no
-- reservation lives but the owner's, ?2), moves its fence on, or writes a free row for it,
-- ends the owner's reservation, and answers the fence; a key held answers no row. The row
-- stays expired: while the transaction lasts, its write lock is the hold; a rollback takes
-- the row back with the transaction's writes.
INSERT INTO distlock_locks (lock_key, owner, label, fence, expires_at)
VALUES (?1, X'00000000000000000000000000000000', '(transaction)',
  (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000), 0)
ON CONFLICT (lock_key) DO UPDATE SET fence = MAX(fence + 1, excluded.fence),
  res_expires_at = CASE WHEN res_owner = ?2 THEN 0 ELSE res_expires_at END
WHERE expires_at <= excluded.fence
  AND (res_expires_at <= excluded.fence OR res_owner = ?2)
RETURNING fence
