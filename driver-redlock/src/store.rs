//! The instances and the state every operation shares ([`Inner`]): each instance's
//! connection, made at first use when it was unreachable at build time; one request on one
//! instance, as a future a round can leave to finish in the background, and a round of one
//! script on the instances; the per-instance timeouts; and the error of a round that too
//! few instances answered.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use driver_redis::__redlock as support;
use driver_redis::redis::{FromRedisValue, ScriptInvocation};
use driver_redis::RedisBackend;
use lockcore::driver::ReleaseNotifier;
use lockcore::store_url::StoreUrl;
use lockcore::LockError;
use tokio::sync::OnceCell;

use crate::announcements::{Announcements, Nonces};
use crate::rounds::{default_instance_timeout, Failures, Round, DEFAULT_UNTIMED_INSTANCE_TIMEOUT};

/// The backend name used in errors and logs.
pub const NAME: &str = "redlock";

/// What every operation of a [`RedlockBackend`](crate::RedlockBackend) shares: the
/// instances, the quorum, the options, and the release bookkeeping.
pub(crate) struct Inner {
    pub(crate) instances: Vec<Instance>,
    pub(crate) quorum: usize,
    pub(crate) prefix: String,
    pub(crate) fencing: bool,
    pub(crate) time_floor: bool,
    pub(crate) instance_timeout: Option<Duration>,
    pub(crate) connect_timeout: Duration,
    pub(crate) tls: Option<TlsFiles>,
    pub(crate) notifier: Arc<ReleaseNotifier>,
    pub(crate) filter: support::MessageFilter,
    pub(crate) announcements: Arc<Announcements>,
    pub(crate) nonces: Nonces,
}

/// The certificates for `rediss://` instances.
#[derive(Clone, Default)]
pub(crate) struct TlsFiles {
    pub(crate) root: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

/// One instance: its URL, and its connection once made.
pub(crate) struct Instance {
    /// `host:port`, for logs and Debug (never the credentials).
    pub(crate) label: String,
    pub(crate) url: StoreUrl,
    pub(crate) backend: OnceCell<Arc<RedisBackend>>,
}

/// `host:port` of an instance URL, without scheme or credentials.
pub(crate) fn label(url: &StoreUrl) -> String {
    match url.endpoints() {
        [one] => one.host_port(6379),
        _ => url.path().to_owned(),
    }
}

impl Inner {
    /// The per-instance timeout for a lock of `ttl`.
    pub(crate) fn timeout_for(&self, ttl: Duration) -> Duration {
        self.instance_timeout
            .unwrap_or_else(|| default_instance_timeout(ttl))
    }

    /// The per-instance timeout of operations without a TTL.
    pub(crate) fn untimed(&self) -> Duration {
        self.instance_timeout
            .unwrap_or(DEFAULT_UNTIMED_INSTANCE_TIMEOUT)
    }

    /// The error for a round that too few instances answered: the first error that
    /// retrying cannot fix (a wrong password, a script error) if there was one, else
    /// [`LockError::QuorumNotReached`] naming each instance that failed and how.
    pub(crate) fn too_few(&self, answered: usize, failures: Failures) -> LockError {
        match failures.first {
            Some(e @ (LockError::Backend { .. } | LockError::Config { .. })) => e,
            _ => LockError::QuorumNotReached {
                got: answered,
                needed: self.quorum,
                failures: failures.each,
                context: None,
            },
        }
    }

    pub(crate) fn redis_builder(&self, url: &StoreUrl) -> driver_redis::RedisBackendBuilder {
        // A round bounds its requests by the per-instance timeout; the connection's own
        // response timeout bounds the stragglers a round leaves to finish in the
        // background, and must not cut a longer per-instance timeout short.
        let response_timeout = self
            .instance_timeout
            .map_or(driver_redis::DEFAULT_RESPONSE_TIMEOUT, |t| {
                t.max(driver_redis::DEFAULT_RESPONSE_TIMEOUT)
            });
        let mut builder = RedisBackend::builder_for(url.clone())
            .prefix(&self.prefix)
            .connect_timeout(self.connect_timeout)
            .response_timeout(response_timeout)
            .shared_release_notifier(self.notifier.clone(), Some(self.filter.clone()));
        if let Some(tls) = &self.tls {
            if let Some(root) = &tls.root {
                builder = builder.tls_root_certificate(root.clone());
            }
            if let Some((cert, key)) = &tls.client {
                builder = builder.tls_client_certificate(cert.clone(), key.clone());
            }
        }
        builder
    }

    /// Instance `i`'s connection, connecting first if it was unreachable so far.
    pub(crate) async fn instance(
        &self,
        i: usize,
        timeout: Duration,
    ) -> Result<Arc<RedisBackend>, LockError> {
        if let Some(b) = self.instances[i].backend.get() {
            return Ok(b.clone());
        }
        // Boxed: the connecting future is large, and every request of every round would
        // otherwise carry (and move) its space, though it is almost never used.
        Box::pin(self.connect(i, timeout)).await
    }

    /// Connects instance `i` (or waits for a connection attempt already under way).
    async fn connect(&self, i: usize, timeout: Duration) -> Result<Arc<RedisBackend>, LockError> {
        let slot = &self.instances[i];
        let connect = slot
            .backend
            .get_or_try_init(|| self.redis_builder(&slot.url).build());
        match tokio::time::timeout(timeout, connect).await {
            Ok(Ok(b)) => Ok(b.clone()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(support::timed_out("connecting", timeout)),
        }
    }

    /// A round of `invocation` on each instance `on` picks ([`op`](Self::op)), all bounded
    /// by one deadline ([`Round`]).
    pub(crate) fn round<T>(
        self: &Arc<Self>,
        what: &'static str,
        timeout: Duration,
        invocation: ScriptInvocation<'static>,
        on: impl Fn(usize) -> bool,
    ) -> Round<impl Future<Output = (usize, Result<T, LockError>)> + Send + 'static>
    where
        T: FromRedisValue + Send + 'static,
    {
        let invocation = Arc::new(invocation);
        let n = self.instances.len();
        let requests = (0..n)
            .filter(|&i| on(i))
            .map(|i| self.op(i, timeout, what, invocation.clone()));
        Round::new(what, timeout, n, requests)
    }

    /// One script on instance `i` (connecting first, within `timeout`, if it was unreachable
    /// so far), as a future that owns everything, so a round's stragglers can finish in the
    /// background. A round builds its invocation once and shares it among its instances.
    pub(crate) fn op<T>(
        self: &Arc<Self>,
        i: usize,
        timeout: Duration,
        what: &'static str,
        invocation: Arc<ScriptInvocation<'static>>,
    ) -> (
        usize,
        impl Future<Output = (usize, Result<T, LockError>)> + Send + 'static,
    )
    where
        T: FromRedisValue + Send + 'static,
    {
        let inner = self.clone();
        let request = async move {
            let result = match inner.instance(i, timeout).await {
                Ok(backend) => backend.run_script::<T>(what, &invocation).await,
                Err(e) => Err(e),
            };
            (i, result)
        };
        (i, request)
    }
}
