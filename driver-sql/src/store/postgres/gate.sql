-- distlock_locks_gate(key): the number of the key's gate, the advisory lock that a lock
-- inside a transaction (src/transaction.rs) takes exclusively for the rest of its
-- transaction, and that every claim of the key takes shared for its own statement
-- (`pg_try_advisory_xact_lock_shared`), so that it refuses the key while a transaction
-- holds it, and a transaction cannot take a key while a claim of it is being decided.
--
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs,
-- also in the text hashed: each table's keys have gates of their own. Two keys whose
-- numbers collide (one chance in 2^64 for a pair) only make each other's transactions
-- wait; they never let two holders in.
CREATE OR REPLACE FUNCTION distlock_locks_gate(p_key bytea) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
  SELECT hashtextextended('distlock_locks:' || encode(p_key, 'hex'), 0)
$fn$
