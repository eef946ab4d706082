//! MySQL's stored procedures: a shared claim, a lease release and a lease renewal, each one
//! `CALL` (one round trip) deciding inside the database as `decide.rs` does.
//!
//! Each procedure is a transaction of its own (`START TRANSACTION` … `COMMIT`): called in
//! autocommit mode, its statements would otherwise commit one by one. It runs READ
//! COMMITTED (set for that one transaction), so the leases read after the key's row is
//! locked are the committed ones, and takes the locks in the claim transaction's order:
//! the key's row first (created free when missing, as the `create` statement does), then
//! the leases. Any error rolls the transaction back before it reaches the caller (a
//! deadlock or a lock wait timeout is then retried as the transaction's would be).
//!
//! Keys and owners are byte strings (`VARBINARY`, `BINARY`): compared byte for byte, as in
//! the tables. The answer is one row of integers, after the `COMMIT`.

use super::{inline, CLAIM_MARK, EPOCH, MARKER, NOW, NOW_US, RW};
use crate::decide::kind::KEPT;
use crate::statements::{Bound, Calls, P};

/// The statements (re)creating the procedures of lock table `t`. MySQL has no
/// `CREATE OR REPLACE PROCEDURE`: each is dropped first.
pub(super) fn routines(t: &str) -> Vec<String> {
    [
        (format!("{t}_claim"), claim(t)),
        (format!("{t}_release_lease"), release_lease(t)),
        (format!("{t}_extend_lease"), extend_lease(t)),
    ]
    .into_iter()
    .flat_map(|(name, body)| {
        [
            format!("DROP PROCEDURE IF EXISTS {name}"),
            format!("CREATE PROCEDURE {name}{body}"),
        ]
    })
    .collect()
}

/// The procedures' calls, as the store runs them.
pub(super) fn calls(t: &str) -> Calls {
    Calls {
        claim: Some(Bound::new(
            format!("CALL {t}_claim(?, ?, ?, ?, ?, ?)"),
            &[P::Key, P::Owner, P::Label, P::Weight, P::Ttl, P::Capacity],
        )),
        release: Some(Bound::new(
            format!("CALL {t}_release_lease(?, ?)"),
            &[P::Key, P::Owner],
        )),
        extend: Some(Bound::new(
            format!("CALL {t}_extend_lease(?, ?, ?)"),
            &[P::Key, P::Owner, P::Ttl],
        )),
    }
}

/// What every procedure starts with: an error handler rolling the transaction back on any
/// error (a lock wait timeout rolls back only the statement, and would leave it open on the
/// connection), then [`START`].
const HANDLER: &str = "DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;";

/// What starts a procedure's transaction.
const START: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;";

/// [`HANDLER`], then [`START`].
fn begin() -> String {
    format!("{HANDLER} {START}")
}

/// `NOW` + the TTL parameter.
fn expiry() -> String {
    format!("{NOW} + INTERVAL p_ttl MICROSECOND")
}

/// Locks the key's row and reads it into the `v_…` variables (see `decide::RowSeen`), and
/// `extra` (columns, then the variables they go into; empty or starting with a comma);
/// `v_found` stays NULL when there is no row.
fn row_into(t: &str, extra: &[String; 2]) -> String {
    let [columns, into] = extra;
    format!(
        "SELECT TRUE, expires_at > {NOW}, owner = p_owner, owner = {MARKER}, fence, capacity, \
           res_expires_at > {NOW}, res_owner <=> p_owner, res_weight, \
           TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at), \
           TIMESTAMPDIFF(MICROSECOND, {NOW}, res_expires_at), {NOW_US}{columns} \
         INTO v_found, v_live, v_mine, v_shared, v_fence, v_capacity, v_res_live, v_res_mine, \
           v_res_weight, v_remaining, v_res_remaining, v_now_us{into} \
         FROM {t} WHERE lock_key = p_key FOR UPDATE;"
    )
}

/// What the claim reads of the row besides [`row_into`]'s columns: whether it holds an inline lease (see [`inline`]), and that lease's weight.
fn inline_columns() -> [String; 2] {
    [
        format!(", {}, lease_weight", inline("")),
        ", v_inline, v_lease_weight".into(),
    ]
}

/// Locks the key's row and reads it into the `v_…` variables as [`row_into`] does (with
/// `extra`), creating it free first when missing (as the `create` statement does).
fn row_or_created_into(t: &str, extra: &[String; 2]) -> String {
    let row = row_into(t, extra);
    format!(
        "{row} \
         IF v_found IS NULL THEN \
           INSERT INTO {t} (lock_key, owner, label, fence, expires_at) \
             VALUES (p_key, {MARKER}, '(shared)', 0, {EPOCH}) \
             ON DUPLICATE KEY UPDATE fence = fence; \
           {row} \
         END IF;"
    )
}

/// The claim: answers `[kind, fence, remaining, by_reservation, revision]` (`decide::kind`).
///
/// A claim that is not exclusive first tries to take the key free in one statement, before
/// any transaction: a free row (expired, and no live reservation) becomes
/// the owner's inline lease ([`inline`]), and a live row of the owner's own of the same
/// capacity (its inline lease, or its exclusive lock) is renewed; either answers the row's
/// token as an exclusive grant does (the holder releases and renews it by the exclusive
/// statements). Anything else changes nothing and is decided in the transaction.
fn claim(t: &str) -> String {
    let row = row_or_created_into(t, &inline_columns());
    let expiry = expiry();
    let not_mine = format!("IF(res_owner <=> p_owner, {EPOCH}, res_expires_at)");
    let free = format!("(expires_at <= {NOW} AND res_expires_at <= {NOW})");
    format!(
        "(p_key VARBINARY(255), p_owner BINARY(16), \
           p_label VARCHAR(255) CHARACTER SET utf8mb4, p_weight BIGINT, p_ttl BIGINT, \
           p_capacity BIGINT) \
         MODIFIES SQL DATA SQL SECURITY INVOKER \
         claim: BEGIN \
           DECLARE v_found, v_live, v_mine, v_shared, v_res_live, v_res_mine, v_inline BOOLEAN; \
           DECLARE v_fence, v_capacity, v_res_weight, v_remaining, v_res_remaining, v_now_us, \
             v_soonest, v_own, v_left, v_revision, v_lease_weight BIGINT; \
           DECLARE v_taken BIGINT UNSIGNED; \
           DECLARE v_used DECIMAL(65, 0) DEFAULT 0; \
           DECLARE v_kind, v_by_res BIGINT DEFAULT 0; \
           DECLARE v_exclusive BOOLEAN DEFAULT p_weight = {RW} AND p_capacity = {RW}; \
           DECLARE v_res_other BOOLEAN; \
           DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = NULL; \
           {HANDLER} \
           IF NOT v_exclusive THEN \
             /* One statement, committed by itself: assignments left to right, each seeing \
                the ones before; `free` reads only columns assigned last or never. */ \
             INSERT INTO {t} (lock_key, owner, label, fence, expires_at, capacity, \
                 lease_weight, lease_fence) \
               VALUES (p_key, p_owner, p_label, LAST_INSERT_ID({NOW_US}), {expiry}, p_capacity, \
                 p_weight, {NOW_US}) \
               ON DUPLICATE KEY UPDATE \
                 fence = IF({free}, LAST_INSERT_ID(GREATEST(fence + 1, {NOW_US})), \
                   IF(owner = p_owner AND expires_at > {NOW} AND capacity = p_capacity, \
                      LAST_INSERT_ID(fence), fence + 0 * LAST_INSERT_ID({CLAIM_MARK}))), \
                 lease_fence = IF({free}, fence, lease_fence), \
                 lease_weight = IF({free}, p_weight, lease_weight), \
                 label = IF({free}, p_label, label), \
                 capacity = IF({free}, p_capacity, capacity), \
                 owner = IF({free}, p_owner, owner), \
                 expires_at = IF({free} OR (owner = p_owner AND capacity = p_capacity \
                     AND expires_at > {NOW}), GREATEST(expires_at, {expiry}), expires_at); \
             SET v_taken = LAST_INSERT_ID(); \
             IF v_taken < {CLAIM_MARK} THEN \
               SELECT 3, CAST(v_taken AS SIGNED), -1, 0, CAST(v_taken AS SIGNED); \
               LEAVE claim; \
             END IF; \
           END IF; \
           {START} \
           {row} \
           SET v_revision = v_fence; \
           IF (v_live OR v_res_live) AND v_capacity <> p_capacity THEN \
             SET v_kind = 0, v_fence = v_capacity; \
           ELSEIF v_live AND NOT v_shared AND v_mine THEN \
             UPDATE {t} SET expires_at = GREATEST(expires_at, {expiry}) WHERE lock_key = p_key; \
             SET v_kind = 1; \
           ELSE \
             IF v_live AND v_shared THEN \
               SELECT COALESCE(SUM(IF(owner = p_owner, 0, weight)), 0), \
                 MIN(IF(owner = p_owner, NULL, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at))), \
                 MAX(IF(owner = p_owner, fence, NULL)) \
               INTO v_used, v_soonest, v_own \
               FROM {t}_leases WHERE lock_key = p_key AND expires_at > {NOW}; \
             ELSEIF v_live AND v_inline THEN \
               SET v_used = v_lease_weight, v_soonest = v_remaining; \
             ELSEIF v_live THEN \
               SET v_used = {RW}; \
             END IF; \
             SET v_res_other = v_res_live AND NOT v_res_mine; \
             IF v_own IS NOT NULL THEN \
               UPDATE {t}_leases SET expires_at = GREATEST(expires_at, {expiry}) \
                 WHERE lock_key = p_key AND owner = p_owner AND expires_at > {NOW}; \
               UPDATE {t} SET expires_at = GREATEST(expires_at, {expiry}) WHERE lock_key = p_key; \
               SET v_kind = 2, v_fence = v_own; \
             ELSEIF v_used + p_weight + IF(v_res_other, v_res_weight, 0) <= p_capacity THEN \
               SET v_fence = GREATEST(v_fence + 1, v_now_us); \
               IF v_exclusive OR NOT v_live THEN \
                 /* The whole key, or a free key's one lease, in the row (an inline lease \
                    names its grant in lease_fence). */ \
                 UPDATE {t} SET owner = p_owner, label = p_label, fence = v_fence, \
                   expires_at = {expiry}, capacity = p_capacity, lease_weight = p_weight, \
                   lease_fence = IF(v_exclusive, NULL, v_fence), \
                   res_expires_at = {not_mine} WHERE lock_key = p_key; \
                 SET v_kind = 3; \
               ELSE \
                 IF v_inline THEN \
                   /* The row's lease moves to the leases table, beside the new one. */ \
                   INSERT INTO {t}_leases (lock_key, owner, label, weight, fence, expires_at) \
                     SELECT lock_key, owner, label, lease_weight, fence, expires_at FROM {t} \
                     WHERE lock_key = p_key \
                     ON DUPLICATE KEY UPDATE label = VALUES(label), weight = VALUES(weight), \
                       fence = VALUES(fence), expires_at = VALUES(expires_at); \
                 END IF; \
                 INSERT INTO {t}_leases (lock_key, owner, label, weight, fence, expires_at) \
                   VALUES (p_key, p_owner, p_label, p_weight, v_fence, {expiry}) \
                   ON DUPLICATE KEY UPDATE label = VALUES(label), weight = VALUES(weight), \
                     fence = VALUES(fence), expires_at = VALUES(expires_at); \
                 UPDATE {t} SET owner = {MARKER}, label = '(shared)', fence = v_fence, \
                   capacity = p_capacity, expires_at = GREATEST(expires_at, {expiry}), \
                   res_expires_at = {not_mine} WHERE lock_key = p_key; \
                 SET v_kind = 4; \
               END IF; \
             ELSE \
               SET v_kind = 5, v_by_res = v_used + p_weight <= p_capacity; \
               SET v_left = CASE WHEN v_live AND NOT v_shared AND NOT v_inline THEN v_remaining \
                 WHEN NOT v_by_res THEN v_soonest WHEN v_res_other THEN v_res_remaining END; \
               /* A reservation recorded or refreshed is answered as kept (2). */ \
               IF NOT v_res_other \
                 AND (NOT v_exclusive OR (v_live AND (v_shared OR v_inline))) THEN \
                 UPDATE {t} SET res_owner = p_owner, res_weight = p_weight, \
                   res_expires_at = {expiry} WHERE lock_key = p_key; \
                 SET v_by_res = {KEPT}; \
               END IF; \
             END IF; \
           END IF; \
           COMMIT; \
           SELECT v_kind, v_fence, COALESCE(v_left, -1), v_by_res, v_revision; \
         END"
    )
}

/// The lease release: answers `[1]` released, `[0]` no live lease of the owner's.
fn release_lease(t: &str) -> String {
    let begin = begin();
    format!(
        "(p_key VARBINARY(255), p_owner BINARY(16)) \
         MODIFIES SQL DATA SQL SECURITY INVOKER \
         BEGIN \
           DECLARE v_leased BOOLEAN DEFAULT FALSE; \
           DECLARE v_released BIGINT DEFAULT 0; \
           DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_leased = FALSE; \
           {begin} \
           SELECT expires_at > {NOW} AND owner = {MARKER} INTO v_leased \
             FROM {t} WHERE lock_key = p_key FOR UPDATE; \
           IF v_leased THEN \
             DELETE FROM {t}_leases \
               WHERE lock_key = p_key AND owner = p_owner AND expires_at > {NOW}; \
             IF ROW_COUNT() > 0 THEN \
               UPDATE {t} SET expires_at = COALESCE((SELECT MAX(expires_at) FROM {t}_leases \
                   WHERE lock_key = p_key AND expires_at > {NOW}), {EPOCH}), \
                 fence = GREATEST(fence + 1, {NOW_US}) WHERE lock_key = p_key; \
               SET v_released = 1; \
             END IF; \
           END IF; \
           COMMIT; \
           SELECT v_released; \
         END"
    )
}

/// The lease renewal: answers `[fence]` renewed, `[-1]` no live lease of the owner's.
fn extend_lease(t: &str) -> String {
    let begin = begin();
    let expiry = expiry();
    format!(
        "(p_key VARBINARY(255), p_owner BINARY(16), p_ttl BIGINT) \
         MODIFIES SQL DATA SQL SECURITY INVOKER \
         BEGIN \
           DECLARE v_leased BOOLEAN DEFAULT FALSE; \
           DECLARE v_fence BIGINT DEFAULT -1; \
           DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_leased = FALSE; \
           {begin} \
           SELECT expires_at > {NOW} AND owner = {MARKER} INTO v_leased \
             FROM {t} WHERE lock_key = p_key FOR UPDATE; \
           IF v_leased THEN \
             SELECT COALESCE(MAX(fence), -1) INTO v_fence FROM {t}_leases \
               WHERE lock_key = p_key AND owner = p_owner AND expires_at > {NOW}; \
             IF v_fence >= 0 THEN \
               UPDATE {t}_leases SET expires_at = GREATEST(expires_at, {expiry}) \
                 WHERE lock_key = p_key AND owner = p_owner AND expires_at > {NOW}; \
               UPDATE {t} SET expires_at = GREATEST(expires_at, {expiry}) WHERE lock_key = p_key; \
             END IF; \
           END IF; \
           COMMIT; \
           SELECT v_fence; \
         END"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_one_call_path_is_a_procedure_of_the_table() {
        let calls = super::super::statements::statements("locks").claims.calls;
        let [claim, release, extend] = [calls.claim, calls.release, calls.extend]
            .map(|c| c.expect("MySQL has every one-call path"));
        assert_eq!(&*claim.sql, "CALL locks_claim(?, ?, ?, ?, ?, ?)");
        assert_eq!(&*release.sql, "CALL locks_release_lease(?, ?)");
        assert_eq!(&*extend.sql, "CALL locks_extend_lease(?, ?, ?)");
        let created = routines("locks");
        for name in ["locks_claim", "locks_release_lease", "locks_extend_lease"] {
            assert!(created.contains(&format!("DROP PROCEDURE IF EXISTS {name}")));
            assert!(
                created
                    .iter()
                    .any(|s| s
                        .starts_with(&format!("CREATE PROCEDURE {name}(p_key VARBINARY(255), ")))
            );
        }
    }
}
