-- The stamp of the lock table distlock_locks: schema version 1 (SCHEMA_VERSION), made last,
-- once the tables and procedures are there.
CREATE TABLE IF NOT EXISTS distlock_locks_version (
  id INT NOT NULL PRIMARY KEY,
  version BIGINT NOT NULL) ENGINE=InnoDB;
INSERT IGNORE INTO distlock_locks_version (id, version) VALUES (1, 1);
