-- distlock_locks_claim_in(key, owner, label, weight, ttl µs, capacity): a claim of a set,
-- inside the set's transaction (READ COMMITTED, started and ended by the client), which it
-- neither starts nor ends: distlock_locks_decide's decision, answered as one row
-- `kind, fence, remaining, by_reservation, revision`, as distlock_locks_claim answers.
--
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs.
CREATE PROCEDURE distlock_locks_claim_in(p_key VARBINARY(255), p_owner BINARY(16),
    p_label VARCHAR(255) CHARACTER SET utf8mb4, p_weight BIGINT, p_ttl BIGINT,
    p_capacity BIGINT)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
  DECLARE v_kind, v_fence, v_left, v_by_res, v_revision BIGINT;
  CALL distlock_locks_decide(p_key, p_owner, p_label, p_weight, p_ttl, p_capacity,
    v_kind, v_fence, v_left, v_by_res, v_revision);
  SELECT v_kind, v_fence, v_left, v_by_res, v_revision;
END
