-- distlock_locks_release_lease(key, owner): answers `1` released, `0` when the owner holds
-- no live lease. READ COMMITTED, the key's row locked before the leases are read.
--
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs;
-- X'000…' is the marker owner of a key held by leases.
CREATE PROCEDURE distlock_locks_release_lease(p_key VARBINARY(255), p_owner BINARY(16))
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
  DECLARE v_leased BOOLEAN DEFAULT FALSE;
  DECLARE v_released BIGINT DEFAULT 0;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_leased = FALSE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  SELECT expires_at > UTC_TIMESTAMP(6) AND owner = X'00000000000000000000000000000000'
    INTO v_leased FROM distlock_locks WHERE lock_key = p_key FOR UPDATE;
  IF v_leased THEN
    DELETE FROM distlock_locks_leases
      WHERE lock_key = p_key AND owner = p_owner AND expires_at > UTC_TIMESTAMP(6);
    IF ROW_COUNT() > 0 THEN
      -- The row's expiry becomes the latest lease left's, and its fence moves on so a
      -- waiter that read the old one knows a lease went.
      UPDATE distlock_locks SET expires_at = COALESCE((SELECT MAX(expires_at)
          FROM distlock_locks_leases WHERE lock_key = p_key
          AND expires_at > UTC_TIMESTAMP(6)), '1970-01-01 00:00:00'),
        fence = GREATEST(fence + 1,
          TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))
        WHERE lock_key = p_key;
      SET v_released = 1;
    END IF;
  END IF;
  COMMIT;
  SELECT v_released;
END
