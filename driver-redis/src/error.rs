//! Turning the redis crate's errors into [`LockError`]s.
//!
//! `timed_out` and `unexpected` are re-exported for driver-redlock (hidden from the docs);
//! not a stable API.

use lockcore::LockError;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// The backend name used in errors and logs.
pub const NAME: &str = "redis";

/// Connection problems, timeouts and a server that is loading, failing over or read-only
/// (a replica after a failover) are [`LockError::Unavailable`]: retrying later may work.
/// So is a Redis Cluster redirection the cluster client gave up following (`MOVED`, `ASK`:
/// slots changing hands during a failover or a migration): by the retry it knows the new
/// owner.
/// Everything else the server or client reports (wrong password, missing permissions,
/// a key of the wrong type, a script error) is [`LockError::Backend`]; a configuration
/// the client refuses (e.g. an unsupported URL option) is [`LockError::Config`].
pub fn map(e: RedisError) -> LockError {
    if e.kind() == ErrorKind::InvalidClientConfig {
        return LockError::config(format!("redis client configuration: {e}"));
    }
    if e.kind() == ErrorKind::AuthenticationFailed {
        return LockError::backend(
            NAME,
            "the server refused the URL's password (or user and password): check them",
        );
    }
    if needs_password(&e) {
        // The server's own `NOAUTH` does not say where the password goes.
        return LockError::backend(
            NAME,
            "the server requires a password (NOAUTH): give it in the URL, \
             redis://:PASSWORD@host/ (or redis://USER:PASSWORD@host/ for an ACL user)",
        );
    }
    if e.is_connection_refusal() {
        // The connection could not be made: the request was never sent.
        LockError::unavailable_unsent(NAME, e)
    } else if is_unavailable(&e) {
        LockError::unavailable(NAME, e)
    } else {
        LockError::backend(NAME, e)
    }
}

/// Whether the server refused `e`'s command (or a command of its pipeline) for want of a
/// password.
fn needs_password(e: &RedisError) -> bool {
    e.clone()
        .into_server_errors()
        .is_some_and(|errors| errors.iter().any(|(_, s)| s.code() == "NOAUTH"))
}

/// Whether `e` means the server could not be reached or did not answer in time.
pub fn is_unavailable(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
        )
}

/// The same failure again, for each renewal of a batch that failed as one request: as
/// retryable as `e`, with its message.
pub fn copy(e: &LockError) -> LockError {
    let message = lockcore::ErrorChain(e).to_string();
    if e.is_retryable() {
        LockError::unavailable(NAME, message)
    } else {
        LockError::backend(NAME, message)
    }
}

/// A request that did not finish within the backend's bound.
pub fn timed_out(what: &str, after: std::time::Duration) -> LockError {
    LockError::unavailable(
        NAME,
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{what} did not finish within {after:?}"),
        ),
    )
}

/// An answer the scripts never give: the key holds something distlock did not write.
pub fn unexpected(what: &str) -> LockError {
    LockError::backend(
        NAME,
        format!("unexpected answer from redis: {what} (is another program writing under the distlock prefix?)"),
    )
}
