-- distlock_locks_claim_set(keys, owner, label, weight, ttl µs, capacity): the claims of a
-- set in one call, all or nothing. `keys` is the set's keys packed, each as one byte of
-- length (a key is 1 to 255 bytes) followed by its bytes, in the order they are claimed.
-- Each key is decided by distlock_locks_claim, the claim rule's one copy. Answers one row
-- per key decided, in order, `kind, token, remaining, by_reservation, revision` as
-- distlock_locks_claim answers: a row for every key when each was granted (and all of it is
-- written), else up to the first key not granted (a refusal, a capacity mismatch), and
-- then nothing of the set is written: its subtransaction is rolled back, the grants before
-- it and the reservation a refusal records alike.
--
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs.
-- 1 to 4 are the kinds of a grant (backend/claims.rs, `kind`).
CREATE OR REPLACE FUNCTION distlock_locks_claim_set(p_keys bytea, p_owner bytea,
    p_label text, p_weight bigint, p_ttl bigint, p_capacity bigint)
RETURNS TABLE (kind bigint, token bigint, remaining bigint, by_reservation bigint,
    revision bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  pos integer := 0;
  len integer;
  c record;
  kinds bigint[] := '{}';
  tokens bigint[] := '{}';
  left_us bigint[] := '{}';
  by_res bigint[] := '{}';
  revisions bigint[] := '{}';
BEGIN
  BEGIN
    WHILE pos < length(p_keys) LOOP
      len := get_byte(p_keys, pos);
      SELECT * INTO c FROM distlock_locks_claim(substring(p_keys FROM pos + 2 FOR len),
        p_owner, p_label, p_weight, p_ttl, p_capacity);
      pos := pos + 1 + len;
      kinds := kinds || c.kind; tokens := tokens || c.token;
      left_us := left_us || c.remaining; by_res := by_res || c.by_reservation;
      revisions := revisions || c.revision;
      IF c.kind NOT BETWEEN 1 AND 4 THEN
        -- Caught below: undoes everything this block wrote.
        RAISE EXCEPTION USING ERRCODE = 'DLSET';
      END IF;
    END LOOP;
  EXCEPTION WHEN SQLSTATE 'DLSET' THEN
    NULL;
  END;
  RETURN QUERY SELECT d.kind, d.token, d.remaining, d.by_reservation, d.revision
    FROM unnest(kinds, tokens, left_us, by_res, revisions) WITH ORDINALITY
      AS d(kind, token, remaining, by_reservation, revision, n)
    ORDER BY d.n;
END $fn$
