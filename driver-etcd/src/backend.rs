//! The etcd backend: its state, shared by both lock layouts, and how it is built.
//!
//! What each operation does lives in the files below: `plain` (one key per lock) and
//! `fifo` (a queue per lock), both on the shared `leases` and `requests`; the namespace's
//! layout check in `layout`; the `LockBackend` implementation that dispatches by layout in
//! `dispatch`.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use lockcore::driver::Capabilities;
use lockcore::{LockError, LockKey};

use crate::capabilities::{CAPABILITIES, FIFO_CAPABILITIES};
use crate::config::EtcdConfig;
use crate::encoding::lock_key;
use crate::endpoints::Endpoints;
use crate::watch::{QueueWatches, Watches};

mod dispatch;
mod fifo;
mod layout;
mod leases;
mod marks;
mod plain;
mod renewals;
mod requests;

use fifo::places::Places;

/// How many acquire attempts of one backend are in flight at once; more wait here, before
/// anything is sent. Every attempt is a raft write (a transaction with a put, whichever
/// branch runs) and may need a lease grant (another one): 10,000 tasks asking at once for
/// 10,000 keys sent as many of each, and the store answered none within the call timeout.
/// Bounded, the leases of refused attempts come back as spares for the next ones. Releases
/// and renewals never wait here.
const ATTEMPTS_IN_FLIGHT: usize = 64;
use leases::{random_lease_id, Leases};

/// A lock store on an etcd v3 cluster.
///
/// * **Acquire**: a lease (one per hold, TTL in whole seconds, at least the server's
///   minimum) and one transaction that creates the lock key bound to it only if the key
///   does not exist (`create_revision == 0`). The fencing token is the key's
///   `create_revision`: cluster-wide, strictly increasing, unaffected by later writes.
///   Leases freed by releases and failed attempts are kept (up to 64) and reused, so a
///   waiter's retry costs one transaction, not a grant and a revoke.
/// * **Release**: deletes the key in a transaction guarded by the owner's value, so it
///   never frees another owner's lock.
/// * **Renewal of one hold** (each place of the FIFO layout; a plain hold this backend has
///   no record of): the lease keep-alive plus a read showing the key still carries this
///   owner's value and lease — a live lease alone does not prove the key was not
///   force-released and taken again.
/// * **Batched renewals** (plain layout): the first renewal of a hold moves its key onto a
///   lease the backend shares among the holds of one TTL (a put guarded by the holder's
///   value and its own lease); each later batch is one keep-alive of that lease and one
///   read-only transaction of gets per 128 keys. A hold nobody renews stays on its
///   own lease and expires after its TTL; a key whose release failed is deleted before the
///   shared lease is kept alive again.
/// * **Waiting**: one watch per waited-on key, opened at the revision the failed attempt
///   saw, wakes this backend's waiters one at a time on delete.
/// * **Bounded fairness** (plain layout, [`Fairness::Bounded`]): a request that has waited
///   long ([`ClaimRequest::waited`]) marks the lock as its next turn in a key beside it
///   (`lock key + "mark"`: its arrival and owner, on a short lease), which every acquiring
///   transaction compares; the mark's owner, or an earlier arrival, takes the free lock
///   past it.
/// * **Failover**: every call is sent to the endpoint that answered last and on failure to
///   the others in turn, within [`EtcdConfig::timeout`].
/// * **FIFO fairness** ([`EtcdConfig::fair`], per namespace): each contender queues a key
///   of its own under the lock's key (`lock key + hex(backend id) + hex(slot)`, the owner
///   in the value), the first created holds
///   the lock (its create revision is the token), and each waiter is woken only by the
///   deletion of the key just before its own (from one watch of the queue's deletions
///   that the backend's waiters share), keeping its lease alive meanwhile. A grant is always decided by
///   a transaction that sees the contender's own key first, so a waiter whose lease expired
///   while queued is queued again, never granted. A namespace is marked with its layout
///   ([`ensure_layout`](Self::ensure_layout)): plain and FIFO clients never share one.
/// * **Shared claims** (read-write locks, semaphores; FIFO layout only — the plain layout
///   answers them with [`LockError::Config`]): each claim queues a place carrying its
///   weight and capacity; it holds when the weights of every key before it, holding or
///   waiting, leave room for it — so a later reader never overtakes a waiting writer. A
///   waiting claim watches the queue's deletions and wakes when enough of the keys before
///   it are gone. The token is its place's create revision.
///
/// Build it with [`connect`](crate::connect) or [`EtcdBackend::new`].
///
/// [`Fairness::Bounded`]: lockcore::driver::Fairness::Bounded
/// [`ClaimRequest::waited`]: lockcore::driver::ClaimRequest::waited
pub struct EtcdBackend {
    endpoints: Arc<Endpoints>,
    namespace: String,
    caps: Capabilities,
    /// The leases of this backend's holds, and the spare ones it keeps.
    leases: Leases,
    watches: Watches,
    /// FIFO layout: each queue's deletions, watched once for this backend's waiters.
    queue_watches: QueueWatches,
    /// FIFO layout: waiters queue in etcd (see the `fifo` module).
    fair: bool,
    /// FIFO layout: this backend's places in lock queues (held and waiting).
    places: Mutex<Places>,
    /// FIFO layout: names this backend's places (random, so instances never share one).
    backend_id: u64,
    /// Whether the namespace's layout marker was found to match `fair`.
    layout_checked: AtomicBool,
    /// Bounds the acquire attempts in flight (see [`ATTEMPTS_IN_FLIGHT`]).
    attempts: tokio::sync::Semaphore,
    /// Plain layout: the lease marks for long waits are put on (see the `marks` module).
    mark_lease: Mutex<Option<marks::MarkLease>>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.endpoints)
            .field("namespace", &self.namespace)
            .field("fair", &self.fair)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Waits for a turn among the acquire attempts in flight ([`ATTEMPTS_IN_FLIGHT`]).
    /// Cancel safe: nothing is sent before the turn.
    pub(super) async fn attempt_turn(&self) -> Result<tokio::sync::SemaphorePermit<'_>, LockError> {
        self.attempts
            .acquire()
            .await
            .map_err(|_| LockError::Shutdown)
    }

    /// A backend for the cluster `cfg` describes. Connections are made on first use.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] if `cfg` lists no endpoint.
    pub fn new(cfg: EtcdConfig) -> Result<Arc<Self>, LockError> {
        Ok(Self::with_endpoints(Endpoints::new(cfg)?))
    }

    /// A backend that sends every request through `client`, an
    /// [`etcd_client::Client`] the application already has (as the SQL driver takes a
    /// pool and the Redis driver a connection).
    ///
    /// `cfg` supplies the namespace, [`fair`](EtcdConfig::fair) and the per-operation
    /// [`timeout`](EtcdConfig::timeout); its endpoints only name the cluster in errors (an
    /// empty list: `etcd client: …`), and its credentials and TLS options are not used: the
    /// client has its own. The client balances over the endpoints it was given; the
    /// driver's own failover to the next endpoint does not apply, so give the client every
    /// member. Like [`connect`](crate::connect), this checks the namespace's layout
    /// ([`ensure_layout`](Self::ensure_layout)), or leaves that to the first operation if
    /// the cluster does not answer.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] if the namespace is used with the other layout;
    /// [`LockError::Backend`] if etcd refuses the client's credentials for the namespace.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use driver_etcd::{etcd_client::Client, EtcdBackend, EtcdConfig};
    /// use lockcore::LockClient;
    ///
    /// let members = ["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"];
    /// let client = Client::connect(members, None).await?;
    /// let cfg = EtcdConfig::new(members).with_namespace("billing/")?;
    /// let locks = LockClient::new(EtcdBackend::from_client(client, cfg).await?);
    /// let guard = locks.lock("invoice:42").acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn from_client(
        client: etcd_client::Client,
        cfg: EtcdConfig,
    ) -> Result<Arc<Self>, LockError> {
        Self::with_endpoints(Endpoints::from_client(cfg, client))
            .checked()
            .await
    }

    fn with_endpoints(endpoints: Endpoints) -> Arc<Self> {
        let namespace = endpoints.config().namespace.clone();
        let fair = endpoints.config().fair;
        let endpoints = Arc::new(endpoints);
        Arc::new(EtcdBackend {
            watches: Watches::new(endpoints.clone()),
            queue_watches: QueueWatches::new(endpoints.clone()),
            leases: Leases::new(endpoints.clone()),
            endpoints,
            namespace,
            caps: if fair {
                FIFO_CAPABILITIES
            } else {
                CAPABILITIES
            },
            fair,
            places: Mutex::new(Places::default()),
            backend_id: random_lease_id() as u64,
            layout_checked: AtomicBool::new(false),
            attempts: tokio::sync::Semaphore::new(ATTEMPTS_IN_FLIGHT),
            mark_lease: Mutex::new(None),
        })
    }

    /// Whether this backend uses the FIFO layout ([`EtcdConfig::fair`]).
    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// The configuration this backend was built from.
    pub fn config(&self) -> &EtcdConfig {
        self.endpoints.config()
    }

    /// The namespace every key of this backend lives under.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The etcd key a lock is stored under (namespace, escaped key, `/`).
    pub fn etcd_key(&self, key: &LockKey) -> Vec<u8> {
        lock_key(&self.namespace, key)
    }
}
