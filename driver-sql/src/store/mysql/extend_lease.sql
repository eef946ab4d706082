-- distlock_locks_extend_lease(key, owner, ttl µs): answers the lease's token when the
-- owner's live lease (and the row) now expire no sooner than the TTL from now, `-1` when
-- the owner holds none. READ COMMITTED, the key's row locked before the leases are read.
--
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs;
-- X'000…' is the marker owner of a key held by leases.
CREATE PROCEDURE distlock_locks_extend_lease(p_key VARBINARY(255), p_owner BINARY(16),
    p_ttl BIGINT)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
  DECLARE v_leased BOOLEAN DEFAULT FALSE;
  DECLARE v_fence BIGINT DEFAULT -1;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_leased = FALSE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  SELECT expires_at > UTC_TIMESTAMP(6) AND owner = X'00000000000000000000000000000000'
    INTO v_leased FROM distlock_locks WHERE lock_key = p_key FOR UPDATE;
  IF v_leased THEN
    SELECT COALESCE(MAX(fence), -1) INTO v_fence FROM distlock_locks_leases
      WHERE lock_key = p_key AND owner = p_owner AND expires_at > UTC_TIMESTAMP(6);
    IF v_fence >= 0 THEN
      UPDATE distlock_locks_leases
        SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL p_ttl MICROSECOND)
        WHERE lock_key = p_key AND owner = p_owner AND expires_at > UTC_TIMESTAMP(6);
      UPDATE distlock_locks
        SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL p_ttl MICROSECOND)
        WHERE lock_key = p_key;
    END IF;
  END IF;
  COMMIT;
  SELECT v_fence;
END
