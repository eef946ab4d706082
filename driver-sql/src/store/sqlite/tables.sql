-- The lock table distlock_locks, its leases and its claims (see docs/sql.md, "The table").
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs.
-- Times are µs on SQLite's own clock; 4294967295 is READ_WRITE_CAPACITY.
CREATE TABLE IF NOT EXISTS distlock_locks (
  lock_key BLOB NOT NULL PRIMARY KEY,
  owner BLOB NOT NULL,
  label TEXT NOT NULL,
  fence INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  capacity INTEGER NOT NULL DEFAULT 4294967295,
  res_owner BLOB,
  res_weight INTEGER NOT NULL DEFAULT 0,
  res_expires_at INTEGER NOT NULL DEFAULT 0,
  res_since INTEGER) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS distlock_locks_leases (
  lock_key BLOB NOT NULL,
  owner BLOB NOT NULL,
  label TEXT NOT NULL,
  weight INTEGER NOT NULL,
  fence INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  capacity INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (lock_key, owner)) WITHOUT ROWID;
-- A claim as leases.sql's `claim` decided it, inserted only for its trigger (triggers.sql) to write
-- the decision, which deletes it again in the same statement: always empty.
CREATE TABLE IF NOT EXISTS distlock_locks_claims (
  lock_key BLOB NOT NULL,
  owner BLOB NOT NULL,
  label TEXT NOT NULL,
  weight INTEGER NOT NULL,
  capacity INTEGER NOT NULL,
  ttl INTEGER NOT NULL,
  now_us INTEGER NOT NULL,
  kind INTEGER NOT NULL,
  token INTEGER NOT NULL,
  remaining INTEGER NOT NULL,
  by_reservation INTEGER NOT NULL,
  revision INTEGER NOT NULL);
