-- The triggers that keep a key's row in the lock table distlock_locks in step with its
-- leases, so that one statement on the leases table claims, releases or renews a lease.
--
-- While leases live, the key's row is held by the marker owner (X'000…') until the latest
-- lease expires, with the last token as its fence: that is what the exclusive statements
-- and the pollers read without looking at the leases. Every write of a lease goes through
-- these triggers; no statement writes those columns of the row by hand as well.
--
-- A trigger runs inside the statement that fired it (the same write lock, the same
-- 'now'), so the lease and the row change together or not at all. The clock is SQLite's
-- own, in whole microseconds (millisecond resolution), as sqlite/statements.rs spells it (NOW_US).
--
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs.

-- A lease granted (inserted; the claim's trigger deletes the owner's expired lease first):
-- the row is created if missing, held by the marker at least until the lease
-- expires, the lease's token is its fence, its capacity the claim's, and the owner's
-- reservation is spent.
DROP TRIGGER IF EXISTS distlock_locks_lease_granted;
CREATE TRIGGER distlock_locks_lease_granted AFTER INSERT ON distlock_locks_leases BEGIN
  INSERT INTO distlock_locks (lock_key, owner, label, fence, expires_at)
    SELECT NEW.lock_key, X'00000000000000000000000000000000', '(shared)', NEW.fence,
      NEW.expires_at
    WHERE NOT EXISTS (SELECT 1 FROM distlock_locks WHERE lock_key = NEW.lock_key);
  UPDATE distlock_locks SET owner = X'00000000000000000000000000000000', label = '(shared)',
      fence = NEW.fence, capacity = NEW.capacity,
      expires_at = MAX(expires_at, NEW.expires_at),
      res_expires_at = CASE WHEN res_owner = NEW.owner THEN 0 ELSE res_expires_at END
    WHERE lock_key = NEW.lock_key;
END;

-- A lease renewed (same token): the row lives at least as long.
DROP TRIGGER IF EXISTS distlock_locks_lease_renewed;
CREATE TRIGGER distlock_locks_lease_renewed AFTER UPDATE OF expires_at ON distlock_locks_leases
WHEN NEW.fence = OLD.fence BEGIN
  UPDATE distlock_locks SET expires_at = MAX(expires_at, NEW.expires_at)
    WHERE lock_key = NEW.lock_key;
END;

-- A live lease of a key its leases hold released: the row's expiry becomes the latest live
-- lease's (0, free, when none is left) and its fence moves on, so a waiter that read the
-- old one knows a lease went. Deleting expired leases (the garbage collector) or the
-- leases of a key already freed (force release) leaves the row alone.
DROP TRIGGER IF EXISTS distlock_locks_lease_released;
CREATE TRIGGER distlock_locks_lease_released AFTER DELETE ON distlock_locks_leases
WHEN OLD.expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
  AND EXISTS (SELECT 1 FROM distlock_locks WHERE lock_key = OLD.lock_key
    AND owner = X'00000000000000000000000000000000'
    AND expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)) BEGIN
  UPDATE distlock_locks SET expires_at = COALESCE((SELECT MAX(expires_at)
      FROM distlock_locks_leases WHERE lock_key = OLD.lock_key
      AND expires_at > (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)), 0),
    fence = MAX(fence + 1, (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000))
    WHERE lock_key = OLD.lock_key;
END;

-- A claim decided (leases.sql, `claim`): the write of its kind, then the claim is gone again. Each
-- statement below changes nothing but for its own kind.
DROP TRIGGER IF EXISTS distlock_locks_claimed;
CREATE TRIGGER distlock_locks_claimed AFTER INSERT ON distlock_locks_claims BEGIN
  -- 1: the owner's exclusive hold, renewed, never shortened.
  UPDATE distlock_locks SET expires_at = max(expires_at, NEW.now_us + NEW.ttl)
    WHERE NEW.kind = 1 AND lock_key = NEW.lock_key;
  -- 2: the owner's live lease, renewed, never shortened (the row follows, above).
  UPDATE distlock_locks_leases SET expires_at = max(expires_at, NEW.now_us + NEW.ttl)
    WHERE NEW.kind = 2 AND lock_key = NEW.lock_key AND owner = NEW.owner
      AND expires_at > NEW.now_us;
  -- 3: the whole key, the owner's reservation spent.
  INSERT INTO distlock_locks (lock_key, owner, label, fence, expires_at)
    SELECT NEW.lock_key, NEW.owner, NEW.label, NEW.token, NEW.now_us + NEW.ttl
    WHERE NEW.kind = 3
    ON CONFLICT (lock_key) DO UPDATE SET owner = excluded.owner, label = excluded.label,
      fence = excluded.fence, expires_at = excluded.expires_at, capacity = 4294967295,
      res_expires_at = CASE WHEN res_owner = excluded.owner THEN 0 ELSE res_expires_at END;
  -- 4: a lease, in place of the owner's expired one if any (the row follows, above).
  DELETE FROM distlock_locks_leases
    WHERE NEW.kind = 4 AND lock_key = NEW.lock_key AND owner = NEW.owner;
  INSERT INTO distlock_locks_leases (lock_key, owner, label, weight, fence, expires_at,
      capacity)
    SELECT NEW.lock_key, NEW.owner, NEW.label, NEW.weight, NEW.token, NEW.now_us + NEW.ttl,
      NEW.capacity
    WHERE NEW.kind = 4;
  -- 5, answered as kept: the owner's reservation, recorded or refreshed (a refreshed one
  -- keeps its arrival).
  UPDATE distlock_locks SET res_since = CASE WHEN res_owner = NEW.owner
      AND res_expires_at > NEW.now_us AND res_since < NEW.now_us
      THEN res_since ELSE NEW.now_us END,
    res_owner = NEW.owner, res_weight = NEW.weight, res_expires_at = NEW.now_us + NEW.ttl
    WHERE NEW.kind = 5 AND NEW.by_reservation = 2 AND lock_key = NEW.lock_key;
  DELETE FROM distlock_locks_claims WHERE rowid = NEW.rowid;
END;
