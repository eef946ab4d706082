//! The one error type of distlock.

use std::time::Duration;

/// A boxed error from a store's client library, kept as the `source` of a [`LockError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong with a lock, each variant saying what to do about it.
///
/// Contention is not an error: [`LockRequest::try_acquire`](crate::LockRequest::try_acquire)
/// returns `Ok(None)` when another owner holds the lock, and
/// [`LockRequest::acquire`](crate::LockRequest::acquire) keeps waiting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The key is not a valid lock key (empty, longer than 255 bytes, or containing control
    /// characters). Fix the key; retrying cannot help.
    #[error("invalid lock key: {reason}")]
    InvalidKey {
        /// Why the key was rejected.
        reason: String,
    },
    /// The TTL is zero, too large for the backend, or overflows the clock.
    #[error("invalid TTL {ttl:?}: {reason}")]
    InvalidTtl {
        /// The TTL that was requested.
        ttl: Duration,
        /// Why it was rejected.
        reason: String,
    },
    /// The wait deadline passed before the lock could be acquired. Nothing is left held.
    #[error("timed out after {waited:?} waiting for the lock")]
    Timeout {
        /// How long the request waited.
        waited: Duration,
    },
    /// The lock was lost while work was running under it (see
    /// [`LockClient::with_lock`](crate::LockClient::with_lock)). Work done so far is not rolled back.
    #[error("the lock was lost before the work under it finished")]
    Lost,
    /// The caller does not hold the lock (any more): it expired, or another owner took it.
    #[error("the lock is not held by this owner (it expired or was taken over)")]
    NotHeld,
    /// The store could not be reached or did not answer in time. Retrying later may succeed.
    #[error("{backend} is unavailable: {source}")]
    Unavailable {
        /// The backend that failed.
        backend: &'static str,
        /// What the store's client reported.
        #[source]
        source: BoxError,
    },
    /// Too few Redlock instances *answered* to form a majority (contention is not this error).
    /// Shown as `quorum not reached: 2 of 5 instances answered, 3 needed; 127.0.0.1:6381:
    /// Connection refused (os error 111); …`.
    #[error("{}", quorum_not_reached(*.got, *.needed, .failures))]
    QuorumNotReached {
        /// How many instances answered.
        got: usize,
        /// How many are needed for a majority.
        needed: usize,
        /// Each instance that did not answer, and why: `host:port: cause` (never
        /// credentials).
        failures: Vec<String>,
    },
    /// A configuration problem: malformed URL, unknown scheme, backend compiled out, bad option.
    #[error("configuration error: {message}")]
    Config {
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The store answered with an error that retrying will not fix (permissions, schema, bug).
    #[error("{backend} error: {source}")]
    Backend {
        /// The backend that failed.
        backend: &'static str,
        /// What the store's client reported.
        #[source]
        source: BoxError,
    },
    /// The [`LockClient`](crate::LockClient) was shut down.
    #[error("the lock client was shut down")]
    Shutdown,
}

/// The text of [`LockError::QuorumNotReached`].
fn quorum_not_reached(got: usize, needed: usize, failures: &[String]) -> String {
    if failures.is_empty() {
        return format!("quorum not reached: {got} instances answered, {needed} needed");
    }
    let mut text = format!(
        "quorum not reached: {got} of {} instances answered, {needed} needed",
        got + failures.len()
    );
    for failure in failures {
        text.push_str("; ");
        text.push_str(failure);
    }
    text
}

impl LockError {
    /// Whether retrying the same call later may succeed.
    ///
    /// True for [`Unavailable`](Self::Unavailable), [`QuorumNotReached`](Self::QuorumNotReached)
    /// and [`Timeout`](Self::Timeout); false for bad input, configuration and lost locks.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LockError::Unavailable { .. }
                | LockError::QuorumNotReached { .. }
                | LockError::Timeout { .. }
        )
    }

    /// A [`Config`](Self::Config) error with the given message.
    pub fn config(message: impl Into<String>) -> Self {
        LockError::Config {
            message: message.into(),
        }
    }

    /// An [`Unavailable`](Self::Unavailable) error for `backend`.
    pub fn unavailable(backend: &'static str, source: impl Into<BoxError>) -> Self {
        LockError::Unavailable {
            backend,
            source: source.into(),
        }
    }

    /// A [`Backend`](Self::Backend) error for `backend`.
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        LockError::Backend {
            backend,
            source: source.into(),
        }
    }
}
