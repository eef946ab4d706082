//! How a backend's waiters learn of releases: the [`Waiting`] a backend pairs with its
//! lock table, the polling one of the databases without notifications ([`poll`]), and what
//! a wait started from ([`since`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockcore::driver::{ReleaseNotifier, WaitHint};
use lockcore::{LockError, LockKey};

use crate::backend::lock::Store;
use crate::dialect::Dialect;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use poll::Waiters;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use since::Since;

#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) mod poll;
pub(crate) mod since;

/// How the waiters of one backend are woken.
pub(crate) trait Waiting<D: Dialect>: Send + Sync + 'static {
    /// A release through this backend freed `key`.
    fn released(&self, key: &LockKey);

    /// The notifier this backend's waiters subscribe with, through which lockcore passes a
    /// wake-up on to the next waiter of a key (see
    /// [`LockBackend::notifier`](lockcore::LockBackend::notifier)).
    fn notifier(&self) -> &ReleaseNotifier;

    /// Waits until `key` is probably free or `max_wait` passes (see
    /// [`LockBackend::wait_released`](lockcore::LockBackend::wait_released)), subscribed at
    /// the waiter's `place` in this process's line. The hint's revision is the fence a
    /// refused claim saw, so a release of a lease before the wait began is not slept
    /// through; behind a reservation, a key free of leases is no reason to return (see
    /// [`Since`]).
    fn wait<'a>(
        &'a self,
        store: &'a Arc<Store<D>>,
        key: &'a LockKey,
        hint: &'a WaitHint,
        place: u64,
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
        self.wake(key);
    }

    fn notifier(&self) -> &ReleaseNotifier {
        &self.notifier
    }

    fn wait<'a>(
        &'a self,
        store: &'a Arc<Store<D>>,
        key: &'a LockKey,
        hint: &'a WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> impl Future<Output = Result<(), LockError>> + Send + 'a {
        let since = Since::of(hint);
        Waiters::wait(self, store, key, since, place, max_wait)
    }

    fn stop(&self) {}
}
