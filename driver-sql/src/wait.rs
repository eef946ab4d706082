//! How a backend's waiters learn of releases: the [`Waiting`] a backend pairs with its
//! lock table, and the polling one of the databases without notifications.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{LockError, LockKey, WaitHint};

use crate::dialect::Dialect;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use crate::poll::Waiters;
use crate::store::Store;

/// How the waiters of one backend are woken.
pub(crate) trait Waiting<D: Dialect>: Send + Sync + 'static {
    /// A release through this backend freed `key`.
    fn released(&self, key: &LockKey);

    /// Wakes the next waiter of `key` in this backend (see
    /// [`LockBackend::wake_next`](lockcore::LockBackend::wake_next)).
    fn wake_next(&self, key: &LockKey);

    /// Waits until `key` is probably free or `max_wait` passes (see
    /// [`LockBackend::wait_released`](lockcore::LockBackend::wait_released)). The hint's
    /// revision is the fence a refused claim saw, so a release of a lease before the wait
    /// began is not slept through; behind a reservation, a key free of leases is no reason
    /// to return (see [`Since`]).
    fn wait<'a>(
        &'a self,
        store: &'a Arc<Store<D>>,
        key: &'a LockKey,
        hint: &'a WaitHint,
        max_wait: Duration,
    ) -> impl Future<Output = Result<(), LockError>> + Send + 'a;

    /// The backend shuts down: stop whatever runs in the background.
    fn stop(&self);
}

/// Polling (MySQL, SQLite): one poller per key with waiters; a release through the same
/// backend wakes its own waiters at once.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl<D: Dialect> Waiting<D> for Arc<Waiters> {
    fn released(&self, key: &LockKey) {
        self.notifier.notify_one(key);
    }

    fn wake_next(&self, key: &LockKey) {
        self.notifier.notify_one(key);
    }

    fn wait<'a>(
        &'a self,
        store: &'a Arc<Store<D>>,
        key: &'a LockKey,
        hint: &'a WaitHint,
        max_wait: Duration,
    ) -> impl Future<Output = Result<(), LockError>> + Send + 'a {
        Waiters::wait(self, store, key, Since::of(hint), max_wait)
    }

    fn stop(&self) {}
}

/// What a wait started from, as the refused claim's hint says.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Since {
    /// The fence the refused claim saw: another one means something changed.
    pub(crate) revision: Option<i64>,
    /// Refused only by another owner's reservation: the key may be free of leases but
    /// reserved, which is no reason to return at once (its owner takes it next; a removed
    /// reservation is announced, a lapsed one ends the client's bounded wait).
    pub(crate) reserved: bool,
}

impl Since {
    pub(crate) fn of(hint: &WaitHint) -> Self {
        Since {
            revision: hint.revision(),
            reserved: hint.is_behind_reservation(),
        }
    }

    /// Whether a key in this state (`None`: free of leases) ends the wait at once.
    pub(crate) fn changed(&self, fence: Option<i64>) -> bool {
        match fence {
            None => !self.reserved,
            Some(fence) => self.revision.is_some_and(|r| r != fence),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_key_ends_a_wait_unless_only_a_reservation_refused() {
        let plain = Since::of(&WaitHint::at_revision(7));
        let reserved = Since::of(&WaitHint::at_revision(7).behind_reservation());
        assert!(plain.changed(None));
        assert!(!reserved.changed(None));
        for since in [plain, reserved] {
            assert!(!since.changed(Some(7)), "{since:?}");
            assert!(since.changed(Some(8)), "{since:?}");
        }
        // Without a revision only a free key is news.
        assert!(!Since::of(&WaitHint::none()).changed(Some(8)));
    }
}
