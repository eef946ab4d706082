-- distlock_locks_extend_lease(key, owner, ttl µs): the lease's token when the owner's live
-- lease (and the row) now expire no sooner than the TTL from now, -1 when the owner holds
-- none.
--
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs;
-- '\x000…'::bytea is the marker owner of a key held by leases.
CREATE OR REPLACE FUNCTION distlock_locks_extend_lease(p_key bytea, p_owner bytea,
    p_ttl bigint)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  now_ts timestamptz := statement_timestamp();
  now_us bigint := (extract(epoch FROM statement_timestamp()) * 1000000)::bigint;
  until_ts timestamptz := statement_timestamp() + p_ttl * interval '1 microsecond';
  leased boolean;
  f bigint;
BEGIN
  -- The lock of the key's row, then whether live leases hold the key.
  SELECT owner = '\x00000000000000000000000000000000'::bytea AND expires_at > now_ts
    INTO leased FROM distlock_locks WHERE lock_key = p_key FOR UPDATE;
  IF leased IS NOT TRUE THEN RETURN -1; END IF;
  UPDATE distlock_locks_leases SET expires_at = GREATEST(expires_at, until_ts)
    WHERE lock_key = p_key AND owner = p_owner AND expires_at > now_ts
    RETURNING fence INTO f;
  IF NOT FOUND THEN RETURN -1; END IF;
  UPDATE distlock_locks SET expires_at = GREATEST(expires_at, until_ts)
    WHERE lock_key = p_key;
  RETURN f;
END $fn$
