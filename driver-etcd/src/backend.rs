//! The etcd backend: leases, one transaction per acquire, create revisions as tokens.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, DeleteOptions, KeyValue, LeaseGrantOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use lockcore::{
    AcquireOutcome, Capabilities, Contention, ExtendOutcome, FencingToken, Grant, LockBackend,
    LockError, LockInfo, LockKey, Owner, OwnerToken, ReleaseOutcome, WaitHint,
};
use tokio::sync::mpsc;

use crate::config::EtcdConfig;
use crate::encoding::{held_by, holder_value, label_of, layout_marker, lock_key};
use crate::endpoints::{is_lease_not_found, Endpoints};
use crate::watch::{Coverage, Watches};
use crate::{CAPABILITIES, FIFO_CAPABILITIES, NAME};

mod fifo;

use fifo::Places;

/// How long a lease grant may go unanswered before the transaction using the lease is
/// sent anyway (the grant is then all but certainly applied first; if not, the
/// transaction is sent again).
const GRANT_HEAD_START: Duration = Duration::from_millis(3);

/// A kept lease refreshed less than `ttl / FRESH_FRACTION` ago is reused without a
/// keep-alive; the hold's validity is then counted from that refresh.
const FRESH_FRACTION: u32 = 10;

/// How many unused leases a backend keeps for later acquisitions.
const MAX_SPARES: usize = 64;

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
/// * **Extend**: the lease keep-alive plus a read showing the key still carries this
///   owner's value and lease — a live lease alone does not prove the key was not
///   force-released and taken again.
/// * **Waiting**: one watch per waited-on key, opened at the revision the failed attempt
///   saw, wakes this backend's waiters one at a time on delete.
/// * **Failover**: every call is sent to the endpoint that answered last and on failure to
///   the others in turn, within [`EtcdConfig::timeout`].
/// * **FIFO fairness** ([`EtcdConfig::fair`], per namespace): each contender queues a key
///   of its own under the lock's key (`lock key + hex(backend id) + hex(slot)`, the owner
///   in the value), the first created holds
///   the lock (its create revision is the token), and each waiter watches only the key
///   just before its own, keeping its lease alive meanwhile. A grant is always decided by
///   a transaction that sees the contender's own key first, so a waiter whose lease expired
///   while queued is queued again, never granted. A namespace is marked with its layout
///   ([`ensure_layout`](Self::ensure_layout)): plain and FIFO clients never share one.
///
/// Build it with [`connect`](crate::connect) or [`EtcdBackend::new`].
pub struct EtcdBackend {
    endpoints: Arc<Endpoints>,
    namespace: String,
    caps: Capabilities,
    /// What this backend knows of the holds it made: the lease of each (key, owner).
    holds: Mutex<Holds>,
    spares: Mutex<Vec<Spare>>,
    watches: Watches,
    /// Leases to revoke in the background (spares beyond [`MAX_SPARES`]).
    janitor: Mutex<Option<mpsc::UnboundedSender<i64>>>,
    /// FIFO layout: waiters queue in etcd (see the `fifo` module).
    fair: bool,
    /// FIFO layout: this backend's places in lock queues (held and waiting).
    places: Mutex<Places>,
    /// FIFO layout: names this backend's places (random, so instances never share one).
    backend_id: u64,
    /// Whether the namespace's layout marker was found to match `fair`.
    layout_checked: AtomicBool,
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

#[derive(Default)]
struct Holds {
    map: HashMap<(LockKey, OwnerToken), LeaseState>,
    sweep_at: usize,
}

/// A lease this backend granted.
#[derive(Clone, Copy, Debug)]
struct LeaseState {
    id: i64,
    /// The TTL the server applied, in seconds.
    ttl: i64,
    /// The TTL that was asked for (a server with a longer minimum applies more): kept
    /// leases are matched to requests by it.
    asked: i64,
    /// When the request that last granted or refreshed it started.
    refreshed: Instant,
}

impl LeaseState {
    fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl.max(0) as u64)
    }

    /// Until when the lease lives at least, on our clock.
    fn alive_until(&self) -> Instant {
        self.refreshed + self.ttl()
    }

    /// The grant of a hold on this lease for a request that started at `started`: a lease
    /// last refreshed before that caps the hold's validity.
    fn grant(&self, token: FencingToken, started: Instant) -> Grant {
        let grant = Grant::new(token, self.ttl());
        if self.refreshed < started {
            grant.with_valid_until(self.alive_until() - lockcore::clock_drift(self.ttl()))
        } else {
            grant
        }
    }
}

type Spare = LeaseState;

/// A lease's remaining TTL as etcd reports it (whole seconds, truncated): the upper end,
/// capped at the granted TTL, so a waiter never wakes before the lease can have expired.
fn remaining_ttl(left: i64, granted: i64) -> Duration {
    Duration::from_secs((left + 1).min(granted.max(left)).max(0) as u64)
}

/// The TTL to ask etcd for: whole seconds, rounded up.
fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// A lease ID of our own choosing, so the grant and the transaction that uses the lease
/// can be sent together (one round trip instead of two).
fn random_lease_id() -> i64 {
    let bytes = OwnerToken::generate();
    let mut id = [0u8; 8];
    id.copy_from_slice(&bytes.as_bytes()[..8]);
    // Positive and non-zero (zero asks the server to choose).
    (i64::from_le_bytes(id) & i64::MAX).max(1)
}

fn header_revision(resp: &TxnResponse) -> i64 {
    resp.header().map(|h| h.revision()).unwrap_or(0)
}

/// The key-value the `or_else` get of a failed transaction returned.
fn failed_get(resp: &TxnResponse) -> Option<KeyValue> {
    resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
        _ => None,
    })
}

fn token_of(kv: &KeyValue) -> FencingToken {
    FencingToken(u64::try_from(kv.create_revision()).unwrap_or(0))
}

/// What the acquiring transaction found.
enum TxnResult {
    Created(TxnResponse),
    Exists(TxnResponse),
    LeaseMissing,
}

/// The outcome of a transaction sent with a lease by [`EtcdBackend::with_lease`].
enum Leased {
    /// The transaction was applied with this lease (which it may or may not have used).
    Done(LeaseState, TxnResult),
    /// The lease turned out to be gone: try again with another.
    Retry,
}

/// The value of the layout marker of each layout (see [`EtcdBackend::ensure_layout`]).
const LAYOUT_PLAIN: &[u8] = b"distlock-layout:plain";
const LAYOUT_FIFO: &[u8] = b"distlock-layout:fifo";

fn layout_name(value: &[u8]) -> &'static str {
    match value {
        LAYOUT_PLAIN => "plain (fair=false)",
        LAYOUT_FIFO => "FIFO (fair=true)",
        _ => "unknown",
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
        crate::checked(Self::with_endpoints(Endpoints::from_client(cfg, client))).await
    }

    fn with_endpoints(endpoints: Endpoints) -> Arc<Self> {
        let namespace = endpoints.config().namespace.clone();
        let fair = endpoints.config().fair;
        let endpoints = Arc::new(endpoints);
        Arc::new(EtcdBackend {
            watches: Watches::new(endpoints.clone()),
            endpoints,
            namespace,
            caps: if fair {
                FIFO_CAPABILITIES
            } else {
                CAPABILITIES
            },
            holds: Mutex::new(Holds::default()),
            spares: Mutex::new(Vec::new()),
            janitor: Mutex::new(None),
            fair,
            places: Mutex::new(Places::default()),
            backend_id: random_lease_id() as u64,
            layout_checked: AtomicBool::new(false),
        })
    }

    /// Whether this backend uses the FIFO layout ([`EtcdConfig::fair`]).
    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// Makes sure the namespace is used with this backend's layout (plain or FIFO), marking
    /// it first if nobody has. The two layouts must never meet on one lock name: a plain
    /// client only looks at the lock's own key, so it would grant a lock a FIFO client
    /// holds through its place in the queue. Every operation calls this once per backend
    /// (a read, plus a create-if-absent transaction the first time a namespace is used);
    /// [`connect`](crate::connect) calls it up front.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] if the namespace is marked for the other layout (or its
    /// marker key holds something else); the store's errors otherwise.
    pub async fn ensure_layout(&self) -> Result<(), LockError> {
        if self.layout_checked.load(Ordering::Acquire) {
            return Ok(());
        }
        let marker = layout_marker(&self.namespace);
        let mine = if self.fair { LAYOUT_FIFO } else { LAYOUT_PLAIN };
        let found = match self.get(&marker).await? {
            (Some(kv), _) => kv.value().to_vec(),
            (None, _) => {
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        marker.clone(),
                        CompareOp::Equal,
                        0,
                    )])
                    .and_then([TxnOp::put(marker.clone(), mine.to_vec(), None)])
                    .or_else([TxnOp::get(marker.clone(), None)]);
                let resp = self.txn("layout check", txn).await?;
                if resp.succeeded() {
                    mine.to_vec()
                } else {
                    failed_get(&resp)
                        .map(|kv| kv.value().to_vec())
                        .unwrap_or_default()
                }
            }
        };
        if found != mine {
            return Err(LockError::config(format!(
                "the etcd namespace {:?} is used with the {} lock layout, but this client is configured for the {} layout: \
                 the two must never be mixed on one namespace (it would break mutual exclusion). \
                 Use the same `fair=` setting for every client of the namespace, or another namespace",
                self.namespace,
                layout_name(&found),
                layout_name(mine),
            )));
        }
        self.layout_checked.store(true, Ordering::Release);
        Ok(())
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

    fn hold(&self, key: &LockKey, owner: &Owner) -> Option<LeaseState> {
        let holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        holds.map.get(&(key.clone(), *owner.token())).copied()
    }

    fn set_hold(&self, key: &LockKey, owner: &Owner, lease: LeaseState) {
        let mut holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        if holds.map.len() >= holds.sweep_at {
            let now = Instant::now();
            holds.map.retain(|_, l| l.alive_until() > now);
            holds.sweep_at = (holds.map.len() * 2).max(1024);
        }
        holds.map.insert((key.clone(), *owner.token()), lease);
    }

    fn take_hold(&self, key: &LockKey, owner: &Owner) -> Option<LeaseState> {
        let mut holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        holds.map.remove(&(key.clone(), *owner.token()))
    }

    /// A kept lease of the same TTL that lives long enough to be worth refreshing.
    fn take_spare(&self, ttl: i64) -> Option<Spare> {
        let now = Instant::now();
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        // Leases that may already have expired are dropped (the server frees them).
        spares.retain(|s| s.refreshed + s.ttl() / 2 > now);
        let i = spares.iter().rposition(|s| s.asked == ttl)?;
        Some(spares.swap_remove(i))
    }

    fn put_spare(&self, spare: Spare) {
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        if spares.len() < MAX_SPARES {
            spares.push(spare);
        } else {
            drop(spares);
            self.revoke_later(spare.id);
        }
    }

    /// Revokes `lease` in the background, one at a time, errors ignored (an unrevoked
    /// lease without keys just expires).
    fn revoke_later(&self, lease: i64) {
        let mut janitor = self.janitor.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = janitor.as_ref() {
            if tx.send(lease).is_ok() {
                return;
            }
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<i64>();
        let _ = tx.send(lease);
        *janitor = Some(tx);
        let endpoints = self.endpoints.clone();
        handle.spawn(async move {
            while let Some(id) = rx.recv().await {
                let _ = revoke(&endpoints, id).await;
            }
        });
    }

    async fn grant(&self, id: i64, ttl: i64) -> Result<i64, LockError> {
        self.endpoints
            .call("lease grant", |mut c| async move {
                match c
                    .lease_grant(ttl, Some(LeaseGrantOptions::new().with_id(id)))
                    .await
                {
                    Ok(r) => Ok(r.ttl()),
                    // Our own earlier attempt, whose answer was lost, already created it.
                    Err(e) if e.to_string().contains("lease already exists") => Ok(0),
                    Err(e) => Err(e),
                }
            })
            .await
            .map(|applied| if applied > 0 { applied } else { ttl })
    }

    /// Refreshes `lease`; `false` if it no longer exists.
    async fn keep_alive(&self, lease: i64) -> Result<bool, LockError> {
        self.endpoints
            .call("lease keep-alive", |mut c| async move {
                match c.lease_keep_alive(lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if is_lease_not_found(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            })
            .await
    }

    /// How long the holder whose key is bound to `lease` has left, for a waiter's blind
    /// timeout: `None` for a key without a lease (not written by this driver: nothing to
    /// count down), zero for a lease that expired since the key was read (the key went with
    /// it).
    pub(super) async fn holder_remaining(&self, lease: i64) -> Result<Option<Duration>, LockError> {
        if lease == 0 {
            return Ok(None);
        }
        Ok(Some(match self.time_to_live(lease).await? {
            Some((left, granted)) => remaining_ttl(left, granted),
            None => Duration::ZERO,
        }))
    }

    /// `(remaining, granted)` TTL of `lease` in seconds; `None` if it is gone.
    async fn time_to_live(&self, lease: i64) -> Result<Option<(i64, i64)>, LockError> {
        self.endpoints
            .call("lease time-to-live", |mut c| async move {
                match c.lease_time_to_live(lease, None).await {
                    Ok(r) if r.ttl() >= 0 => Ok(Some((r.ttl(), r.granted_ttl()))),
                    Ok(_) => Ok(None),
                    Err(e) if is_lease_not_found(&e) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await
    }

    async fn get(&self, key: &[u8]) -> Result<(Option<KeyValue>, i64), LockError> {
        self.endpoints
            .call("get", |mut c| {
                let key = key.to_vec();
                async move {
                    let mut r = c.get(key, None).await?;
                    let rev = r.header().map(|h| h.revision()).unwrap_or(0);
                    Ok((r.take_kvs().into_iter().next(), rev))
                }
            })
            .await
    }

    async fn txn(&self, what: &'static str, txn: Txn) -> Result<TxnResponse, LockError> {
        self.endpoints
            .call(what, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
    }

    /// The acquiring transaction: create the key bound to `lease` if it does not exist,
    /// otherwise read it.
    async fn create_txn(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> Result<TxnResult, LockError> {
        let txn = Txn::new()
            .when([Compare::create_revision(key.to_vec(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.to_vec(),
                value.to_vec(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.to_vec(), None)]);
        self.lease_txn("acquire", txn).await
    }

    /// Sends the transaction `txn(lease_id)` with a lease for a hold of `secs` seconds:
    /// `known` if given (the lease of this owner's queue place), else a kept one, else a new
    /// one. A kept lease not refreshed lately is refreshed alongside the transaction; a new
    /// one is granted with an ID of our own, so the transaction need not wait for the
    /// grant's answer.
    async fn with_lease<F, Fut>(
        &self,
        secs: i64,
        known: Option<LeaseState>,
        txn: F,
    ) -> Result<Leased, LockError>
    where
        F: Fn(i64) -> Fut,
        Fut: Future<Output = Result<TxnResult, LockError>>,
    {
        let started = Instant::now();
        let lease = match known.or_else(|| self.take_spare(secs)) {
            Some(spare) if started < spare.refreshed + spare.ttl() / FRESH_FRACTION => {
                // Refreshed moments ago: the lease's end is known well enough (the grant
                // carries it), and the watchdog refreshes it soon.
                return Ok(match txn(spare.id).await? {
                    TxnResult::LeaseMissing => Leased::Retry,
                    t => Leased::Done(spare, t),
                });
            }
            Some(spare) => spare,
            None => return self.with_new_lease(secs, started, txn).await,
        };
        // Refresh it alongside the transaction: one round trip.
        let (result, alive) = tokio::join!(txn(lease.id), self.keep_alive(lease.id));
        let lease = match alive {
            Ok(true) => LeaseState {
                refreshed: started,
                ..lease
            },
            // Unknown: the lease lives at least until its last known refresh.
            Err(_) => lease,
            Ok(false) => {
                if let Ok(TxnResult::Created(_)) = result {
                    // Bound to a lease that was gone a moment later: the key went with
                    // it. Try again with a fresh lease.
                    tracing::debug!("etcd: lease expired under a new key; retrying");
                }
                return Ok(Leased::Retry);
            }
        };
        Ok(match result? {
            TxnResult::LeaseMissing => Leased::Retry,
            t => Leased::Done(lease, t),
        })
    }

    async fn with_new_lease<F, Fut>(
        &self,
        secs: i64,
        started: Instant,
        txn: F,
    ) -> Result<Leased, LockError>
    where
        F: Fn(i64) -> Fut,
        Fut: Future<Output = Result<TxnResult, LockError>>,
    {
        let id = random_lease_id();
        // The transaction follows the grant without waiting for its answer (our own lease
        // ID makes that possible) once the grant has had a head start: a slow answer then
        // delays the caller, not the store.
        let grant = self.grant(id, secs);
        tokio::pin!(grant);
        let head_start = tokio::select! {
            g = &mut grant => Some(g),
            _ = tokio::time::sleep(GRANT_HEAD_START) => None,
        };
        let (granted, result) = match head_start {
            Some(g) => {
                let applied = g?;
                (Ok(applied), txn(id).await)
            }
            None => tokio::join!(grant, txn(id)),
        };
        let applied = granted?;
        let lease = LeaseState {
            id,
            ttl: applied,
            asked: secs,
            refreshed: started,
        };
        let result = match result {
            // The transaction overtook the grant: send it again.
            Ok(TxnResult::LeaseMissing) => txn(id).await,
            other => other,
        };
        // An error may hide a transaction that was applied (answer lost): lockcore
        // releases by owner; the lease itself expires.
        Ok(match result? {
            TxnResult::LeaseMissing => Leased::Retry,
            t => Leased::Done(lease, t),
        })
    }

    /// Sends `txn`, sorting a missing lease out from other failures.
    async fn lease_txn(&self, what: &'static str, txn: Txn) -> Result<TxnResult, LockError> {
        self.endpoints
            .call(what, |mut c| {
                let txn = txn.clone();
                async move {
                    match c.txn(txn).await {
                        Ok(r) if r.succeeded() => Ok(TxnResult::Created(r)),
                        Ok(r) => Ok(TxnResult::Exists(r)),
                        Err(e) if is_lease_not_found(&e) => Ok(TxnResult::LeaseMissing),
                        Err(e) => Err(e),
                    }
                }
            })
            .await
    }

    /// The granted TTL of a lease we may not have made ourselves.
    async fn lease_state(
        &self,
        lease: i64,
        started: Instant,
    ) -> Result<Option<LeaseState>, LockError> {
        Ok(self
            .time_to_live(lease)
            .await?
            .map(|(_, granted)| LeaseState {
                id: lease,
                ttl: granted,
                asked: granted,
                refreshed: started,
            }))
    }
}

async fn revoke(endpoints: &Endpoints, lease: i64) -> Result<bool, LockError> {
    endpoints
        .call("lease revoke", |mut c| async move {
            match c.lease_revoke(lease).await {
                Ok(_) => Ok(true),
                Err(e) if is_lease_not_found(&e) => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let secs = ttl_secs(self.caps.effective_ttl(ttl)?);
        self.ensure_layout().await?;
        if self.fair {
            return self.fifo_try_acquire(key, owner, secs).await;
        }
        let k = self.etcd_key(key);
        let v = holder_value(owner);
        // A spare lease may expire between our check and the transaction, and a fresh one
        // may be applied after the transaction that uses it: both are retried.
        for _ in 0..4 {
            let started = Instant::now();
            let (lease, created) = match self
                .with_lease(secs, None, |id| self.create_txn(&k, &v, id))
                .await?
            {
                Leased::Done(lease, t) => (lease, t),
                Leased::Retry => continue,
            };
            match created {
                TxnResult::LeaseMissing => continue,
                TxnResult::Created(resp) => {
                    let token = FencingToken(u64::try_from(header_revision(&resp)).unwrap_or(0));
                    self.set_hold(key, owner, lease);
                    return Ok(AcquireOutcome::Acquired(lease.grant(token, started)));
                }
                TxnResult::Exists(resp) => {
                    let revision = header_revision(&resp);
                    let Some(kv) = failed_get(&resp) else {
                        // Cannot happen (the compare saw the key in the same transaction);
                        // try again rather than guess.
                        self.put_spare(lease);
                        continue;
                    };
                    if held_by(kv.value(), owner.token()) && kv.lease() != lease.id {
                        self.put_spare(lease);
                        // Already ours: the same hold again, its lease refreshed (never
                        // shortened).
                        let started = Instant::now();
                        if !self.keep_alive(kv.lease()).await? {
                            continue; // expired just now: the key is gone with it
                        }
                        let known = self.hold(key, owner).filter(|h| h.id == kv.lease());
                        let state = match known {
                            Some(h) => LeaseState {
                                refreshed: started,
                                ..h
                            },
                            None => match self.lease_state(kv.lease(), started).await? {
                                Some(s) => s,
                                None => continue,
                            },
                        };
                        self.set_hold(key, owner, state);
                        return Ok(AcquireOutcome::Acquired(Grant::new(
                            token_of(&kv),
                            state.ttl(),
                        )));
                    }
                    if held_by(kv.value(), owner.token()) {
                        // Our own transaction applied by an earlier try whose answer was lost.
                        self.set_hold(key, owner, lease);
                        return Ok(AcquireOutcome::Acquired(
                            lease.grant(token_of(&kv), started),
                        ));
                    }
                    self.put_spare(lease);
                    let remaining = self.holder_remaining(kv.lease()).await?;
                    return Ok(AcquireOutcome::Held(
                        Contention::new(remaining).with_hint(WaitHint::at_revision(revision)),
                    ));
                }
            }
        }
        Err(LockError::unavailable(
            NAME,
            "leases kept expiring before the lock could be bound to one",
        ))
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.ensure_layout().await?;
        if self.fair {
            return self.fifo_release(key, owner).await;
        }
        let k = self.etcd_key(key);
        let txn = Txn::new()
            .when([Compare::value(
                k.clone(),
                CompareOp::Equal,
                holder_value(owner),
            )])
            .and_then([TxnOp::delete(
                k.clone(),
                Some(DeleteOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(k.clone(), None)]);
        let resp = self.txn("release", txn).await?;
        let hold = self.take_hold(key, owner);
        let released_lease = if resp.succeeded() {
            resp.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Delete(d) => d.prev_kvs().first().map(|kv| kv.lease()),
                _ => None,
            })
        } else {
            match failed_get(&resp) {
                // Same owner token under another label: still this owner's hold.
                Some(kv) if held_by(kv.value(), owner.token()) => {
                    let txn = Txn::new()
                        .when([Compare::mod_revision(
                            k.clone(),
                            CompareOp::Equal,
                            kv.mod_revision(),
                        )])
                        .and_then([TxnOp::delete(k.clone(), None)]);
                    if self.txn("release", txn).await?.succeeded() {
                        Some(kv.lease())
                    } else {
                        None
                    }
                }
                _ => None,
            }
        };
        match released_lease {
            Some(lease) => {
                self.watches.released(key, &k, header_revision(&resp));
                // The lease has no key left: keep it for the next acquisition.
                match hold.filter(|h| h.id == lease) {
                    Some(h) => self.put_spare(h),
                    None => self.revoke_later(lease),
                }
                Ok(ReleaseOutcome::Released)
            }
            None => Ok(ReleaseOutcome::NotHeld),
        }
    }

    async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        _ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        self.ensure_layout().await?;
        if self.fair {
            return self.fifo_extend(key, owner).await;
        }
        let k = self.etcd_key(key);
        let started = Instant::now();
        let known = self.hold(key, owner);
        let (kv, lease) = match known {
            Some(h) => {
                // Both at once: the read proves the key is still ours and bound to this
                // lease; the keep-alive moves the lease's end.
                let (read, alive) = tokio::join!(self.get(&k), self.keep_alive(h.id));
                let (kv, _) = read?;
                let Some(kv) =
                    kv.filter(|kv| held_by(kv.value(), owner.token()) && kv.lease() == h.id)
                else {
                    self.take_hold(key, owner);
                    return Ok(ExtendOutcome::NotHeld);
                };
                if !alive? {
                    self.take_hold(key, owner);
                    return Ok(ExtendOutcome::NotHeld);
                }
                (
                    kv,
                    LeaseState {
                        refreshed: started,
                        ..h
                    },
                )
            }
            None => {
                let (kv, _) = self.get(&k).await?;
                let Some(kv) = kv.filter(|kv| held_by(kv.value(), owner.token())) else {
                    return Ok(ExtendOutcome::NotHeld);
                };
                if !self.keep_alive(kv.lease()).await? {
                    return Ok(ExtendOutcome::NotHeld);
                }
                match self.lease_state(kv.lease(), started).await? {
                    Some(s) => (kv, s),
                    None => return Ok(ExtendOutcome::NotHeld),
                }
            }
        };
        self.set_hold(key, owner, lease);
        Ok(ExtendOutcome::Extended(Grant::new(
            token_of(&kv),
            lease.ttl(),
        )))
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.ensure_layout().await?;
        if self.fair {
            return self.fifo_inspect(key).await;
        }
        let (kv, _) = self.get(&self.etcd_key(key)).await?;
        let Some(kv) = kv else { return Ok(None) };
        let remaining = if kv.lease() == 0 {
            None
        } else {
            match self.time_to_live(kv.lease()).await? {
                Some((left, granted)) => Some(remaining_ttl(left, granted)),
                // Expired since the read: the key went with the lease.
                None => return Ok(None),
            }
        };
        Ok(Some(LockInfo::new(
            label_of(kv.value()),
            token_of(&kv),
            remaining,
        )))
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        if self.fair {
            return self.fifo_wait_released(key, hint, max_wait).await;
        }
        let k = self.etcd_key(key);
        // Subscribed before anything is looked at, so no release from here on is missed.
        let mut waiting = self.watches.subscribe(key, &k);
        let seen = match hint.revision() {
            Some(rev) => rev,
            None => {
                let (kv, rev) = self.get(&k).await?;
                if kv.is_none() {
                    return Ok(());
                }
                rev
            }
        };
        match waiting.watch_from(seen) {
            Coverage::Released => return Ok(()),
            Coverage::Covered => {}
            Coverage::Recheck => {
                // The watch began after `seen`: a release in between shows as a missing key
                // or a newer incarnation of it.
                let (kv, _) = self.get(&k).await?;
                match kv {
                    Some(kv) if kv.create_revision() <= seen => {}
                    _ => return Ok(()),
                }
            }
        }
        let _ = tokio::time::timeout(max_wait, waiting.released()).await;
        Ok(())
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.ensure_layout().await?;
        if self.fair {
            return self.fifo_force_release(key).await;
        }
        let k = self.etcd_key(key);
        for _ in 0..8 {
            let (kv, _) = self.get(&k).await?;
            let Some(kv) = kv else {
                return Ok(ReleaseOutcome::NotHeld);
            };
            let txn = Txn::new()
                .when([Compare::create_revision(
                    k.clone(),
                    CompareOp::Equal,
                    kv.create_revision(),
                )])
                .and_then([TxnOp::delete(k.clone(), None)]);
            if self.txn("force release", txn).await?.succeeded() {
                // The holder's lease had only this key; revoking it makes the holder's
                // renewals fail at once. Never reused: its release and extend now fail.
                if kv.lease() != 0 {
                    let _ = revoke(&self.endpoints, kv.lease()).await;
                }
                return Ok(ReleaseOutcome::Released);
            }
        }
        Err(LockError::unavailable(
            NAME,
            "the lock kept changing hands during force_release",
        ))
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        if self.fair {
            return self.fifo_abandon(key, owner).await;
        }
        Ok(())
    }

    async fn shutdown(&self) {
        self.places
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let spares: Vec<Spare> =
            std::mem::take(&mut *self.spares.lock().unwrap_or_else(|e| e.into_inner()));
        for s in spares {
            let _ = tokio::time::timeout(Duration::from_millis(500), revoke(&self.endpoints, s.id))
                .await;
        }
        self.watches.shutdown();
    }
}
