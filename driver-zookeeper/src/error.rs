//! What ZooKeeper's errors mean to the driver: retryable (the connection, a timeout, a
//! session that has to be opened again) or a line to act on (refused credentials, a path
//! the ACL forbids).

use lockcore::LockError;
use zookeeper_client::Error as ZkError;

use crate::capabilities::NAME;

/// `e` from an operation on `path`, as a [`LockError`] naming `place` (the servers).
pub(crate) fn to_lock_error(e: ZkError, path: &str, place: &str) -> LockError {
    match e {
        ZkError::ConnectionLoss
        | ZkError::Timeout
        | ZkError::NoHosts
        | ZkError::SessionExpired
        | ZkError::SessionMoved
        | ZkError::Throttled
        | ZkError::NotReadOnly
        | ZkError::ClientClosed
        // The client's own transport failures: I/O errors, a silent connection.
        | ZkError::Custom(_) => LockError::unavailable(NAME, e).at(place),
        ZkError::NoAuth => LockError::backend(
            NAME,
            format!(
                "not authorised for {path}: the node's ACL refuses this user (give the URL \
                 the user:password that created it, or an operator must change its ACL)"
            ),
        )
        .at(place),
        ZkError::AuthFailed => LockError::backend(
            NAME,
            "ZooKeeper refused the credentials (check the user and password in the URL)",
        )
        .at(place),
        other => LockError::backend(NAME, format!("{other} (at {path})")).at(place),
    }
}

/// A time limit passed before the servers answered `what`.
pub(crate) fn timed_out(what: &str, place: &str) -> LockError {
    LockError::unavailable(NAME, format!("no answer to {what} in time")).at(place)
}
