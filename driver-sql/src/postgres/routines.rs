//! PostgreSQL's one-call paths of shared claims: plpgsql functions beside the lock table
//! that decide a claim, release a lease or renew one inside the
//! database, in one round trip, by the rules of [`decide`](crate::decide) and under the
//! transaction path's locking protocol (the key's row first, then its leases), so both
//! paths can run side by side on one key.
//!
//! Why functions and not one statement: a statement's subqueries and CTEs all read the
//! snapshot taken when the statement began, before it waited for the key's row lock, so
//! one statement locking the row and reading the leases could miss a lease committed while
//! it waited. Under READ COMMITTED every statement inside a VOLATILE plpgsql function takes
//! a snapshot of its own: the leases read after the row's lock is granted include every
//! lease committed before.
//!
//! The clock is `statement_timestamp()`, fixed for the calling statement: one call judges
//! every expiry at one instant, as the other statements do.

use super::{inline, MARKER};
use crate::decide::kind::KEPT;

/// The capacity of an exclusive or read-write key ([`lockcore::driver::READ_WRITE_CAPACITY`]).
const RW: u64 = lockcore::driver::READ_WRITE_CAPACITY;

/// The declarations every function starts with: the call's instant, in microseconds too.
const CLOCK: &str = "now_ts timestamptz := statement_timestamp(); \
     now_us bigint := (extract(epoch FROM statement_timestamp()) * 1000000)::bigint;";

/// Microseconds from the call's instant to the timestamp `at`.
fn until(at: &str) -> String {
    format!("(extract(epoch FROM {at} - now_ts) * 1000000)::bigint")
}

/// The name of lock table `t`'s claim function.
pub(super) fn claim_name(t: &str) -> String {
    format!("{t}_claim")
}

/// The name of lock table `t`'s lease release function.
pub(super) fn release_name(t: &str) -> String {
    format!("{t}_release_lease")
}

/// The name of lock table `t`'s lease renewal function.
pub(super) fn extend_name(t: &str) -> String {
    format!("{t}_extend_lease")
}

/// The statements creating (or replacing) lock table `t`'s functions; lease releases
/// notify `channel`.
pub(super) fn routines(t: &str, channel: &str) -> Vec<String> {
    vec![claim(t), release(t, channel), extend(t)]
}

/// `{t}_claim(key, owner, label, weight, ttl µs, capacity)`: one row `kind, token,
/// remaining, by_reservation, revision` (see `decide::kind`), having written what the
/// claim transaction writes for that decision.
fn claim(t: &str) -> String {
    let name = claim_name(t);
    let not_mine = "CASE WHEN res_owner = p_owner THEN 'epoch' ELSE res_expires_at END";
    format!(
        "CREATE OR REPLACE FUNCTION {name}(p_key bytea, p_owner bytea, p_label text, \
           p_weight bigint, p_ttl bigint, p_capacity bigint, \
           OUT kind bigint, OUT token bigint, OUT remaining bigint, \
           OUT by_reservation bigint, OUT revision bigint) \
         LANGUAGE plpgsql VOLATILE AS $fn$ \
         DECLARE \
           {CLOCK} \
           until_ts timestamptz := statement_timestamp() + p_ttl * interval '1 microsecond'; \
           exclusive_claim boolean := p_weight = {RW} AND p_capacity = {RW}; \
           r record; \
           live boolean; \
           leased boolean; \
           held boolean; \
           inline boolean; \
           res_other boolean; \
           own_fence bigint; \
           used numeric := 0; \
           reserved numeric := 0; \
           soonest timestamptz; \
           fits_leases boolean; \
           tok bigint; \
         BEGIN \
           /* The key's row lock first. A free row (expired, and no live reservation but \
              the owner's own of the same capacity: nothing to read, the claim fits) is \
              granted by this very statement, the whole key or a lease inline in the \
              row; any other is locked all the same (ON CONFLICT DO UPDATE \
              locks the row its WHERE refuses) and decided below. */ \
           {take} RETURNING l.fence INTO tok; \
           IF FOUND THEN \
             kind := 3; \
             token := tok; remaining := -1; by_reservation := 0; revision := tok; RETURN; \
           END IF; \
           SELECT l.owner, l.label, l.fence, l.capacity, l.expires_at, l.res_owner, \
               l.res_weight, l.res_expires_at, l.lease_weight, {inline_l} AS inline INTO r \
             FROM {t} l WHERE l.lock_key = p_key; \
           live := r.expires_at > now_ts; \
           leased := live AND r.owner = {MARKER}; \
           held := live AND NOT leased; \
           inline := held AND r.inline; \
           res_other := r.res_expires_at > now_ts AND r.res_owner IS DISTINCT FROM p_owner; \
           kind := 5; token := r.fence; remaining := -1; by_reservation := 0; \
           revision := r.fence; \
           IF (live OR r.res_expires_at > now_ts) AND r.capacity <> p_capacity THEN \
             kind := 0; token := r.capacity; RETURN; \
           END IF; \
           IF held AND r.owner = p_owner THEN \
             UPDATE {t} SET expires_at = GREATEST(expires_at, until_ts) WHERE lock_key = p_key; \
             kind := 1; RETURN; \
           END IF; \
           IF leased THEN \
             /* A statement of its own, after the row's lock: it sees every lease \
                committed before. */ \
             SELECT max(s.fence) FILTER (WHERE s.owner = p_owner), \
                 COALESCE(sum(s.weight) FILTER (WHERE s.owner <> p_owner), 0), \
                 min(s.expires_at) FILTER (WHERE s.owner <> p_owner) \
               INTO own_fence, used, soonest \
               FROM {t}_leases s WHERE s.lock_key = p_key AND s.expires_at > now_ts; \
             IF own_fence IS NOT NULL THEN \
               UPDATE {t}_leases SET expires_at = GREATEST(expires_at, until_ts) \
                 WHERE lock_key = p_key AND owner = p_owner AND expires_at > now_ts; \
               UPDATE {t} SET expires_at = GREATEST(expires_at, until_ts) \
                 WHERE lock_key = p_key; \
               kind := 2; token := own_fence; RETURN; \
             END IF; \
           ELSIF inline THEN \
             used := r.lease_weight; soonest := r.expires_at; \
           ELSIF held THEN \
             used := {RW}; \
           END IF; \
           IF res_other THEN reserved := GREATEST(r.res_weight, 0); END IF; \
           IF used + p_weight + reserved <= p_capacity THEN \
             tok := GREATEST({next_fence_r}, now_us); \
             IF exclusive_claim OR NOT live THEN \
               /* The whole key, or a free key's one lease, in the row (an inline lease \
                  names its grant in lease_fence). */ \
               UPDATE {t} SET owner = p_owner, label = p_label, fence = tok, \
                   expires_at = until_ts, capacity = p_capacity, lease_weight = p_weight, \
                   lease_fence = CASE WHEN exclusive_claim THEN NULL ELSE tok END, \
                   res_expires_at = {not_mine} \
                 WHERE lock_key = p_key; \
               kind := 3; \
             ELSE \
               IF inline THEN \
                 /* The row's lease moves to the leases table, beside the new one. */ \
                 INSERT INTO {t}_leases AS s (lock_key, owner, label, weight, fence, \
                     expires_at) \
                   VALUES (p_key, r.owner, r.label, r.lease_weight, r.fence, r.expires_at) \
                   {lease_conflict}; \
               END IF; \
               {lease} \
               UPDATE {t} SET owner = {MARKER}, label = '(shared)', fence = tok, \
                   capacity = p_capacity, expires_at = GREATEST(expires_at, until_ts), \
                   res_expires_at = {not_mine} \
                 WHERE lock_key = p_key; \
               kind := 4; \
             END IF; \
             token := tok; RETURN; \
           END IF; \
           fits_leases := used + p_weight <= p_capacity; \
           by_reservation := CASE WHEN fits_leases THEN 1 ELSE 0 END; \
           remaining := CASE WHEN held AND NOT inline THEN {held_left} \
             WHEN NOT fits_leases THEN COALESCE({soonest_left}, -1) \
             WHEN res_other THEN {res_left} ELSE -1 END; \
           /* Two exclusive locks need no reservation: a writer reserves only behind \
              leases. */ \
           IF NOT res_other AND (NOT exclusive_claim OR leased OR inline) THEN \
             UPDATE {t} SET res_owner = p_owner, res_weight = p_weight, \
                 res_expires_at = until_ts \
               WHERE lock_key = p_key; \
             /* Answered as kept. */ \
             by_reservation := {KEPT}; \
           END IF; \
         END $fn$",
        take = take(t),
        inline_l = inline("l."),
        lease_conflict = LEASE_CONFLICT,
        next_fence_r = next_fence("r.fence"),
        lease = lease(t),
        held_left = until("r.expires_at"),
        soonest_left = until("soonest"),
        res_left = until("r.res_expires_at"),
    )
}

/// `fence + 1`, saturating (as `decide` takes the next token).
fn next_fence(fence: &str) -> String {
    format!("(LEAST({fence}, {}) + 1)", i64::MAX - 1)
}

/// Locks the key's row (creating it), and takes it for the claiming owner when it is free:
/// expired, with no live reservation but the owner's own of the same capacity (a row it
/// leaves alone stays locked: ON CONFLICT DO UPDATE locks the row its WHERE refuses). A
/// claim that is not exclusive takes it as an inline lease ([`inline`]): `lease_fence` is
/// the grant's token.
fn take(t: &str) -> String {
    let fence = format!("GREATEST({}, EXCLUDED.fence)", next_fence("l.fence"));
    format!(
        "INSERT INTO {t} AS l (lock_key, owner, label, fence, expires_at, capacity, \
             lease_weight, lease_fence) \
           VALUES (p_key, p_owner, p_label, now_us, until_ts, p_capacity, p_weight, \
             CASE WHEN exclusive_claim THEN NULL ELSE now_us END) \
           ON CONFLICT (lock_key) DO UPDATE SET owner = EXCLUDED.owner, \
             label = EXCLUDED.label, \
             fence = {fence}, \
             expires_at = GREATEST(l.expires_at, EXCLUDED.expires_at), \
             capacity = EXCLUDED.capacity, \
             lease_weight = EXCLUDED.lease_weight, \
             lease_fence = CASE WHEN exclusive_claim THEN NULL ELSE {fence} END, \
             res_expires_at = CASE WHEN l.res_owner = p_owner THEN 'epoch' \
               ELSE l.res_expires_at END \
           WHERE l.expires_at <= now_ts AND (l.res_expires_at <= now_ts \
             OR (l.res_owner = p_owner AND l.capacity = p_capacity))"
    )
}

/// A lease write meeting the owner's old (expired) lease replaces it.
const LEASE_CONFLICT: &str = "ON CONFLICT (lock_key, owner) DO UPDATE SET \
     label = EXCLUDED.label, weight = EXCLUDED.weight, fence = EXCLUDED.fence, \
     expires_at = EXCLUDED.expires_at";

/// Writes the owner's lease with the token `tok` (the row's lock is held).
fn lease(t: &str) -> String {
    format!(
        "INSERT INTO {t}_leases AS s (lock_key, owner, label, weight, fence, expires_at) \
           VALUES (p_key, p_owner, p_label, p_weight, tok, until_ts) {LEASE_CONFLICT};"
    )
}

/// The lock of the key's row, then whether the key is held by live leases (else the
/// function answers `$none`).
fn locked_leased(t: &str, none: i64) -> String {
    format!(
        "SELECT owner = {MARKER} AND expires_at > now_ts INTO leased \
           FROM {t} WHERE lock_key = p_key FOR UPDATE; \
         IF leased IS NOT TRUE THEN RETURN {none}; END IF;"
    )
}

/// `{t}_release_lease(key, owner)`: 1 when the owner's live lease was deleted (the row's
/// expiry set to the latest lease left, its fence bumped, the release announced), 0 when
/// the owner holds none.
fn release(t: &str, channel: &str) -> String {
    let name = release_name(t);
    let locked = locked_leased(t, 0);
    format!(
        "CREATE OR REPLACE FUNCTION {name}(p_key bytea, p_owner bytea) RETURNS bigint \
         LANGUAGE plpgsql VOLATILE AS $fn$ \
         DECLARE \
           {CLOCK} \
           leased boolean; \
           n bigint; \
         BEGIN \
           {locked} \
           /* After the row's lock, as in the transaction: the row's expiry becomes the \
              latest other live lease's (the statement does not see its own DELETE), its \
              fence moves on so a waiter that read the old one knows a lease went, and \
              the NOTIFY is delivered when the call commits. */ \
           WITH gone AS ( \
             DELETE FROM {t}_leases \
             WHERE lock_key = p_key AND owner = p_owner AND expires_at > now_ts RETURNING 1), \
           settled AS ( \
             UPDATE {t} SET expires_at = COALESCE((SELECT max(s.expires_at) \
                 FROM {t}_leases s WHERE s.lock_key = p_key AND s.owner <> p_owner \
                 AND s.expires_at > now_ts), 'epoch'), \
               fence = GREATEST({next_fence}, now_us) \
             WHERE lock_key = p_key AND EXISTS (SELECT 1 FROM gone) RETURNING 1) \
           SELECT count(*) INTO n FROM settled; \
           IF n = 0 THEN RETURN 0; END IF; \
           PERFORM pg_notify('{channel}', encode(p_key, 'hex')); \
           RETURN 1; \
         END $fn$",
        next_fence = next_fence("fence"),
    )
}

/// `{t}_extend_lease(key, owner, ttl µs)`: the lease's token when the owner's live lease
/// (and the row) now expire no sooner than the TTL from now, -1 when the owner holds none.
fn extend(t: &str) -> String {
    let name = extend_name(t);
    let locked = locked_leased(t, -1);
    format!(
        "CREATE OR REPLACE FUNCTION {name}(p_key bytea, p_owner bytea, p_ttl bigint) \
         RETURNS bigint LANGUAGE plpgsql VOLATILE AS $fn$ \
         DECLARE \
           {CLOCK} \
           until_ts timestamptz := statement_timestamp() + p_ttl * interval '1 microsecond'; \
           leased boolean; \
           f bigint; \
         BEGIN \
           {locked} \
           UPDATE {t}_leases SET expires_at = GREATEST(expires_at, until_ts) \
             WHERE lock_key = p_key AND owner = p_owner AND expires_at > now_ts \
             RETURNING fence INTO f; \
           IF NOT FOUND THEN RETURN -1; END IF; \
           UPDATE {t} SET expires_at = GREATEST(expires_at, until_ts) WHERE lock_key = p_key; \
           RETURN f; \
         END $fn$"
    )
}
