//! PostgreSQL's waiters: one `LISTEN` session per backend, on a connection of its own,
//! waking the backend's waiters one at a time as releases are notified.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::driver::{ReleaseNotifier, WaitHint};
use lockcore::{LockError, LockKey, RetryPolicy};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Pg;
use crate::backend::lock::Store;
use crate::units::micros;
use crate::wait::since::Since;
use crate::wait::Waiting;

/// While the listening session is down, waiters re-check at least this often.
const BLIND_POLL: Duration = Duration::from_millis(100);

/// A `LISTEN` session that has been quiet this long is pinged; one that does not answer
/// the ping within [`LISTEN_PING_TIMEOUT`] is replaced.
const LISTEN_PING: Duration = Duration::from_secs(10);
const LISTEN_PING_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a waiter gives a `LISTEN` session that is not ready yet before polling instead.
const LISTEN_READY: Duration = Duration::from_millis(50);

/// Pauses between attempts to open a lost `LISTEN` session: 10 ms, doubling up to 1 s.
const RECONNECT: RetryPolicy =
    RetryPolicy::doubling(Duration::from_millis(10), Duration::from_secs(1));

/// The `LISTEN` session of one backend, started when something first waits. Waiters are
/// woken by `NOTIFY` on one channel per table, sent by the releasing statement itself, so
/// it is delivered at commit (the backend's own releases included).
pub(crate) struct Listener {
    channel: String,
    notifier: Arc<ReleaseNotifier>,
    ready: watch::Sender<bool>,
    session: Mutex<Option<JoinHandle<()>>>,
    /// Where the session connects (the connect options hold the password).
    options: PgConnectOptions,
    acquire_timeout: Duration,
}

impl std::fmt::Debug for Listener {
    // Not derived: the connect options hold the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// A session on `channel`, connecting with `options` when first needed.
    pub(crate) fn new(
        channel: String,
        options: PgConnectOptions,
        acquire_timeout: Duration,
    ) -> Self {
        let (ready, _) = watch::channel(false);
        Listener {
            channel,
            notifier: Arc::new(ReleaseNotifier::new()),
            ready,
            session: Mutex::new(None),
            options,
            acquire_timeout,
        }
    }

    /// Starts the `LISTEN` session on first use.
    fn ensure_listener(&self) {
        let mut session = self.session.lock().unwrap_or_else(|e| e.into_inner());
        if session.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        // A pool of one connection of its own (by default with the lock pool's connect
        // options): the session is never taken from, or returned to, the lock pool.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_lazy_with(self.options.clone());
        *session = Some(tokio::spawn(listen(
            pool,
            self.channel.clone(),
            self.notifier.clone(),
            self.ready.clone(),
        )));
    }
}

impl Waiting<Pg> for Listener {
    /// Nothing to do: the release's `NOTIFY` wakes this backend's waiters too.
    fn released(&self, _key: &LockKey) {}

    fn notifier(&self) -> &ReleaseNotifier {
        &self.notifier
    }

    async fn wait<'a>(
        &'a self,
        store: &'a Arc<Store<Pg>>,
        key: &'a LockKey,
        hint: &'a WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let since = Since::of(hint);
        // Registered before the key is re-checked, so no release is missed.
        let subscription = self.notifier.subscribe(key, place);
        self.ensure_listener();
        let mut ready = self.ready.subscribe();
        // A session being opened is ready within a few milliseconds; one that is down is
        // not waited for: the key is polled meanwhile.
        let listening = *ready.borrow()
            || tokio::time::timeout(max_wait.min(LISTEN_READY), ready.wait_for(|r| *r))
                .await
                .is_ok_and(|r| r.is_ok());
        let remaining = match store.state(key).await? {
            None if since.changed(None) => return Ok(()),
            // Free but reserved: its owner's grant, or the reservation's removal (a
            // NOTIFY), comes next, unless either happened before we subscribed.
            None if store.still_reserved(key, since.revision).await? => max_wait,
            None => return Ok(()),
            // A lease was released (or granted) since the refusal: try again.
            Some((_, fence, _, _)) if since.changed(Some(fence)) => return Ok(()),
            Some((_, _, remaining, _)) => micros(remaining),
        };
        let mut bound = max_wait.min(remaining + Duration::from_millis(1));
        if !listening {
            bound = bound.min(BLIND_POLL);
        }
        let _ = tokio::time::timeout(bound, subscription.released()).await;
        Ok(())
    }

    /// Stops the session.
    fn stop(&self) {
        let session = self
            .session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(handle) = session {
            handle.abort();
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        Waiting::<Pg>::stop(self);
    }
}

/// The listening session: wakes one local waiter per NOTIFY for its key, and every waiter
/// whenever notifications may have been missed (connected, reconnected).
async fn listen(
    pool: PgPool,
    channel: String,
    notifier: Arc<ReleaseNotifier>,
    ready: watch::Sender<bool>,
) {
    let wake_everyone = || notifier.notify_everyone();
    let mut backoff = RECONNECT.backoff();
    let mut lost_once = false;
    loop {
        let listener = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(&channel).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = match listener.await {
            Ok(listener) => listener,
            Err(e) => {
                tracing::debug!(error = %lockcore::ErrorChain(&e), "postgres LISTEN session cannot connect; retrying");
                backoff.pause().await;
                continue;
            }
        };
        backoff.reset();
        // Waiters that subscribed while no session was listening re-check the key after
        // this (they wait for `ready`); only after a loss can a release have been missed.
        let reconnected = ready.send_replace(true) || lost_once;
        if reconnected {
            wake_everyone();
        }
        loop {
            let received = match tokio::time::timeout(LISTEN_PING, listener.try_recv()).await {
                Ok(received) => received,
                // Quiet for a while: make sure the session is still there. A link that died
                // without a reset would otherwise leave waiters to their holders' TTLs.
                Err(_) => {
                    let ping = sqlx::query("SELECT 1").execute(&mut listener);
                    match tokio::time::timeout(LISTEN_PING_TIMEOUT, ping).await {
                        Ok(Ok(_)) => continue,
                        Ok(Err(e)) => {
                            tracing::debug!(error = %lockcore::ErrorChain(&e), "postgres LISTEN session lost");
                            break;
                        }
                        Err(_) => {
                            tracing::debug!("postgres LISTEN session stopped answering");
                            break;
                        }
                    }
                }
            };
            match received {
                Ok(Some(notification)) => match decode_key(notification.payload()) {
                    Some(key) => notifier.notify_one(&key),
                    None => tracing::debug!("ignoring a malformed lock release notification"),
                },
                // Lost and re-established (sqlx LISTENs again): releases in the gap are
                // unknown.
                Ok(None) => wake_everyone(),
                Err(e) => {
                    tracing::debug!(error = %lockcore::ErrorChain(&e), "postgres LISTEN session lost");
                    break;
                }
            }
        }
        ready.send_replace(false);
        lost_once = true;
        wake_everyone();
    }
}

/// A notification's key (hex-encoded in the payload).
fn decode_key(hex: &str) -> Option<LockKey> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    LockKey::new(String::from_utf8(bytes?).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_through_hex() {
        let key = LockKey::new("a'b%_\\é日").unwrap();
        let hex: String = key.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(decode_key(&hex), Some(key));
        assert_eq!(decode_key("6"), None);
        assert_eq!(decode_key("zz"), None);
        assert_eq!(decode_key("00"), None);
    }
}
