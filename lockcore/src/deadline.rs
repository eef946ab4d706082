//! What a waiting request shares with the wait deadline around it: the failure it is
//! retrying, and whether an attempt is in flight when the deadline passes.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::LockError;

/// What a waiting request shares with the wait deadline around it
/// ([`LockRequest::acquire`](crate::LockRequest::acquire)).
#[derive(Debug, Default)]
pub(crate) struct Watched {
    /// The store failure it is retrying, if its last attempt failed: a wait deadline that
    /// passes during the next attempt reports it rather than a `Timeout` that would hide it
    /// (a deadline that passes during the pause before it already does).
    pub(crate) failure: Mutex<Option<LockError>>,
    /// An attempt is in flight. A deadline that passes then hands it to the background at
    /// once; a deadline that passes while the request is idle lets the request leave the
    /// place or mark it keeps in the store first (see [`LEAVING_GRACE`]).
    pub(crate) attempting: AtomicBool,
}

pub(crate) type Retrying = Arc<Watched>;

/// How long a wait deadline that passed while the request was idle waits for the request
/// to leave the place or mark it keeps in the store ([`LockBackend::abandon`]) before it
/// answers `Timeout` anyway (and leaves that to the background): a place or mark left
/// behind keeps the next request out until the clean-up comes.
///
/// [`LockBackend::abandon`]: crate::LockBackend::abandon
pub(crate) const LEAVING_GRACE: Duration = Duration::from_millis(100);
