//! The etcd backend: its state, how it is built, and its [`LockBackend`] implementation.
//! Each operation lives in the file of its role: `queue` takes places, `sets` takes a set's
//! places in one transaction, `release` ends them, `renew` renews them, `wait` waits for
//! the places before one to go.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use lockcore::driver::{
    AcquireOutcome, Capabilities, ClaimRequest, ExtendOutcome, Renewal, SetOutcome, WaitHint,
};
use lockcore::{LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseOutcome};

use crate::capabilities::{CAPABILITIES, NAME};
use crate::config::EtcdConfig;
use crate::encoding::lock_key;
use crate::endpoints::Endpoints;
use crate::leases::{random_lease_id, ttl_secs, Leases};
use crate::lock;
use crate::places::Places;
use crate::watch::QueueWatches;

/// How many acquire attempts of one backend are in flight at once; more wait here, before
/// anything is sent. Every attempt is a raft write (a transaction with a put, whichever
/// branch runs) and may need a lease grant (another one): 10,000 tasks asking at once for
/// 10,000 keys sent as many of each, and the store answered none within the call timeout.
/// Bounded, the leases of refused attempts come back as spares for the next ones. Releases
/// and renewals never wait here.
const ATTEMPTS_IN_FLIGHT: usize = 64;

/// A lock store on an etcd v3 cluster, in the layout of etcd's own lock recipe
/// (`concurrency.Mutex`, `etcdctl lock`).
///
/// * **Places.** Each contender for a lock puts a key of its own under the lock's key
///   (`lock key + hex(backend id) + hex(slot)`, the owner token, its claim and label in
///   the value), bound to a lease. The key with the lowest `create_revision` holds an
///   exclusive lock, and that revision is the fencing token: cluster-wide, strictly
///   increasing, unaffected by later writes.
/// * **Acquire** is one transaction that creates the place if absent and reads the queue
///   before it; the grant is always decided by a transaction (or the place's own watch)
///   that sees the place itself, so a place whose lease expired while it waited is queued
///   again, never granted. Leases come from a pool of spares (up to 64), or are granted
///   with an ID of our own alongside the transaction.
/// * **Shared claims** (read-write locks, semaphores): a place carries its weight and
///   capacity, and holds when the weights of every key before it, holding or waiting,
///   leave room for it — so a later reader never overtakes a waiting writer.
/// * **Waiting**: a waiter watches the deletions in its queue (one watch per queue, shared
///   by this backend's waiters) and is woken when the key just before it goes (exclusive)
///   or when the keys before it have left room (shared), in queue order; its lease is
///   kept alive meanwhile.
/// * **Sets** (`lock_all`): one transaction puts a place in each key's queue, each bound to
///   a lease of its own, if every queue leaves room for it; otherwise it writes nothing and
///   reads the queues, and the set is refused at the first key that does not fit.
/// * **Release** deletes the place in a transaction guarded by the owner's value, so it
///   never frees another owner's lock.
/// * **Batched renewals**: the first renewal of a hold moves its place onto a lease the
///   backend shares among the holds of one TTL (a put guarded by the holder's value and
///   its own lease); each later batch is one keep-alive of that lease and one read-only
///   transaction per 128 places proving each still this owner's. A hold nobody renews
///   stays on its own lease and expires after its TTL; a place whose release failed is
///   deleted before the shared lease is kept alive again.
/// * **Interop**: a key with an empty value under the lock's key (what `etcdctl lock`
///   and Go's `concurrency.Mutex` write) counts as an exclusive place: they exclude
///   distlock's holders of the same name, and distlock excludes theirs.
/// * **Failover**: every call is sent to the endpoint that answered last and on failure to
///   the others in turn, within [`EtcdConfig::timeout`].
///
/// Build it with [`connect`](crate::connect) or [`EtcdBackend::new`].
pub struct EtcdBackend {
    pub(crate) endpoints: Arc<Endpoints>,
    /// The leases of this backend's places, the spare ones, the shared ones.
    pub(crate) leases: Leases,
    /// Each queue's deletions, watched once for this backend's waiters.
    pub(crate) queue_watches: QueueWatches,
    /// This backend's places in lock queues (held and waiting).
    pub(crate) places: Mutex<Places>,
    /// Names this backend's places (random, so instances never share one).
    pub(crate) backend_id: u64,
    /// Bounds the acquire attempts in flight (see [`ATTEMPTS_IN_FLIGHT`]).
    attempts: tokio::sync::Semaphore,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.config().endpoints)
            .field("namespace", &self.namespace())
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
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
    /// `cfg` supplies the namespace and the per-operation
    /// [`timeout`](EtcdConfig::timeout); its endpoints only name the cluster in errors (an
    /// empty list: `etcd client: …`), and its credentials and TLS options are not used: the
    /// client has its own. The client balances over the endpoints it was given; the
    /// driver's own failover to the next endpoint does not apply, so give the client every
    /// member. Like [`connect`](crate::connect), this reads the namespace once, so that
    /// refused credentials show here, or leaves that to the first operation if the cluster
    /// does not answer.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] if etcd refuses the client's credentials for the namespace.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # extern crate lockcore as distlock_core; // the workspace's name for it
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use distlock_etcd::{etcd_client::Client, EtcdBackend, EtcdConfig};
    /// use distlock_core::LockClient;
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
        let endpoints = Arc::new(endpoints);
        Arc::new(EtcdBackend {
            queue_watches: QueueWatches::new(endpoints.clone()),
            leases: Leases::new(endpoints.clone()),
            endpoints,
            places: Mutex::new(Places::default()),
            backend_id: random_lease_id() as u64,
            attempts: tokio::sync::Semaphore::new(ATTEMPTS_IN_FLIGHT),
        })
    }

    /// This backend once one read of its namespace was answered (refused credentials or
    /// permissions show here), or left to the first operation if no endpoint answers.
    pub(crate) async fn checked(self: Arc<Self>) -> Result<Arc<Self>, LockError> {
        let opts = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        match self.range(self.namespace().as_bytes(), opts).await {
            Ok(_) => Ok(self),
            Err(e @ LockError::Unavailable { .. }) => {
                tracing::debug!(error = %lockcore::ErrorChain(&e), "etcd: the first check is left to the first operation");
                Ok(self)
            }
            Err(e) => Err(e),
        }
    }

    /// This backend's places (a short lock: never held across a request).
    pub(crate) fn places(&self) -> MutexGuard<'_, Places> {
        lock(&self.places)
    }

    /// The configuration this backend was built from.
    pub fn config(&self) -> &EtcdConfig {
        self.endpoints.config()
    }

    /// The namespace every key of this backend lives under.
    pub fn namespace(&self) -> &str {
        &self.config().namespace
    }

    /// The etcd key a lock is stored under (namespace, escaped key, `/`).
    pub fn etcd_key(&self, key: &LockKey) -> Vec<u8> {
        lock_key(self.namespace(), key)
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let (key, owner, claim) = (request.key, request.owner, request.claim);
        let secs = ttl_secs(CAPABILITIES.effective_ttl(request.ttl)?);
        // A turn among the attempts in flight; cancel safe: nothing is sent before it.
        let _turn = self
            .attempts
            .acquire()
            .await
            .map_err(|_| LockError::Shutdown)?;
        self.try_claim(key, owner, secs, claim).await
    }

    async fn claim_all(
        &self,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Option<SetOutcome>, LockError> {
        // One turn for the whole set: it is one transaction (see `sets`).
        let _turn = self
            .attempts
            .acquire()
            .await
            .map_err(|_| LockError::Shutdown)?;
        self.claim_set(requests).await
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.release_place(key, owner).await
    }

    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        self.renew_batch(renewals).await
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        self.queue_holders(key).await
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        _place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        // A waiter is woken by the deletions in its queue, in the store's order: its place
        // in this process's line plays no part.
        self.wait_for_turn(key, hint, max_wait).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.break_holders(key).await
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.abandon_place(key, owner).await
    }

    async fn shutdown(&self) {
        self.places().clear();
        self.leases.revoke_spares().await;
        self.queue_watches.shutdown();
    }
}
