-- distlock_locks_release_lease(key, owner): 1 when the owner's live lease was deleted
-- (the row's expiry set to the latest lease left, its fence moved on, the release
-- announced on the table's channel, distlock_locks_released), 0 when the owner holds none.
--
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs;
-- '\x000…'::bytea is the marker owner of a key held by leases.
CREATE OR REPLACE FUNCTION distlock_locks_release_lease(p_key bytea, p_owner bytea)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  now_ts timestamptz := statement_timestamp();
  now_us bigint := (extract(epoch FROM statement_timestamp()) * 1000000)::bigint;
  leased boolean;
  n bigint;
BEGIN
  -- The lock of the key's row, then whether live leases hold the key.
  SELECT owner = '\x00000000000000000000000000000000'::bytea AND expires_at > now_ts
    INTO leased FROM distlock_locks WHERE lock_key = p_key FOR UPDATE;
  IF leased IS NOT TRUE THEN RETURN 0; END IF;
  -- After the row's lock, as in the transaction: the row's expiry becomes the latest other
  -- live lease's (the statement does not see its own DELETE), its fence moves on so a
  -- waiter that read the old one knows a lease went, and the NOTIFY is delivered when the
  -- call commits.
  WITH gone AS (
    DELETE FROM distlock_locks_leases
    WHERE lock_key = p_key AND owner = p_owner AND expires_at > now_ts RETURNING 1),
  settled AS (
    UPDATE distlock_locks SET expires_at = COALESCE((SELECT max(s.expires_at)
        FROM distlock_locks_leases s WHERE s.lock_key = p_key AND s.owner <> p_owner
        AND s.expires_at > now_ts), 'epoch'),
      fence = GREATEST((LEAST(fence, 9223372036854775806) + 1), now_us)
    WHERE lock_key = p_key AND EXISTS (SELECT 1 FROM gone) RETURNING 1)
  SELECT count(*) INTO n FROM settled;
  IF n = 0 THEN RETURN 0; END IF;
  PERFORM pg_notify('distlock_locks_released', encode(p_key, 'hex'));
  RETURN 1;
END $fn$
