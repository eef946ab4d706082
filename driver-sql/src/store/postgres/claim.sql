-- distlock_locks_claim(key, owner, label, weight, ttl µs, capacity): one row
-- `kind, token, remaining, by_reservation, revision` (see backend/claims.rs, `kind`), having
-- written what that decision writes.
--
-- The table name `distlock_locks` is replaced by the backend's table wherever it occurs.
-- 4294967295 is the capacity of an exclusive or read-write key (READ_WRITE_CAPACITY);
-- '\x000…'::bytea is the marker owner of a key held by leases; 9223372036854775806 keeps
-- `fence + 1` from overflowing.
CREATE OR REPLACE FUNCTION distlock_locks_claim(p_key bytea, p_owner bytea, p_label text,
    p_weight bigint, p_ttl bigint, p_capacity bigint,
    OUT kind bigint, OUT token bigint, OUT remaining bigint,
    OUT by_reservation bigint, OUT revision bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  now_ts timestamptz := statement_timestamp();
  now_us bigint := (extract(epoch FROM statement_timestamp()) * 1000000)::bigint;
  until_ts timestamptz := statement_timestamp() + p_ttl * interval '1 microsecond';
  exclusive_claim boolean := p_weight = 4294967295 AND p_capacity = 4294967295;
  r record;
  live boolean;
  leased boolean;
  held boolean;
  inline boolean;
  res_other boolean;
  own_fence bigint;
  used numeric := 0;
  reserved numeric := 0;
  soonest timestamptz;
  fits_leases boolean;
  tok bigint;
BEGIN
  -- A key a transaction holds (its gate taken, see gate.sql) is refused before its row is
  -- touched: the transaction's hold has no expiry to report, so the claimant tries again
  -- in 50 ms (TRANSACTION_POLL), or when the transaction's commit announces the release.
  IF NOT pg_try_advisory_xact_lock_shared(distlock_locks_gate(p_key)) THEN
    kind := 5; token := 0; remaining := 50000; by_reservation := 0; revision := 0;
    RETURN;
  END IF;
  -- The key's row lock first. A free row (expired, and no live reservation but the
  -- owner's own of the same capacity: nothing to read, the claim fits) is granted by this
  -- very statement, the whole key or a lease inline in the row; any other is locked all
  -- the same (ON CONFLICT DO UPDATE locks the row its WHERE refuses) and decided below.
  INSERT INTO distlock_locks AS l (lock_key, owner, label, fence, expires_at, capacity,
      lease_weight, lease_fence)
    VALUES (p_key, p_owner, p_label, now_us, until_ts, p_capacity, p_weight,
      CASE WHEN exclusive_claim THEN NULL ELSE now_us END)
    ON CONFLICT (lock_key) DO UPDATE SET owner = EXCLUDED.owner,
      label = EXCLUDED.label,
      fence = GREATEST((LEAST(l.fence, 9223372036854775806) + 1), EXCLUDED.fence),
      expires_at = GREATEST(l.expires_at, EXCLUDED.expires_at),
      capacity = EXCLUDED.capacity,
      lease_weight = EXCLUDED.lease_weight,
      -- An inline lease names its grant.
      lease_fence = CASE WHEN exclusive_claim THEN NULL
        ELSE GREATEST((LEAST(l.fence, 9223372036854775806) + 1), EXCLUDED.fence) END,
      res_expires_at = CASE WHEN l.res_owner = p_owner THEN 'epoch'
        ELSE l.res_expires_at END
    WHERE l.expires_at <= now_ts AND (l.res_expires_at <= now_ts
      OR (l.res_owner = p_owner AND l.capacity = p_capacity))
    RETURNING l.fence INTO tok;
  IF FOUND THEN
    kind := 3;
    token := tok; remaining := -1; by_reservation := 0; revision := tok; RETURN;
  END IF;
  SELECT l.owner, l.label, l.fence, l.capacity, l.expires_at, l.res_owner,
      l.res_weight, l.res_expires_at, l.lease_weight,
      -- An inline lease: the row's owner is not the marker, and its grant wrote it.
      (l.owner <> '\x00000000000000000000000000000000'::bytea
        AND COALESCE(l.lease_fence = l.fence, FALSE)) AS inline INTO r
    FROM distlock_locks l WHERE l.lock_key = p_key;
  live := r.expires_at > now_ts;
  leased := live AND r.owner = '\x00000000000000000000000000000000'::bytea;
  held := live AND NOT leased;
  inline := held AND r.inline;
  res_other := r.res_expires_at > now_ts AND r.res_owner IS DISTINCT FROM p_owner;
  kind := 5; token := r.fence; remaining := -1; by_reservation := 0;
  revision := r.fence;
  IF (live OR r.res_expires_at > now_ts) AND r.capacity <> p_capacity THEN
    kind := 0; token := r.capacity; RETURN;
  END IF;
  IF held AND r.owner = p_owner THEN
    UPDATE distlock_locks SET expires_at = GREATEST(expires_at, until_ts)
      WHERE lock_key = p_key;
    kind := 1; RETURN;
  END IF;
  IF leased THEN
    -- A statement of its own, after the row's lock: it sees every lease committed before.
    SELECT max(s.fence) FILTER (WHERE s.owner = p_owner),
        COALESCE(sum(s.weight) FILTER (WHERE s.owner <> p_owner), 0),
        min(s.expires_at) FILTER (WHERE s.owner <> p_owner)
      INTO own_fence, used, soonest
      FROM distlock_locks_leases s WHERE s.lock_key = p_key AND s.expires_at > now_ts;
    IF own_fence IS NOT NULL THEN
      UPDATE distlock_locks_leases SET expires_at = GREATEST(expires_at, until_ts)
        WHERE lock_key = p_key AND owner = p_owner AND expires_at > now_ts;
      UPDATE distlock_locks SET expires_at = GREATEST(expires_at, until_ts)
        WHERE lock_key = p_key;
      kind := 2; token := own_fence; RETURN;
    END IF;
  ELSIF inline THEN
    used := r.lease_weight; soonest := r.expires_at;
  ELSIF held THEN
    used := 4294967295;
  END IF;
  IF res_other THEN reserved := GREATEST(r.res_weight, 0); END IF;
  IF used + p_weight + reserved <= p_capacity THEN
    tok := GREATEST((LEAST(r.fence, 9223372036854775806) + 1), now_us);
    IF exclusive_claim OR NOT live THEN
      -- The whole key, or a free key's one lease, in the row (an inline lease names its
      -- grant in lease_fence).
      UPDATE distlock_locks SET owner = p_owner, label = p_label, fence = tok,
          expires_at = until_ts, capacity = p_capacity, lease_weight = p_weight,
          lease_fence = CASE WHEN exclusive_claim THEN NULL ELSE tok END,
          res_expires_at = CASE WHEN res_owner = p_owner THEN 'epoch'
            ELSE res_expires_at END
        WHERE lock_key = p_key;
      kind := 3;
    ELSE
      IF inline THEN
        -- The row's lease moves to the leases table, beside the new one.
        INSERT INTO distlock_locks_leases AS s (lock_key, owner, label, weight, fence,
            expires_at)
          VALUES (p_key, r.owner, r.label, r.lease_weight, r.fence, r.expires_at)
          ON CONFLICT (lock_key, owner) DO UPDATE SET label = EXCLUDED.label,
            weight = EXCLUDED.weight, fence = EXCLUDED.fence,
            expires_at = EXCLUDED.expires_at;
      END IF;
      -- The owner's lease (written over its old, expired one).
      INSERT INTO distlock_locks_leases AS s (lock_key, owner, label, weight, fence,
          expires_at)
        VALUES (p_key, p_owner, p_label, p_weight, tok, until_ts)
        ON CONFLICT (lock_key, owner) DO UPDATE SET label = EXCLUDED.label,
          weight = EXCLUDED.weight, fence = EXCLUDED.fence,
          expires_at = EXCLUDED.expires_at;
      UPDATE distlock_locks SET owner = '\x00000000000000000000000000000000'::bytea,
          label = '(shared)', fence = tok, capacity = p_capacity,
          expires_at = GREATEST(expires_at, until_ts),
          res_expires_at = CASE WHEN res_owner = p_owner THEN 'epoch'
            ELSE res_expires_at END
        WHERE lock_key = p_key;
      kind := 4;
    END IF;
    token := tok; RETURN;
  END IF;
  fits_leases := used + p_weight <= p_capacity;
  by_reservation := CASE WHEN fits_leases THEN 1 ELSE 0 END;
  remaining := CASE
    WHEN held AND NOT inline THEN (extract(epoch FROM r.expires_at - now_ts) * 1000000)::bigint
    WHEN NOT fits_leases THEN
      COALESCE((extract(epoch FROM soonest - now_ts) * 1000000)::bigint, -1)
    WHEN res_other THEN (extract(epoch FROM r.res_expires_at - now_ts) * 1000000)::bigint
    ELSE -1 END;
  -- Two exclusive locks need no reservation: a writer reserves only behind leases.
  IF NOT res_other AND (NOT exclusive_claim OR leased OR inline) THEN
    UPDATE distlock_locks SET res_owner = p_owner, res_weight = p_weight,
        res_expires_at = until_ts
      WHERE lock_key = p_key;
    -- Answered as kept (backend/claims.rs, `kind::KEPT`).
    by_reservation := 2;
  END IF;
END $fn$
