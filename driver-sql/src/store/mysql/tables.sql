-- The lock table distlock_locks and its leases (see docs/sql.md, "The table"), InnoDB, the
-- label byte-exact UTF-8 text. The table name `distlock_locks` is replaced by the backend's
-- table wherever it occurs. 4294967295 is READ_WRITE_CAPACITY.
CREATE TABLE IF NOT EXISTS distlock_locks (
  lock_key VARBINARY(255) NOT NULL PRIMARY KEY,
  owner BINARY(16) NOT NULL,
  label VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  fence BIGINT NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  capacity BIGINT NOT NULL DEFAULT 4294967295,
  res_owner BINARY(16) NULL,
  res_weight BIGINT NOT NULL DEFAULT 0,
  res_expires_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00',
  res_since BIGINT NULL,
  lease_weight BIGINT NOT NULL DEFAULT 0,
  lease_fence BIGINT NULL) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS distlock_locks_leases (
  lock_key VARBINARY(255) NOT NULL,
  owner BINARY(16) NOT NULL,
  label VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  weight BIGINT NOT NULL,
  fence BIGINT NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  PRIMARY KEY (lock_key, owner)) ENGINE=InnoDB;
