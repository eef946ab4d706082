//! Endpoint failover: one etcd-client `Client` per endpoint, rotated on transport errors.
//!
//! etcd-client balances over its endpoint list but does not fail over: with a dead member
//! in the list a call can fail with `Unavailable "tcp connect error"`. Every operation of
//! this driver is idempotent per owner, so a call that failed on one endpoint is sent to
//! the next one, until one answers or the operation's time budget is spent.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};
use futures_util::stream::{FuturesUnordered, StreamExt};
use lockcore::{LockError, RetryPolicy};

use crate::capabilities::NAME;
use crate::config::EtcdConfig;
use crate::error::{classify, Attempt};
use crate::lock;

/// How long a call waits for an answer before it sends the same request to the next
/// endpoint as well.
const HEDGE_AFTER: Duration = Duration::from_millis(300);

/// The pause after a whole round of endpoints failed fast (refused, no leader): 20 ms,
/// doubling up to 250 ms, without jitter.
const ROUND_BACKOFF: RetryPolicy =
    RetryPolicy::doubling(Duration::from_millis(20), Duration::from_millis(250));

/// Copies of one call in flight at most. Hung copies are not cancelled (a follower holds
/// them for seconds during an election), so the cap must leave room for fresh ones: the
/// budget allows `timeout / HEDGE_AFTER` hedges, plus fast retries.
const MAX_IN_FLIGHT: usize = 16;

/// The endpoints of one cluster and the client of each, created on first use.
pub(crate) struct Endpoints {
    cfg: EtcdConfig,
    clients: Vec<Mutex<Option<Client>>>,
    /// How errors name each endpoint: `host:port`.
    labels: Vec<String>,
    /// The endpoint that answered last: calls start there.
    current: AtomicUsize,
}

impl Endpoints {
    pub(crate) fn new(cfg: EtcdConfig) -> Result<Self, LockError> {
        if cfg.endpoints.is_empty() {
            return Err(LockError::config(
                "an etcd backend needs at least one endpoint",
            ));
        }
        let clients = cfg.endpoints.iter().map(|_| Mutex::new(None)).collect();
        let labels = cfg.endpoints.iter().map(|e| label(e)).collect();
        Ok(Endpoints {
            cfg,
            clients,
            labels,
            current: AtomicUsize::new(0),
        })
    }

    /// One endpoint: `client`, made by the application (which balances over its own
    /// endpoints). Errors name `cfg`'s endpoints, or "client" if it lists none.
    pub(crate) fn from_client(cfg: EtcdConfig, client: Client) -> Self {
        let label = if cfg.endpoints.is_empty() {
            "client".to_owned()
        } else {
            cfg.endpoints
                .iter()
                .map(|e| label(e))
                .collect::<Vec<_>>()
                .join(",")
        };
        Endpoints {
            cfg,
            clients: vec![Mutex::new(Some(client))],
            labels: vec![label],
            current: AtomicUsize::new(0),
        }
    }

    pub(crate) fn config(&self) -> &EtcdConfig {
        &self.cfg
    }

    async fn client(&self, i: usize) -> Result<Client, Attempt> {
        let cached = lock(&self.clients[i]).clone();
        if let Some(c) = cached {
            return Ok(c);
        }
        let opts = self.connect_options().map_err(Attempt::Permanent)?;
        let client = Client::connect([self.cfg.endpoints[i].as_str()], Some(opts))
            .await
            .map_err(|e| classify(&self.labels[i], e))?;
        let mut slot = lock(&self.clients[i]);
        Ok(slot.get_or_insert(client).clone())
    }

    fn connect_options(&self) -> Result<ConnectOptions, LockError> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(self.cfg.connect_timeout)
            // A member cut off from the leader refuses requests instead of serving stale
            // reads or holding watches that will never fire.
            .with_require_leader(true)
            // Notices a silently dead connection (a frozen member) on idle watch streams.
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(2));
        if let Some(user) = &self.cfg.user {
            opts = opts
                .with_user(
                    user.clone(),
                    self.cfg
                        .password
                        .as_ref()
                        .map(|p| lockcore::store_url::ExposeSecret::expose_secret(p).to_owned())
                        .unwrap_or_default(),
                )
                // etcd's auth tokens expire (simple tokens after 5 minutes idle): fetch a
                // new one instead of failing every call from then on.
                .with_auto_token_refresh(true);
        }
        if self.cfg.tls {
            opts = tls_options(&self.cfg, opts)?;
        }
        Ok(opts)
    }

    /// Runs `op` on the endpoint that answered last; if it fails, on the next one at once
    /// (backing off after a whole round of failures); if it does not answer within
    /// [`HEDGE_AFTER`], *also* on the next one, keeping the first in flight, and so on
    /// until one answers or [`EtcdConfig::timeout`] has passed.
    ///
    /// Hedging rather than cancelling is what keeps a leader election short for callers: a
    /// follower that has not yet noticed its leader is gone holds forwarded requests until
    /// etcd's own timeout (seconds), while the same request sent a little later, once a new
    /// leader is elected, succeeds at once; and a merely slow answer is not thrown away.
    ///
    /// `op` must be idempotent: the same request may be applied more than once.
    pub(crate) async fn call<T, F, Fut>(&self, what: &'static str, op: F) -> Result<T, LockError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let started = Instant::now();
        let deadline = started + self.cfg.timeout;
        let n = self.clients.len();
        let first = self.current.load(Ordering::Relaxed);
        let op = &op;
        let attempt = |i: usize| async move {
            let result = match self.client(i).await {
                Ok(client) => op(client).await.map_err(|e| classify(&self.labels[i], e)),
                Err(e) => Err(e),
            };
            (i, result)
        };
        let mut pending = FuturesUnordered::new();
        let mut sent = 0usize;
        let mut next_at = started;
        let mut backoff = ROUND_BACKOFF.backoff();
        let mut last = None;
        loop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if now >= next_at && pending.len() < MAX_IN_FLIGHT {
                pending.push(attempt((first + sent) % n));
                sent += 1;
                next_at = now + HEDGE_AFTER;
            }
            let may_launch = pending.len() < MAX_IN_FLIGHT;
            tokio::select! {
                Some((i, result)) = pending.next(), if !pending.is_empty() => match result {
                    Ok(v) => {
                        if i != first {
                            tracing::debug!(endpoint = %self.labels[i], "etcd: switched endpoint");
                            self.current.store(i, Ordering::Relaxed);
                        }
                        return Ok(v);
                    }
                    Err(Attempt::Permanent(e)) => return Err(e),
                    Err(Attempt::Transient(e)) => {
                        tracing::debug!(endpoint = %self.labels[i], op = what, error = %lockcore::ErrorChain(&e), "etcd: endpoint failed");
                        last = Some(e);
                        if pending.is_empty() {
                            // Failed fast (refused, no leader): the next endpoint at once,
                            // but not in a tight loop over a cluster that is down.
                            let now = Instant::now();
                            next_at = if sent.is_multiple_of(n) {
                                // A policy without limits always prescribes a pause.
                                now + backoff.next_pause(now).unwrap_or_default()
                            } else {
                                now
                            };
                        }
                    }
                },
                _ = tokio::time::sleep_until(next_at.into()), if may_launch => {}
                _ = tokio::time::sleep_until(deadline.into()) => break,
            }
        }
        Err(last.unwrap_or_else(|| {
            LockError::unavailable(
                NAME,
                format!(
                    "{what}: no etcd endpoint ({}) answered within {:?}",
                    self.labels.join(", "),
                    self.cfg.timeout
                ),
            )
        }))
    }
}

#[cfg(feature = "tls")]
fn tls_options(cfg: &EtcdConfig, opts: ConnectOptions) -> Result<ConnectOptions, LockError> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let read = |path: &str, what: &str| {
        std::fs::read(path).map_err(|e| {
            LockError::config(format!("cannot read the etcd TLS {what} {path:?}: {e}"))
        })
    };
    let mut tls = TlsOptions::new();
    match &cfg.ca {
        Some(ca) => tls = tls.ca_certificate(Certificate::from_pem(read(ca, "CA file")?)),
        None => return Err(LockError::config(
            "etcd over TLS needs ca=PATH (the PEM of the CA that signed the servers' certificates)",
        )),
    }
    if let Some((cert, key)) = &cfg.identity {
        tls = tls.identity(Identity::from_pem(
            read(cert, "certificate")?,
            read(key, "key")?,
        ));
    }
    if let Some(domain) = &cfg.domain {
        tls = tls.domain_name(domain.clone());
    }
    Ok(opts.with_tls(tls))
}

#[cfg(not(feature = "tls"))]
fn tls_options(_cfg: &EtcdConfig, _opts: ConnectOptions) -> Result<ConnectOptions, LockError> {
    Err(LockError::config(
        "etcd over TLS needs driver-etcd's `tls` feature, which this build does not enable",
    ))
}

/// How errors name an endpoint: `host:port`, without the scheme.
fn label(endpoint: &str) -> String {
    endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest)
        .trim_end_matches('/')
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_back_off_from_20_ms_doubling_to_250_ms_without_jitter() {
        let mut backoff = ROUND_BACKOFF.backoff();
        let now = Instant::now();
        let pauses: Vec<u64> = (0..7)
            .map(|_| backoff.next_pause(now).unwrap().as_millis() as u64)
            .collect();
        assert_eq!(pauses, [20, 40, 80, 160, 250, 250, 250]);
    }
}
