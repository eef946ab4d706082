//! What a driver author needs beyond the application's API: the operations a backend
//! implements and the types they exchange, the conveniences built on them, and the helpers
//! drivers share (wake-ups, the fairness rule's constants, retries, the lease arithmetic).
//!
//! An application never needs this module: it uses [`LockClient`](crate::LockClient) and
//! what the crate root holds. See `docs/writing-a-driver.md`.

pub use crate::backend::{
    renew_each, AcquireOutcome, Capabilities, ClaimRequest, ClockSource, Contention, ExtendOutcome,
    Fairness, FencingGuarantee, Grant, LockBackendExt, Renewal, SetOutcome, WaitHint,
    RENEWAL_BATCH,
};
pub use crate::claim::{describe_capacity, READ_WRITE_CAPACITY};
pub use crate::error::{BoxError, ErrorContext, Operation};
pub use crate::key::MAX_KEY_LEN;
pub use crate::lease::{clock_drift, lost_margin, renewal_allowance};
pub use crate::notify::{ReleaseNotifier, Subscription};
pub use crate::owner::{default_label, OwnerToken, MAX_LABEL_LEN};
pub use crate::retry::{jitter, Backoff};
pub use crate::starving::{STARVING_AFTER, STARVING_MARK_TTL};
pub use async_trait::async_trait;
