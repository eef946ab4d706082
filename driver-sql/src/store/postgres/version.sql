-- The stamp of the lock table distlock_locks: schema version 1 (SCHEMA_VERSION), made last,
-- once the tables and functions are there.
CREATE TABLE IF NOT EXISTS distlock_locks_version (
  id INTEGER NOT NULL PRIMARY KEY,
  version BIGINT NOT NULL);
INSERT INTO distlock_locks_version (id, version) VALUES (1, 1) ON CONFLICT (id) DO NOTHING;
