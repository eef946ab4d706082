//! The scenario catalogue: one file per scenario, each a public async fn over a
//! [`Harness`], with a one-line spec.
//!
//! Scenarios of shared claims (read-write locks, semaphores) run only on backends that
//! declare them, and those of fencing tokens (leader election among them: terms are
//! tokens) only on backends that hand tokens out; the rest hold every backend to the
//! exclusive lock's contract.
//!
//! Every scenario works under a fresh random key prefix, so scenarios can share a store and
//! run in parallel, and times everything in multiples of [`Harness::ttl`].

mod bad_input_rejected;
mod batched_renewal_keeps_each_hold;
mod cancelled_acquire_leaves_nothing;
mod cancelled_key_set_leaves_nothing;
mod cancelled_shared_claim_leaves_nothing;
mod capacity_mismatch_refused;
mod contended_handoff_keeps_waking;
mod dead_holder_permits_return;
mod deleted_record_seen_as_lost;
mod deposed_leader_term_rejected;
mod dropped_guard_released;
mod dropped_key_set_leaves_nothing;
mod election_one_leader_at_a_time;
mod expiry_frees_lock;
mod extend_keeps_and_fails_after_loss;
mod extend_never_shortens_lease;
mod fencing_tokens_increase;
mod fifo_across_clients;
mod full_renewal_batch_answers_each;
mod held_lock_survives_restart_keeping_data;
mod hold_survives_slow_reconnect;
mod hostile_keys_isolated;
mod independent_keys;
mod inspect_hides_owner_token;
mod key_set_lost_when_one_key_lost;
mod key_set_tokens_rise;
mod key_sets_all_or_nothing;
mod key_sets_in_opposite_orders_finish;
mod lapsed_lease_not_renewed;
mod late_release_keeps_new_holder;
mod long_wait_marks_next_turn;
mod lost_fires_when_renewal_impossible;
mod many_keys;
mod mixed_renewal_batch_answers_each;
mod mutual_exclusion;
mod no_renewal_after_release;
mod observed;
mod observers_see_every_leader;
mod paused_holder_write_rejected;
mod paused_reader_does_not_block_writer;
mod paused_writer_cannot_write_under_reader;
mod readers_exclude_writer;
mod readers_share;
mod reassigned_record_seen_as_lost;
mod reentrant_counts;
mod release_by_stranger_is_not_held;
mod release_wakes_enough_waiters;
mod releasing_client_does_not_starve_waiter;
mod resign_hands_over_promptly;
mod rewritten_record_changes_nothing;
mod semaphore_never_exceeds_capacity;
mod shared_reentry_keeps_mode;
mod short_deadline_answers_first_attempt;
mod short_deadline_fresh_keys_granted;
mod slow_acquire_token_above_meanwhile;
mod stale_token_rejected;
mod store_unavailable;
mod takeover_not_before_store_expiry;
mod tokens_increase_across_modes;
mod tokens_increase_across_restart_same_key;
mod try_acquire_reports_holder;
mod unrenewed_hold_expires_beside_renewed;
mod valid_until_within_store_expiry;
mod wait_deadline_times_out;
mod waiter_acquires_after_release;
mod watchdog_keeps_lock;
mod writer_excludes_readers;
mod writer_not_starved_by_readers;

pub use bad_input_rejected::bad_input_rejected;
pub use batched_renewal_keeps_each_hold::batched_renewal_keeps_each_hold;
pub use cancelled_acquire_leaves_nothing::cancelled_acquire_leaves_nothing;
pub use cancelled_key_set_leaves_nothing::cancelled_key_set_leaves_nothing;
pub use cancelled_shared_claim_leaves_nothing::cancelled_shared_claim_leaves_nothing;
pub use capacity_mismatch_refused::capacity_mismatch_refused;
pub use contended_handoff_keeps_waking::contended_handoff_keeps_waking;
pub use dead_holder_permits_return::dead_holder_permits_return;
pub use deleted_record_seen_as_lost::deleted_record_seen_as_lost;
pub use deposed_leader_term_rejected::deposed_leader_term_rejected;
pub use dropped_guard_released::dropped_guard_released;
pub use dropped_key_set_leaves_nothing::dropped_key_set_leaves_nothing;
pub use election_one_leader_at_a_time::election_one_leader_at_a_time;
pub use expiry_frees_lock::expiry_frees_lock;
pub use extend_keeps_and_fails_after_loss::extend_keeps_and_fails_after_loss;
pub use extend_never_shortens_lease::extend_never_shortens_lease;
pub use fencing_tokens_increase::fencing_tokens_increase;
pub use fifo_across_clients::fifo_across_clients;
pub use full_renewal_batch_answers_each::full_renewal_batch_answers_each;
pub use held_lock_survives_restart_keeping_data::held_lock_survives_restart_keeping_data;
pub use hold_survives_slow_reconnect::hold_survives_slow_reconnect;
pub use hostile_keys_isolated::hostile_keys_isolated;
pub use independent_keys::independent_keys;
pub use inspect_hides_owner_token::inspect_hides_owner_token;
pub use key_set_lost_when_one_key_lost::key_set_lost_when_one_key_lost;
pub use key_set_tokens_rise::key_set_tokens_rise;
pub use key_sets_all_or_nothing::key_sets_all_or_nothing;
pub use key_sets_in_opposite_orders_finish::key_sets_in_opposite_orders_finish;
pub use lapsed_lease_not_renewed::lapsed_lease_not_renewed;
pub use late_release_keeps_new_holder::late_release_keeps_new_holder;
pub use long_wait_marks_next_turn::long_wait_marks_next_turn;
pub use lost_fires_when_renewal_impossible::lost_fires_when_renewal_impossible;
pub use many_keys::many_keys;
pub use mixed_renewal_batch_answers_each::mixed_renewal_batch_answers_each;
pub use mutual_exclusion::mutual_exclusion;
pub use no_renewal_after_release::no_renewal_after_release;
pub use observers_see_every_leader::observers_see_every_leader;
pub use paused_holder_write_rejected::paused_holder_write_rejected;
pub use paused_reader_does_not_block_writer::paused_reader_does_not_block_writer;
pub use paused_writer_cannot_write_under_reader::paused_writer_cannot_write_under_reader;
pub use readers_exclude_writer::readers_exclude_writer;
pub use readers_share::readers_share;
pub use reassigned_record_seen_as_lost::reassigned_record_seen_as_lost;
pub use reentrant_counts::reentrant_counts;
pub use release_by_stranger_is_not_held::release_by_stranger_is_not_held;
pub use release_wakes_enough_waiters::release_wakes_enough_waiters;
pub use releasing_client_does_not_starve_waiter::releasing_client_does_not_starve_waiter;
pub use resign_hands_over_promptly::resign_hands_over_promptly;
pub use rewritten_record_changes_nothing::rewritten_record_changes_nothing;
pub use semaphore_never_exceeds_capacity::semaphore_never_exceeds_capacity;
pub use shared_reentry_keeps_mode::shared_reentry_keeps_mode;
pub use short_deadline_answers_first_attempt::short_deadline_answers_first_attempt;
pub use short_deadline_fresh_keys_granted::short_deadline_fresh_keys_granted;
pub use slow_acquire_token_above_meanwhile::slow_acquire_token_above_meanwhile;
pub use stale_token_rejected::stale_token_rejected;
pub use store_unavailable::store_unavailable;
pub use takeover_not_before_store_expiry::takeover_not_before_store_expiry;
pub use tokens_increase_across_modes::tokens_increase_across_modes;
pub use tokens_increase_across_restart_same_key::tokens_increase_across_restart_same_key;
pub use try_acquire_reports_holder::try_acquire_reports_holder;
pub use unrenewed_hold_expires_beside_renewed::unrenewed_hold_expires_beside_renewed;
pub use valid_until_within_store_expiry::valid_until_within_store_expiry;
pub use wait_deadline_times_out::wait_deadline_times_out;
pub use waiter_acquires_after_release::waiter_acquires_after_release;
pub use watchdog_keeps_lock::watchdog_keeps_lock;
pub use writer_excludes_readers::writer_excludes_readers;
pub use writer_not_starved_by_readers::writer_not_starved_by_readers;

use std::time::Duration;

use lockcore::driver::FencingGuarantee;
use lockcore::{LockClient, LockError, LockGuard, LockKey, Owner};

use crate::harness::{FaultClient, FaultStore, Tamper};
use crate::{Failure, Harness};

/// Keys under a prefix no other run uses.
pub(crate) struct Keys(String);

impl Keys {
    pub(crate) fn new() -> Self {
        let mut bytes = [0u8; 6];
        let _ = getrandom::fill(&mut bytes);
        Keys(format!(
            "ct{}",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ))
    }

    pub(crate) fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.0)
    }
}

/// The set-up of the scenarios that change a lock record behind the driver's back: two
/// clients of a fault store of their own, the first holding `name` for `lease` with the
/// watchdog off (renewed by hand: only the tampering can end it within the scenario), and
/// then the record changed `how`.
pub(crate) struct Tampered {
    pub(crate) key: String,
    /// The other client.
    pub(crate) b: FaultClient,
    pub(crate) held: LockGuard,
    /// Whether the backend hands out fencing tokens.
    pub(crate) fenced: bool,
    // Kept alive to the end of the scenario: the holder's link, and the store (dropping it
    // stops the store).
    _holder: FaultClient,
    _store: Box<dyn FaultStore>,
}

impl Tampered {
    pub(crate) async fn start(
        h: &dyn Harness,
        name: &str,
        lease: Duration,
        how: Tamper,
    ) -> Result<Tampered, Failure> {
        let Some(store) = h.fault_store().await? else {
            return Err(Failure("no fault store".into()));
        };
        let key = Keys::new().key(name);
        let a = store.client().await?;
        let b = store.client().await?;
        let fenced = a.client.capabilities().fencing != FencingGuarantee::None;
        let held = a
            .client
            .lock(&key)
            .ttl(lease)
            .watchdog(false)
            .acquire()
            .await?;
        store.tamper(&LockKey::new(&key)?, how).await?;
        Ok(Tampered {
            key,
            _holder: a,
            b,
            held,
            fenced,
            _store: store,
        })
    }
}

/// `n` independent clients of the harness's store.
pub(crate) async fn clients(h: &dyn Harness, n: usize) -> Result<Vec<LockClient>, LockError> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(h.client().await?);
    }
    Ok(out)
}

/// Whether `key` is free: another owner can take it at once (the probe is released again).
pub(crate) async fn is_free(
    client: &LockClient,
    key: &str,
    ttl: Duration,
) -> Result<bool, Failure> {
    match client.lock(key).ttl(ttl).try_acquire().await? {
        Some(g) => {
            g.release().await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Whether a writer can take `key` at once as `owner` (the probe is released again).
///
/// For keys with shared claims: a refused exclusive probe may leave a reservation in the
/// store until lockcore abandons it in the background, which keeps other writers (and new
/// readers) out meanwhile. Probing with one owner throughout a scenario orders the probes
/// after those abandons (a request waits for the earlier requests of its owner to finish).
pub(crate) async fn writer_fits(
    client: &LockClient,
    key: &str,
    ttl: Duration,
    owner: &Owner,
) -> Result<bool, Failure> {
    match client
        .lock(key)
        .ttl(ttl)
        .owner(owner.clone())
        .try_acquire()
        .await?
    {
        Some(g) => {
            g.release().await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// The message of the [`LockError::Config`] a request must fail with.
pub(crate) fn config_error<T>(what: &str, result: Result<T, LockError>) -> Result<String, Failure> {
    match result {
        Err(LockError::Config { message }) => Ok(message),
        Err(e) => Err(Failure(format!(
            "{what}: expected a configuration error, got: {e}"
        ))),
        Ok(_) => Err(Failure(format!(
            "{what}: expected a configuration error, but it was granted"
        ))),
    }
}

/// The failure for an error a client saw while the scenario delayed its answers by
/// `delay`. An `Unavailable` there is almost always the driver's own request timeout
/// firing: say so, since the scenario cannot pass until the timeout lets the delay through.
pub(crate) fn while_delayed(e: LockError, delay: Duration) -> Failure {
    if matches!(e, LockError::Unavailable { .. }) {
        let mut said = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            said = format!("{said}: {cause}");
            source = cause.source();
        }
        Failure(format!(
            "{said} — while the scenario delayed the store's answers by {delay:?}: your request \
             timeout is shorter than the scenario's delay. Give each request (each instance's \
             request, for a quorum backend) at least ttl()/2; see docs/writing-a-driver.md"
        ))
    } else {
        Failure(format!("unexpected error: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unavailable_while_delayed_names_the_request_timeout() {
        let e = LockError::unavailable("mystore", "response timed out");
        let message = while_delayed(e, Duration::from_millis(125)).0;
        assert!(message.contains("response timed out"), "{message}");
        assert!(message.contains("125ms"), "{message}");
        assert!(
            message.contains("your request timeout is shorter than the scenario's delay"),
            "{message}"
        );
        let other = while_delayed(LockError::config("bad"), Duration::from_millis(125)).0;
        assert!(!other.contains("request timeout"), "{other}");
    }
}
