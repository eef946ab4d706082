-- distlock_locks_claim(key, owner, label, weight, ttl µs, capacity): answers one row
-- `kind, fence, remaining, by_reservation, revision` (see backend/claims.rs, `kind`), having
-- written what that decision writes.
--
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs.
-- 4294967295 is the capacity of an exclusive or read-write key (READ_WRITE_CAPACITY);
-- 2305843009213693952 (2^61) is CLAIM_MARK, above every token.
--
-- A claim that is not exclusive first tries to take the key free in one statement, before
-- any transaction: a free row (expired, and no live reservation) becomes the owner's
-- inline lease, and a live row of the owner's own of the same capacity (its inline lease,
-- or its exclusive lock) is renewed; either answers the row's token as an exclusive grant
-- does (the holder releases and renews it by the exclusive statements). Anything else
-- changes nothing and is decided in a transaction of its own, READ COMMITTED, by
-- distlock_locks_decide (decide.sql), the claim rule's one copy.
CREATE PROCEDURE distlock_locks_claim(p_key VARBINARY(255), p_owner BINARY(16),
    p_label VARCHAR(255) CHARACTER SET utf8mb4, p_weight BIGINT, p_ttl BIGINT,
    p_capacity BIGINT)
MODIFIES SQL DATA SQL SECURITY INVOKER
claim: BEGIN
  DECLARE v_kind, v_fence, v_left, v_by_res, v_revision BIGINT;
  DECLARE v_taken BIGINT UNSIGNED;
  DECLARE v_exclusive BOOLEAN DEFAULT p_weight = 4294967295 AND p_capacity = 4294967295;
  -- Any error rolls the transaction back (a lock wait timeout rolls back only the
  -- statement, and would leave it open on the connection).
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  IF NOT v_exclusive THEN
    -- One statement, committed by itself: assignments left to right, each seeing the
    -- ones before; the test of a free row reads only columns assigned last or never.
    INSERT INTO distlock_locks (lock_key, owner, label, fence, expires_at, capacity,
        lease_weight, lease_fence)
      VALUES (p_key, p_owner, p_label,
        LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))),
        UTC_TIMESTAMP(6) + INTERVAL p_ttl MICROSECOND, p_capacity, p_weight,
        TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))
      ON DUPLICATE KEY UPDATE
        fence = IF((expires_at <= UTC_TIMESTAMP(6) AND res_expires_at <= UTC_TIMESTAMP(6)),
          LAST_INSERT_ID(GREATEST(fence + 1,
            TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))),
          IF(owner = p_owner AND expires_at > UTC_TIMESTAMP(6) AND capacity = p_capacity,
            LAST_INSERT_ID(fence), fence + 0 * LAST_INSERT_ID(2305843009213693952))),
        lease_fence = IF((expires_at <= UTC_TIMESTAMP(6)
          AND res_expires_at <= UTC_TIMESTAMP(6)), fence, lease_fence),
        lease_weight = IF((expires_at <= UTC_TIMESTAMP(6)
          AND res_expires_at <= UTC_TIMESTAMP(6)), p_weight, lease_weight),
        label = IF((expires_at <= UTC_TIMESTAMP(6)
          AND res_expires_at <= UTC_TIMESTAMP(6)), p_label, label),
        capacity = IF((expires_at <= UTC_TIMESTAMP(6)
          AND res_expires_at <= UTC_TIMESTAMP(6)), p_capacity, capacity),
        owner = IF((expires_at <= UTC_TIMESTAMP(6)
          AND res_expires_at <= UTC_TIMESTAMP(6)), p_owner, owner),
        expires_at = IF((expires_at <= UTC_TIMESTAMP(6) AND res_expires_at <= UTC_TIMESTAMP(6))
          OR (owner = p_owner AND capacity = p_capacity AND expires_at > UTC_TIMESTAMP(6)),
          GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL p_ttl MICROSECOND), expires_at);
    SET v_taken = LAST_INSERT_ID();
    IF v_taken < 2305843009213693952 THEN
      SELECT 3, CAST(v_taken AS SIGNED), -1, 0, CAST(v_taken AS SIGNED);
      LEAVE claim;
    END IF;
  END IF;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  CALL distlock_locks_decide(p_key, p_owner, p_label, p_weight, p_ttl, p_capacity,
    v_kind, v_fence, v_left, v_by_res, v_revision);
  COMMIT;
  SELECT v_kind, v_fence, v_left, v_by_res, v_revision;
END
