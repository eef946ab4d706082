-- distlock_locks_decide(key, owner, label, weight, ttl µs, capacity, OUT kind, OUT fence,
-- OUT remaining, OUT by_reservation, OUT revision): the claim rule of MySQL/MariaDB, its one
-- copy. Decides a claim and writes what the decision writes, inside the caller's
-- transaction, which it neither starts nor ends: distlock_locks_claim runs it in a
-- transaction of its own, distlock_locks_claim_set once per key in the set's. That
-- transaction must be READ COMMITTED, so that the leases read after the key's row is
-- locked are the committed ones, not those of a snapshot taken before (at another key of
-- the set).
-- The outcome is what the claim call answers (see backend/claims.rs, `kind`); remaining
-- is -1 for none.
--
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs.
-- 4294967295 is the capacity of an exclusive or read-write key (READ_WRITE_CAPACITY);
-- X'000…' is the marker owner of a key held by leases.
--
-- It locks the key's row (created free when missing) before it reads the leases.
CREATE PROCEDURE distlock_locks_decide(p_key VARBINARY(255), p_owner BINARY(16),
    p_label VARCHAR(255) CHARACTER SET utf8mb4, p_weight BIGINT, p_ttl BIGINT,
    p_capacity BIGINT, OUT o_kind BIGINT, OUT o_fence BIGINT, OUT o_left BIGINT,
    OUT o_by_res BIGINT, OUT o_revision BIGINT)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
  DECLARE v_found, v_live, v_mine, v_shared, v_res_live, v_res_mine, v_inline BOOLEAN;
  DECLARE v_fence, v_capacity, v_res_weight, v_remaining, v_res_remaining, v_now_us,
    v_soonest, v_own, v_left, v_revision, v_lease_weight BIGINT;
  DECLARE v_used DECIMAL(65, 0) DEFAULT 0;
  DECLARE v_kind, v_by_res BIGINT DEFAULT 0;
  DECLARE v_exclusive BOOLEAN DEFAULT p_weight = 4294967295 AND p_capacity = 4294967295;
  DECLARE v_res_other BOOLEAN;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = NULL;
  -- The key's row, locked, and its inline lease; a missing row is created free, then
  -- locked and read.
  read_row: LOOP
    SELECT TRUE, expires_at > UTC_TIMESTAMP(6), owner = p_owner,
        owner = X'00000000000000000000000000000000', fence, capacity,
        res_expires_at > UTC_TIMESTAMP(6), res_owner <=> p_owner, res_weight,
        TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at),
        TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), res_expires_at),
        TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)),
        (owner <> X'00000000000000000000000000000000' AND COALESCE(lease_fence = fence, FALSE)),
        lease_weight
      INTO v_found, v_live, v_mine, v_shared, v_fence, v_capacity, v_res_live, v_res_mine,
        v_res_weight, v_remaining, v_res_remaining, v_now_us, v_inline, v_lease_weight
      FROM distlock_locks WHERE lock_key = p_key FOR UPDATE;
    IF v_found IS NOT NULL THEN
      LEAVE read_row;
    END IF;
    INSERT INTO distlock_locks (lock_key, owner, label, fence, expires_at)
      VALUES (p_key, X'00000000000000000000000000000000', '(shared)', 0,
        '1970-01-01 00:00:00')
      ON DUPLICATE KEY UPDATE fence = fence;
  END LOOP;
  SET v_revision = v_fence;
  IF (v_live OR v_res_live) AND v_capacity <> p_capacity THEN
    SET v_kind = 0, v_fence = v_capacity;
  ELSEIF v_live AND NOT v_shared AND v_mine THEN
    UPDATE distlock_locks
      SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL p_ttl MICROSECOND)
      WHERE lock_key = p_key;
    SET v_kind = 1;
  ELSE
    IF v_live AND v_shared THEN
      SELECT COALESCE(SUM(IF(owner = p_owner, 0, weight)), 0),
          MIN(IF(owner = p_owner, NULL, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at))),
          MAX(IF(owner = p_owner, fence, NULL))
        INTO v_used, v_soonest, v_own
        FROM distlock_locks_leases WHERE lock_key = p_key AND expires_at > UTC_TIMESTAMP(6);
    ELSEIF v_live AND v_inline THEN
      SET v_used = v_lease_weight, v_soonest = v_remaining;
    ELSEIF v_live THEN
      SET v_used = 4294967295;
    END IF;
    SET v_res_other = v_res_live AND NOT v_res_mine;
    IF v_own IS NOT NULL THEN
      UPDATE distlock_locks_leases
        SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL p_ttl MICROSECOND)
        WHERE lock_key = p_key AND owner = p_owner AND expires_at > UTC_TIMESTAMP(6);
      UPDATE distlock_locks
        SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL p_ttl MICROSECOND)
        WHERE lock_key = p_key;
      SET v_kind = 2, v_fence = v_own;
    ELSEIF v_used + p_weight + IF(v_res_other, v_res_weight, 0) <= p_capacity THEN
      SET v_fence = GREATEST(v_fence + 1, v_now_us);
      IF v_exclusive OR NOT v_live THEN
        -- The whole key, or a free key's one lease, in the row (an inline lease names its
        -- grant in lease_fence).
        UPDATE distlock_locks SET owner = p_owner, label = p_label, fence = v_fence,
            expires_at = UTC_TIMESTAMP(6) + INTERVAL p_ttl MICROSECOND,
            capacity = p_capacity, lease_weight = p_weight,
            lease_fence = IF(v_exclusive, NULL, v_fence),
            res_expires_at = IF(res_owner <=> p_owner, '1970-01-01 00:00:00', res_expires_at)
          WHERE lock_key = p_key;
        SET v_kind = 3;
      ELSE
        IF v_inline THEN
          -- The row's lease moves to the leases table, beside the new one.
          INSERT INTO distlock_locks_leases (lock_key, owner, label, weight, fence,
              expires_at)
            SELECT lock_key, owner, label, lease_weight, fence, expires_at
            FROM distlock_locks WHERE lock_key = p_key
            ON DUPLICATE KEY UPDATE label = VALUES(label), weight = VALUES(weight),
              fence = VALUES(fence), expires_at = VALUES(expires_at);
        END IF;
        INSERT INTO distlock_locks_leases (lock_key, owner, label, weight, fence, expires_at)
          VALUES (p_key, p_owner, p_label, p_weight, v_fence,
            UTC_TIMESTAMP(6) + INTERVAL p_ttl MICROSECOND)
          ON DUPLICATE KEY UPDATE label = VALUES(label), weight = VALUES(weight),
            fence = VALUES(fence), expires_at = VALUES(expires_at);
        UPDATE distlock_locks SET owner = X'00000000000000000000000000000000',
            label = '(shared)', fence = v_fence, capacity = p_capacity,
            expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL p_ttl MICROSECOND),
            res_expires_at = IF(res_owner <=> p_owner, '1970-01-01 00:00:00', res_expires_at)
          WHERE lock_key = p_key;
        SET v_kind = 4;
      END IF;
    ELSE
      SET v_kind = 5, v_by_res = v_used + p_weight <= p_capacity;
      SET v_left = CASE WHEN v_live AND NOT v_shared AND NOT v_inline THEN v_remaining
        WHEN NOT v_by_res THEN v_soonest WHEN v_res_other THEN v_res_remaining END;
      -- A reservation recorded or refreshed is answered as kept (backend/claims.rs, `kind::KEPT`).
      IF NOT v_res_other
        AND (NOT v_exclusive OR (v_live AND (v_shared OR v_inline))) THEN
        UPDATE distlock_locks SET res_owner = p_owner, res_weight = p_weight,
            res_expires_at = UTC_TIMESTAMP(6) + INTERVAL p_ttl MICROSECOND
          WHERE lock_key = p_key;
        SET v_by_res = 2;
      END IF;
    END IF;
  END IF;
  SET o_kind = v_kind, o_fence = v_fence, o_left = COALESCE(v_left, -1),
    o_by_res = v_by_res, o_revision = v_revision;
END
