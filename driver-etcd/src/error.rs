//! What etcd's errors mean to the driver: one line a person can act on ([`cause`]), and
//! whether another endpoint or a later try may succeed ([`classify`]).

use lockcore::LockError;

use crate::capabilities::NAME;

/// Why one attempt failed.
pub(crate) enum Attempt {
    /// Transport trouble, no leader, timeouts: another endpoint (or a later try) may work.
    Transient(LockError),
    /// The store refused the request: retrying cannot help.
    Permanent(LockError),
}

/// The I/O error at the bottom of `e`'s sources, if any (connection refused, reset, …).
fn io_cause(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut found = None;
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            found = Some(io.kind());
        }
        next = err.source();
    }
    found
}

/// What an etcd endpoint said, in one line a person can act on: `connection refused`,
/// `permission denied` (the error it becomes names the endpoint: [`LockError::at`]).
/// etcd-client's own `Display` is a gRPC status dump (`grpc request error: code: '…',
/// message: "…", source: tonic::transport::Error(…)`) and its `source()` repeats it.
fn cause(e: &etcd_client::Error) -> String {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        E::GRpcStatus(status) => {
            // A transport failure under the status: the I/O error says it best.
            if let Some(kind) = std::error::Error::source(status).and_then(io_cause) {
                return kind.to_string();
            }
            let message = status.message().trim_start_matches("etcdserver: ").trim();
            // etcd's message says what happened; the code only where it says more.
            let code = match status.code() {
                Code::PermissionDenied => Some("permission denied"),
                Code::Unauthenticated => Some("not authenticated"),
                _ => None,
            };
            match code {
                _ if message.is_empty() => format!("{}", status.code()).to_lowercase(),
                Some(code) if !message.contains(code) => format!("{code}: {message}"),
                _ => message.to_owned(),
            }
        }
        E::TransportError(t) => match io_cause(t) {
            Some(kind) => kind.to_string(),
            None => format!("transport error: {t}"),
        },
        E::IoError(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// Sorts an etcd-client error from the endpoint `label` into "try elsewhere / later" and
/// "give up".
pub(crate) fn classify(label: &str, e: etcd_client::Error) -> Attempt {
    use etcd_client::Error as E;
    use tonic::Code;
    let unavailable = || LockError::unavailable(NAME, cause(&e)).at(label);
    let failed = || LockError::backend(NAME, cause(&e)).at(label);
    match &e {
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => {
            Attempt::Transient(unavailable())
        }
        E::GRpcStatus(s) => match s.code() {
            // Unavailable: connection refused, no leader, leader changed, request timed out.
            // Unknown: a connection torn down mid-call.
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::Unknown
            | Code::ResourceExhausted => Attempt::Transient(unavailable()),
            _ => Attempt::Permanent(failed()),
        },
        E::InvalidArgs(_) | E::InvalidUri(_) | E::EndpointError(_) => {
            Attempt::Permanent(LockError::config(format!("etcd {label}: {}", cause(&e))))
        }
        _ => Attempt::Permanent(failed()),
    }
}

/// Whether the store said the lease does not exist (expired or revoked).
pub(crate) fn is_lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic::Code::NotFound || s.message().contains("lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("lease not found"),
        _ => false,
    }
}
