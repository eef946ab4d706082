//! What every handle of one client shares: the backend, the client's settings, its slots
//! and lines, and its background tasks.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::lease::{elapsed_on, now_on};
use crate::line::Lines;
use crate::metrics::Meter;
use crate::slots::SlotMap;
use crate::{Capabilities, LockBackend};

pub(crate) struct ClientInner {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) caps: Capabilities,
    /// The label of the owners this client creates.
    pub(crate) label: Arc<str>,
    pub(crate) default_ttl: Duration,
    pub(crate) shutdown_timeout: Duration,
    /// Reentrancy state per (key, owner).
    pub(crate) slots: SlotMap,
    /// The keys this client's requests are waiting for.
    pub(crate) lines: Lines,
    /// Background work: releases of dropped guards, clean-up of cancelled requests.
    pub(crate) tasks: TaskTracker,
    /// What the client records about its locks.
    pub(crate) meter: Meter,
    /// Cancelled by shutdown.
    pub(crate) closed: CancellationToken,
    /// How many of this client's requests keep a mark for a long wait in the store: they
    /// share a budget of renewals ([`crate::starving::renew_marks_every`]).
    pub(crate) marked: AtomicUsize,
}

impl ClientInner {
    /// Now, on the clock of this client's store (see [`now_on`]).
    pub(crate) fn now(&self) -> std::time::Instant {
        now_on(self.caps.clock)
    }

    /// How long ago `since` was, on the clock of this client's store.
    pub(crate) fn elapsed(&self, since: std::time::Instant) -> Duration {
        elapsed_on(self.caps.clock, since)
    }
}

impl std::fmt::Debug for ClientInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.backend.name())
            .field("label", &self.label)
            .finish()
    }
}
