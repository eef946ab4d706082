-- SQLite's statements of a lock inside the caller's transaction (src/transaction.rs), each
-- under `-- name:`, written for the table distlock_locks (replaced by the backend's table
-- wherever it occurs). The transaction writes the key's row, so it holds the database's
-- write lock until it ends: every other writer, a claim of any key included, waits for it
-- (its busy timeout). The clock is SQLite's own in whole µs: (CAST(ROUND(unixepoch('subsec')
-- * 1000) AS INTEGER) * 1000). X'000…' is the marker owner.

-- name: look key
-- On the backend's connections, before the transaction writes: 1 and the µs until the key
-- may be free while it is held (by a lease or a reservation), no row when free. The
-- transaction writes only when the key looks free, so that it seldom holds the write lock
-- over a held key, whose holder could then not renew or release it.
SELECT 1, MAX(0, CASE
    WHEN expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
    THEN expires_at ELSE res_expires_at END
  - (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000))
FROM distlock_locks
WHERE lock_key = ?1
  AND (expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
    OR res_expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000))

-- name: take key
-- In the caller's transaction: if the key is free (its row expired or missing, and no
-- reservation lives), moves its fence on, or writes a free row for it, and answers the
-- fence; a key held answers no row. The row stays expired: while the transaction lasts, its
-- write lock is the hold; a rollback takes the row back with the transaction's writes.
INSERT INTO distlock_locks (lock_key, owner, label, fence, expires_at)
VALUES (?1, X'00000000000000000000000000000000', '(transaction)',
  (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000), 0)
ON CONFLICT (lock_key) DO UPDATE SET fence = MAX(fence + 1, excluded.fence)
WHERE expires_at <= excluded.fence AND res_expires_at <= excluded.fence
RETURNING fence
