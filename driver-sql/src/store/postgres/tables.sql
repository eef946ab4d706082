-- The lock table distlock_locks and its leases (see docs/sql.md, "The table"). The table
-- name `distlock_locks` is replaced by the backend's table wherever it occurs.
--
-- lock_key: the key's UTF-8 bytes, compared exactly; owner: the holder's 128-bit owner
-- token, or the marker while leases hold the key; capacity: the key's, while it lives
-- (4294967295, READ_WRITE_CAPACITY, for an exclusive or read-write key); res_*: the
-- reservation, res_since its arrival (µs); lease_weight and lease_fence: the inline lease,
-- and the grant that wrote it.
CREATE TABLE IF NOT EXISTS distlock_locks (
  lock_key BYTEA NOT NULL PRIMARY KEY,
  owner BYTEA NOT NULL,
  label TEXT NOT NULL,
  fence BIGINT NOT NULL,
  expires_at TIMESTAMPTZ NOT NULL,
  capacity BIGINT NOT NULL DEFAULT 4294967295,
  res_owner BYTEA,
  res_weight BIGINT NOT NULL DEFAULT 0,
  res_expires_at TIMESTAMPTZ NOT NULL DEFAULT 'epoch',
  res_since BIGINT,
  lease_weight BIGINT NOT NULL DEFAULT 0,
  lease_fence BIGINT);
CREATE TABLE IF NOT EXISTS distlock_locks_leases (
  lock_key BYTEA NOT NULL,
  owner BYTEA NOT NULL,
  label TEXT NOT NULL,
  weight BIGINT NOT NULL,
  fence BIGINT NOT NULL,
  expires_at TIMESTAMPTZ NOT NULL,
  PRIMARY KEY (lock_key, owner));
