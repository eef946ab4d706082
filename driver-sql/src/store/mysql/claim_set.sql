-- distlock_locks_claim_set(keys, owner, label, weight, ttl µs, capacity): the claims of a
-- set in one call, all or nothing. `keys` is the set's keys packed, each as one byte of
-- length (a key is 1 to 255 bytes) followed by its bytes, in the order they are claimed.
-- Each key is decided by distlock_locks_decide, the claim rule's one copy, in one
-- transaction of its own, READ COMMITTED (so each key's leases are read after its row is
-- locked, not from a snapshot taken at an earlier key). Answers a row per key decided, in
-- order, `kind, fence, remaining, by_reservation, revision` as distlock_locks_claim
-- answers (one result set each): a row for every key when each was granted, and all of it
-- is committed; else up to the first key not granted (a refusal, a capacity mismatch),
-- and the transaction is rolled back, the grants before it and the reservation a refusal
-- records alike.
--
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs.
-- 1 to 4 are the kinds of a grant (backend/claims.rs, `kind`).
CREATE PROCEDURE distlock_locks_claim_set(p_keys LONGBLOB, p_owner BINARY(16),
    p_label VARCHAR(255) CHARACTER SET utf8mb4, p_weight BIGINT, p_ttl BIGINT,
    p_capacity BIGINT)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
  DECLARE v_pos, v_len INT DEFAULT 1;
  DECLARE v_kind, v_fence, v_left, v_by_res, v_revision BIGINT;
  -- Any error rolls the transaction back (a lock wait timeout rolls back only the
  -- statement, and would leave it open on the connection).
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  WHILE v_pos <= LENGTH(p_keys) DO
    SET v_len = ORD(SUBSTRING(p_keys, v_pos, 1));
    CALL distlock_locks_decide(SUBSTRING(p_keys, v_pos + 1, v_len), p_owner, p_label,
      p_weight, p_ttl, p_capacity, v_kind, v_fence, v_left, v_by_res, v_revision);
    SET v_pos = v_pos + 1 + v_len;
    SELECT v_kind, v_fence, v_left, v_by_res, v_revision;
    IF v_kind NOT BETWEEN 1 AND 4 THEN
      -- Nothing of the set stays; no key after this one is decided.
      ROLLBACK;
      SET v_pos = LENGTH(p_keys) + 1;
    END IF;
  END WHILE;
  -- Every key granted; after a rollback there is nothing left to commit.
  COMMIT;
END
