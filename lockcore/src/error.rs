//! The one error type of distlock.

use std::fmt;
use std::time::Duration;

use crate::LockKey;

/// A boxed error from a store's client library, kept as the `source` of a [`LockError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The lock operation during which a store error happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// An attempt to take the lock ([`LockRequest::acquire`](crate::LockRequest::acquire),
    /// [`try_acquire`](crate::LockRequest::try_acquire)).
    Acquire,
    /// Giving the lock back ([`LockGuard::release`](crate::LockGuard::release), a dropped guard).
    Release,
    /// An explicit renewal ([`LockHandle::extend`](crate::LockHandle::extend)).
    Extend,
    /// A renewal by the watchdog.
    Renew,
    /// Looking at the holder ([`LockClient::inspect`](crate::LockClient::inspect)).
    Inspect,
    /// An operator's break-lock ([`LockClient::force_release`](crate::LockClient::force_release)).
    ForceRelease,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Acquire => "acquiring",
            Operation::Release => "releasing",
            Operation::Extend => "extending",
            Operation::Renew => "renewing",
            Operation::Inspect => "inspecting",
            Operation::ForceRelease => "force-releasing",
        })
    }
}

/// Which operation on which key a store error interrupted. Set by the client on the errors
/// of lock operations; `None` for errors outside one (connecting, configuration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorContext {
    /// The operation.
    pub operation: Operation,
    /// The lock it was for.
    pub key: LockKey,
}

impl fmt::Display for ErrorContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.operation, self.key.as_str())
    }
}

/// " while acquiring \"k\"" for an error with a context, nothing otherwise.
struct During<'a>(&'a Option<ErrorContext>);

impl fmt::Display for During<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(c) => write!(f, " while {c}"),
            None => Ok(()),
        }
    }
}

/// " at 127.0.0.1:6379" for an error that names where the store was asked, nothing
/// otherwise.
struct At<'a>(&'a Option<String>);

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(place) => write!(f, " at {place}"),
            None => Ok(()),
        }
    }
}

/// A duration as a person reads it: `302ms`, `4.5s`.
struct Human(Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d < Duration::from_secs(1) {
            write!(f, "{}ms", d.as_millis())
        } else {
            write!(f, "{:.1}s", d.as_secs_f64())
        }
    }
}

/// Everything that can go wrong with a lock, each variant saying what to do about it.
///
/// Contention is not an error: [`LockRequest::try_acquire`](crate::LockRequest::try_acquire)
/// returns `Ok(None)` when another owner holds the lock, and
/// [`LockRequest::acquire`](crate::LockRequest::acquire) keeps waiting.
///
/// Errors of lock operations name the key (and, for store failures, the operation). As
/// the Rust API guidelines ask, `Display` never repeats the [`source`](std::error::Error::source):
/// print the whole chain (`anyhow`'s `{:#}`, or walk `source()`) to see the store's own cause.
///
/// # Examples
///
/// ```
/// # #[tokio::main] async fn main() {
/// use std::time::Duration;
/// use distlock_core::{LockClient, LockError, memory::MemoryBackend};
///
/// let locks = LockClient::new(MemoryBackend::new());
/// let _held = locks.lock("invoice:42").acquire().await.unwrap();
/// let err = locks.lock("invoice:42").wait(Duration::from_millis(20)).acquire().await.unwrap_err();
/// assert!(matches!(err, LockError::Timeout { .. }));
/// assert!(err.to_string().contains("\"invoice:42\""));
/// # }
/// ```
#[derive(thiserror::Error)]
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
    #[error("timed out after {} waiting for the lock {:?}", Human(*.waited), .key.as_str())]
    Timeout {
        /// The lock that was asked for.
        key: LockKey,
        /// How long the request waited.
        waited: Duration,
    },
    /// The lock was lost while work was running under it (see
    /// [`LockRequest::with_lock`](crate::LockRequest::with_lock)). Work done so far is not rolled back.
    #[error("the lock {:?} was lost before the work under it finished", .key.as_str())]
    Lost {
        /// The lock that was lost.
        key: LockKey,
    },
    /// The caller does not hold the lock (any more): it expired, or another owner took it.
    #[error("the lock {:?} is not held by this owner (it expired or was taken over)", .key.as_str())]
    NotHeld {
        /// The lock.
        key: LockKey,
    },
    /// The store could not be reached or did not answer in time. Retrying later may succeed.
    #[error("{backend}{} is unavailable{}", At(.at), During(.context))]
    Unavailable {
        /// The backend that failed.
        backend: &'static str,
        /// Where the store was asked, when the driver says (`127.0.0.1:6379`, a list of
        /// hosts, a file's path; never credentials): see [`at`](LockError::at).
        at: Option<String>,
        /// The operation and key, when the error interrupted a lock operation.
        context: Option<ErrorContext>,
        /// What the store's client reported.
        #[source]
        source: BoxError,
    },
    /// Too few Redlock instances *answered* to form a majority (contention is not this error).
    /// Shown as `quorum not reached while acquiring "k": 2 of 5 instances answered, 3 needed;
    /// 127.0.0.1:6381: Connection refused (os error 111); …`.
    #[error("{}", quorum_not_reached(*.got, *.needed, .failures, .context))]
    QuorumNotReached {
        /// How many instances answered.
        got: usize,
        /// How many are needed for a majority.
        needed: usize,
        /// Each instance that did not answer, and why: `host:port: cause` (never
        /// credentials).
        failures: Vec<String>,
        /// The operation and key, when the error interrupted a lock operation.
        context: Option<ErrorContext>,
    },
    /// A configuration problem: malformed URL, unknown scheme, backend compiled out, bad option.
    #[error("configuration error: {message}")]
    Config {
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The store answered with an error that retrying will not fix (permissions, schema, bug).
    #[error("{backend}{} failed{}", At(.at), During(.context))]
    Backend {
        /// The backend that failed.
        backend: &'static str,
        /// Where the store was asked, when the driver says: see [`at`](LockError::at).
        at: Option<String>,
        /// The operation and key, when the error interrupted a lock operation.
        context: Option<ErrorContext>,
        /// What the store's client reported.
        #[source]
        source: BoxError,
    },
    /// The [`LockClient`](crate::LockClient) was shut down.
    #[error("the lock client was shut down")]
    Shutdown,
}

/// The text of [`LockError::QuorumNotReached`].
fn quorum_not_reached(
    got: usize,
    needed: usize,
    failures: &[String],
    context: &Option<ErrorContext>,
) -> String {
    let during = During(context);
    if failures.is_empty() {
        return format!("quorum not reached{during}: {got} instances answered, {needed} needed");
    }
    let mut text = format!(
        "quorum not reached{during}: {got} of {} instances answered, {needed} needed",
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
    ///
    /// A driver should keep the client library's error as `source` (not its text), so that
    /// the client can tell a request that provably never reached the store (its chain holds
    /// an [`std::io::ErrorKind::ConnectionRefused`]) from one whose answer was lost.
    pub fn unavailable(backend: &'static str, source: impl Into<BoxError>) -> Self {
        LockError::Unavailable {
            backend,
            at: None,
            context: None,
            source: source.into(),
        }
    }

    /// An [`Unavailable`](Self::Unavailable) error for a request that provably never
    /// reached the store (its connection was refused before anything was sent), so nothing
    /// can have been applied: the client sends no compensating release for it, and a
    /// shutdown with the store down does not wait for one. Use it only when that is
    /// certain; when in doubt, [`unavailable`](Self::unavailable).
    pub fn unavailable_unsent(backend: &'static str, source: impl Into<BoxError>) -> Self {
        LockError::Unavailable {
            backend,
            at: None,
            context: None,
            source: Box::new(NeverSent(source.into())),
        }
    }

    /// A [`Backend`](Self::Backend) error for `backend`.
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        LockError::Backend {
            backend,
            at: None,
            context: None,
            source: source.into(),
        }
    }

    /// Names where the store was asked (`127.0.0.1:6379`, `db1:5432,db2:5432`, a file's
    /// path), shown as `redis at 127.0.0.1:6379 is unavailable`: for a driver, on the
    /// errors of connecting at least. Never pass credentials. Only
    /// [`Unavailable`](Self::Unavailable) and [`Backend`](Self::Backend) errors carry it; an
    /// error that already names a place keeps it.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock_core::LockError;
    ///
    /// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    /// let e = LockError::unavailable("redis", refused).at("127.0.0.1:6379");
    /// assert_eq!(e.to_string(), "redis at 127.0.0.1:6379 is unavailable");
    /// ```
    #[must_use]
    pub fn at(mut self, place: impl Into<String>) -> Self {
        if let LockError::Unavailable { at, .. } | LockError::Backend { at, .. } = &mut self {
            if at.is_none() {
                *at = Some(place.into());
            }
        }
        self
    }

    /// Where the store was asked, if the error says ([`at`](Self::at)).
    pub fn place(&self) -> Option<&str> {
        match self {
            LockError::Unavailable { at, .. } | LockError::Backend { at, .. } => at.as_deref(),
            _ => None,
        }
    }

    /// The operation and key a store error interrupted, if known.
    pub fn context(&self) -> Option<&ErrorContext> {
        match self {
            LockError::Unavailable { context, .. }
            | LockError::Backend { context, .. }
            | LockError::QuorumNotReached { context, .. } => context.as_ref(),
            _ => None,
        }
    }

    /// The key of the lock the error is about, if it is about one.
    pub fn key(&self) -> Option<&LockKey> {
        match self {
            LockError::Timeout { key, .. }
            | LockError::Lost { key }
            | LockError::NotHeld { key } => Some(key),
            _ => self.context().map(|c| &c.key),
        }
    }

    /// Records that this error interrupted `operation` on `key` (a store error that already
    /// names an operation keeps it).
    pub(crate) fn during(mut self, operation: Operation, key: &LockKey) -> Self {
        if let LockError::Unavailable { context, .. }
        | LockError::Backend { context, .. }
        | LockError::QuorumNotReached { context, .. } = &mut self
        {
            context.get_or_insert_with(|| ErrorContext {
                operation,
                key: key.clone(),
            });
        }
        self
    }

    /// Whether the failed request provably never reached the store, so it cannot have been
    /// applied: the connection to the store was refused before anything was sent.
    pub(crate) fn never_sent(&self) -> bool {
        let LockError::Unavailable { source, .. } = self else {
            return false;
        };
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
        while let Some(e) = next {
            if e.is::<NeverSent>() {
                return true;
            }
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::ConnectionRefused {
                    return true;
                }
            }
            next = e.source();
        }
        false
    }
}

/// The cause of a request that never reached the store: shows as the cause itself.
#[derive(Debug)]
struct NeverSent(BoxError);

impl fmt::Display for NeverSent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for NeverSent {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Reads as the message, then its causes, as `anyhow`'s errors do: returned from `main`, a
/// `LockError` prints what happened and why, not the variant's fields.
///
/// ```text
/// Error: redis is unavailable
///
/// Caused by:
///     Connection refused (os error 111)
/// ```
impl fmt::Debug for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.to_string();
        f.write_str(&shown)?;
        let mut causes = Vec::new();
        let mut next = std::error::Error::source(self);
        while let Some(e) = next {
            let text = e.to_string();
            // A cause the message already quotes (or an empty one) says nothing new.
            if !text.is_empty() && !shown.contains(&text) {
                shown.push_str(&text);
                causes.push(text);
            }
            next = e.source();
        }
        match causes.as_slice() {
            [] => Ok(()),
            [only] => write!(f, "\n\nCaused by:\n    {only}"),
            all => {
                f.write_str("\n\nCaused by:")?;
                for (i, cause) in all.iter().enumerate() {
                    write!(f, "\n    {i}: {cause}")?;
                }
                Ok(())
            }
        }
    }
}

/// An error and its whole chain of causes on one line (`a: b: c`), skipping a cause whose
/// text its parent already shows. For logs and command-line messages.
///
/// # Examples
///
/// ```
/// use distlock_core::{ErrorChain, LockError};
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
/// let err = LockError::unavailable("redis", io);
/// assert_eq!(ErrorChain(&err).to_string(), "redis is unavailable: connection refused");
/// ```
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            let text = e.to_string();
            if !text.is_empty() && !shown.contains(&text) {
                write!(f, ": {text}")?;
                shown.push_str(&text);
            }
            next = e.source();
        }
        Ok(())
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn key() -> LockKey {
        LockKey::new("invoice:42").unwrap()
    }

    #[test]
    fn lock_errors_name_the_key_and_store_errors_the_operation() {
        let timeout = LockError::Timeout {
            key: key(),
            waited: Duration::from_millis(302),
        };
        assert_eq!(
            timeout.to_string(),
            "timed out after 302ms waiting for the lock \"invoice:42\""
        );
        assert_eq!(
            LockError::NotHeld { key: key() }.to_string(),
            "the lock \"invoice:42\" is not held by this owner (it expired or was taken over)"
        );
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let err = LockError::unavailable("redis", io).during(Operation::Release, &key());
        assert_eq!(
            err.to_string(),
            "redis is unavailable while releasing \"invoice:42\""
        );
        assert_eq!(err.key(), Some(&key()));
        // A second context does not overwrite the first.
        let err = err.during(Operation::Acquire, &LockKey::new("other").unwrap());
        assert_eq!(err.context().unwrap().operation, Operation::Release);
    }

    /// `{:?}` (what `main` prints for an error it returns) is the message and its causes,
    /// not the variant's fields.
    #[test]
    fn debug_reads_as_the_message_and_its_causes() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let err = LockError::unavailable("redis", io).during(Operation::Acquire, &key());
        assert_eq!(
            format!("{err:?}"),
            "redis is unavailable while acquiring \"invoice:42\"\n\nCaused by:\n    connection refused"
        );
        assert_eq!(
            format!("{:?}", LockError::NotHeld { key: key() }),
            LockError::NotHeld { key: key() }.to_string()
        );
    }

    #[test]
    fn display_never_repeats_the_source() {
        let err = LockError::backend("postgres", "permission denied for table distlock_locks")
            .during(Operation::Acquire, &key());
        let source = err.source().expect("a source").to_string();
        assert!(!err.to_string().contains(&source), "{err}");
        assert_eq!(
            ErrorChain(&err).to_string(),
            "postgres failed while acquiring \"invoice:42\": permission denied for table distlock_locks"
        );
    }

    #[test]
    fn only_a_refused_connection_proves_a_request_was_never_sent() {
        #[derive(Debug, thiserror::Error)]
        #[error("wrapped")]
        struct Wrapped(#[source] std::io::Error);
        let refused = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(LockError::unavailable("x", refused()).never_sent());
        assert!(LockError::unavailable("x", Wrapped(refused())).never_sent());
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(!LockError::unavailable("x", reset).never_sent());
        assert!(!LockError::unavailable("x", "timed out").never_sent());
        assert!(!LockError::backend("x", refused()).never_sent());
        let unsent = LockError::unavailable_unsent("x", "Connection refused");
        assert!(unsent.never_sent());
        assert_eq!(
            ErrorChain(&unsent).to_string(),
            "x is unavailable: Connection refused"
        );
    }
}
