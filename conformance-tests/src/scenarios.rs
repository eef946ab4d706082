//! The scenario catalogue: one file per scenario, each a public async fn over a
//! [`Harness`], with a one-line spec.
//!
//! Every scenario works under a fresh random key prefix, so scenarios can share a store and
//! run in parallel, and times everything in multiples of [`Harness::ttl`].

mod bad_input_rejected;
mod cancelled_acquire_leaves_nothing;
mod contended_handoff_keeps_waking;
mod dropped_guard_released;
mod expiry_frees_lock;
mod extend_keeps_and_fails_after_loss;
mod fencing_tokens_increase;
mod hostile_keys_isolated;
mod independent_keys;
mod inspect_hides_owner_token;
mod late_release_keeps_new_holder;
mod lost_fires_when_renewal_impossible;
mod many_keys;
mod mutual_exclusion;
mod paused_holder_write_rejected;
mod reentrant_counts;
mod release_by_stranger_is_not_held;
mod stale_token_rejected;
mod store_unavailable;
mod try_acquire_reports_holder;
mod wait_deadline_times_out;
mod waiter_acquires_after_release;
mod watchdog_keeps_lock;

pub use bad_input_rejected::bad_input_rejected;
pub use cancelled_acquire_leaves_nothing::cancelled_acquire_leaves_nothing;
pub use contended_handoff_keeps_waking::contended_handoff_keeps_waking;
pub use dropped_guard_released::dropped_guard_released;
pub use expiry_frees_lock::expiry_frees_lock;
pub use extend_keeps_and_fails_after_loss::extend_keeps_and_fails_after_loss;
pub use fencing_tokens_increase::fencing_tokens_increase;
pub use hostile_keys_isolated::hostile_keys_isolated;
pub use independent_keys::independent_keys;
pub use inspect_hides_owner_token::inspect_hides_owner_token;
pub use late_release_keeps_new_holder::late_release_keeps_new_holder;
pub use lost_fires_when_renewal_impossible::lost_fires_when_renewal_impossible;
pub use many_keys::many_keys;
pub use mutual_exclusion::mutual_exclusion;
pub use paused_holder_write_rejected::paused_holder_write_rejected;
pub use reentrant_counts::reentrant_counts;
pub use release_by_stranger_is_not_held::release_by_stranger_is_not_held;
pub use stale_token_rejected::stale_token_rejected;
pub use store_unavailable::store_unavailable;
pub use try_acquire_reports_holder::try_acquire_reports_holder;
pub use wait_deadline_times_out::wait_deadline_times_out;
pub use waiter_acquires_after_release::waiter_acquires_after_release;
pub use watchdog_keeps_lock::watchdog_keeps_lock;

use std::time::Duration;

use lockcore::{LockClient, LockError};

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
