//! This backend's nodes in lock queues (its places): creating one (or finding it again
//! after a lost answer), the claim that reads the queue, a hold's own TTL and its expiry,
//! and removing a place.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use lockcore::driver::{AcquireOutcome, ClaimRequest, Contention, Grant, WaitHint};
use lockcore::{FencingToken, LockError, LockKey, Owner};
use zookeeper_client::{Client, CreateMode, Error as ZkError, SessionId};

use crate::capabilities::NAME;
use crate::config::ZkConfig;
use crate::session::{same_session, Session};
use crate::store::{key_path, node_prefix, Node, Queue};

/// What the backend's operations and its expiry tasks share.
pub(crate) struct Inner {
    pub session: Session,
    /// This backend's nodes, by (key node, owner token).
    places: Mutex<HashMap<PlaceKey, Place>>,
    /// Keys of the hash that turns an owner token into the id in its node's name: the id
    /// finds the node again, and never shows the token.
    ids: (std::hash::RandomState, std::hash::RandomState),
    /// Key nodes this backend has seen exist. A claim on any other key creates the key's
    /// node in the same round trip as its own (it is needed anyway), so a first claim is
    /// applied by its first request. Forgotten when it grows past [`SEEN_KEYS`].
    seen: Mutex<std::collections::HashSet<String>>,
}

/// How many key nodes a backend remembers having seen.
const SEEN_KEYS: usize = 4096;

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkBackend")
            .field("servers", &self.session.cfg().place())
            .field("root", &self.session.cfg().root)
            .finish_non_exhaustive()
    }
}

pub(crate) type PlaceKey = (String, [u8; 16]);

/// One node of this backend's: a claim waiting or held.
#[derive(Clone, Debug)]
pub(crate) struct Place {
    /// The node's full path.
    pub path: String,
    /// Its sequence number.
    pub seq: i64,
    /// Its `czxid`: the fencing token once it holds.
    pub token: u64,
    /// The session that created it (and whose end deletes it).
    pub session: SessionId,
    /// When it holds: when its TTL runs out and the backend deletes it.
    pub held_until: Option<Instant>,
}

/// Locks `m`; a panic elsewhere while it was held does not make the map unusable: every
/// critical section leaves it consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    /// Forgets every place (at shutdown: the session's end deletes the nodes).
    pub fn forget_all(&self) {
        lock(&self.places).clear();
    }

    pub fn new(cfg: ZkConfig) -> Self {
        Inner {
            session: Session::new(cfg),
            places: Mutex::new(HashMap::new()),
            ids: Default::default(),
            seen: Mutex::new(Default::default()),
        }
    }

    pub fn place_key(&self, key: &LockKey, owner: &Owner) -> PlaceKey {
        (
            key_path(&self.session.cfg().root, key),
            *owner.token().as_bytes(),
        )
    }

    pub fn place(&self, pk: &PlaceKey) -> Option<Place> {
        lock(&self.places).get(pk).cloned()
    }

    pub fn set_place(&self, pk: &PlaceKey, place: Place) {
        lock(&self.places).insert(pk.clone(), place);
    }

    /// Forgets `pk`'s place if it is still the node at `path`.
    pub fn forget(&self, pk: &PlaceKey, path: &str) {
        let mut places = lock(&self.places);
        if places.get(pk).is_some_and(|p| p.path == path) {
            places.remove(pk);
        }
    }

    /// Updates `pk`'s place at `path` with `f`; `None` if it is no longer there.
    pub fn update<T>(
        &self,
        pk: &PlaceKey,
        path: &str,
        f: impl FnOnce(&mut Place) -> T,
    ) -> Option<T> {
        lock(&self.places)
            .get_mut(pk)
            .filter(|p| p.path == path)
            .map(f)
    }

    /// The id in the names of `owner`'s nodes: a keyed hash of its token, shaped as a UUID
    /// as Curator's are.
    fn owner_id(&self, owner: &Owner) -> String {
        let token = owner.token().as_bytes();
        let (a, b) = (self.ids.0.hash_one(token), self.ids.1.hash_one(token));
        format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xffff,
            b >> 48,
            b & 0xffff_ffff_ffff
        )
    }

    /// The children of `path` (none if the key's node does not exist).
    pub async fn children(&self, client: &Client, path: &str) -> Result<Vec<String>, LockError> {
        match self
            .session
            .run("listing a lock's queue", path, async {
                match client.list_children(path).await {
                    Err(ZkError::NoNode) => Ok(Vec::new()),
                    other => other,
                }
            })
            .await
        {
            Ok(children) => Ok(children),
            Err(e) => Err(e),
        }
    }

    /// Deletes the node at `path`: `true` if it was there.
    pub async fn delete(&self, client: &Client, path: &str) -> Result<bool, LockError> {
        self.session
            .run("deleting a node", path, async {
                match client.delete(path, None).await {
                    Ok(()) => Ok(true),
                    Err(ZkError::NoNode) => Ok(false),
                    Err(e) => Err(e),
                }
            })
            .await
    }

    /// Creates `owner`'s ephemeral sequential node for `claim` under `kp`, creating the
    /// key's container node (and the root) when missing.
    async fn create(
        &self,
        client: &Client,
        kp: &str,
        prefix: &str,
        owner: &Owner,
        ttl: Duration,
        parent_first: bool,
    ) -> Result<Place, LockError> {
        // The hold's TTL (as first granted) before the label: what `holders` shows as the
        // remaining TTL, the longest a hold lasts unrenewed.
        let data = format!(
            "{} {}",
            ttl.min(client.session_timeout()).as_millis(),
            owner.label()
        );
        let acls = self.session.acls();
        let path = format!("{kp}/{prefix}");
        let root = self.session.cfg().root.clone();
        let mut parent = parent_first || !lock(&self.seen).contains(kp);
        for _ in 0..3 {
            let created = self
                .session
                .run("creating a claim", &path, async {
                    // The key's node is a container: the servers delete it once it has no
                    // children. After a refusal for its absence (or an attempt whose
                    // answers were lost) it is created in the same round trip as the claim:
                    // requests leave in the order they are made.
                    let container = CreateMode::Container.with_acls(acls);
                    let mode = CreateMode::EphemeralSequential.with_acls(acls);
                    let (made, child) = if parent {
                        let made = client.create(kp, &[], &container);
                        let child = client.create(&path, data.as_bytes(), &mode);
                        let (made, child) = tokio::join!(made, child);
                        (made.map(|_| ()), child)
                    } else {
                        (Ok(()), client.create(&path, data.as_bytes(), &mode).await)
                    };
                    match (made, child) {
                        (_, Ok(created)) => Ok(Some(created)),
                        (Err(ZkError::NoNode), _) => {
                            let dir = CreateMode::Persistent.with_acls(acls);
                            client.mkdir(&root, &dir).await.map(|()| None)
                        }
                        (_, Err(ZkError::NoNode)) => Ok(None),
                        (_, Err(e)) => Err(e),
                    }
                })
                .await?;
            if let Some((stat, seq)) = created {
                let mut seen = lock(&self.seen);
                if seen.len() >= SEEN_KEYS {
                    seen.clear();
                }
                seen.insert(kp.to_owned());
                return Ok(Place {
                    path: format!("{path}{seq}"),
                    seq: seq.into_i64(),
                    token: token_of(stat.czxid),
                    session: client.session_id(),
                    held_until: None,
                });
            }
            parent = true;
        }
        Err(LockError::backend(
            NAME,
            format!("the node {kp} kept vanishing while a claim was created under it"),
        ))
    }

    /// Grants `place` (at `pk`) for `ttl` from `start`, never shortening it; starts its
    /// expiry on first grant. Answers the TTL granted, counted from `start`.
    pub fn hold(
        self: &Arc<Self>,
        pk: &PlaceKey,
        place: &Place,
        start: Instant,
        ttl: Duration,
        session_timeout: Duration,
    ) -> Option<Duration> {
        let until = start + ttl.min(session_timeout);
        let (first, until) = self.update(pk, &place.path, |p| {
            let first = p.held_until.is_none();
            let until = p.held_until.map_or(until, |old| old.max(until));
            p.held_until = Some(until);
            (first, until)
        })?;
        if first {
            tokio::spawn(expire(Arc::downgrade(self), pk.clone(), place.path.clone()));
        }
        Some(until.saturating_duration_since(start))
    }

    pub async fn claim(
        self: &Arc<Self>,
        request: &ClaimRequest<'_>,
    ) -> Result<AcquireOutcome, LockError> {
        // A node deleted behind our back between creating (or finding) it and reading the
        // queue: the claim queues again, once. An answer lost with its connection while
        // the session lives (the client reconnects): the claim is sent again within the
        // operation timeout; it finds its node by the owner's id.
        let deadline = Instant::now() + self.session.cfg().timeout;
        let (mut vanished, mut retry) = (0, false);
        loop {
            match self.claim_once(request, retry).await {
                Ok(Some(outcome)) => return Ok(outcome),
                Ok(None) if vanished == 0 => vanished += 1,
                Ok(None) => {
                    return Err(LockError::unavailable(
                        NAME,
                        "the claim's node was deleted twice while it was being taken",
                    ))
                }
                Err(e)
                    if e.is_retryable()
                        && Instant::now() < deadline
                        && self.session.current().await.is_some() =>
                {
                    retry = true;
                    // A pause, so a client that fails at once while it reconnects is not
                    // asked in a loop.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn claim_once(
        self: &Arc<Self>,
        request: &ClaimRequest<'_>,
        retry: bool,
    ) -> Result<Option<AcquireOutcome>, LockError> {
        let start = Instant::now();
        let client = self.session.client().await?;
        let pk = self.place_key(request.key, request.owner);
        let kp = pk.0.clone();
        let id = self.owner_id(request.owner);
        // A place of an earlier session is gone with it; one whose TTL ran out is deleted
        // here (its expiry may not have run yet) so it is never granted again: either way
        // the claim starts again, with a new node and so a new token.
        let known = match self.place(&pk) {
            Some(p) if !same_session(&client, p.session) => None,
            Some(p) if p.held_until.is_some_and(|t| t <= start) => {
                self.forget(&pk, &p.path);
                self.delete(&client, &p.path).await?;
                None
            }
            other => other,
        };
        let mut place = match known {
            Some(p) => p,
            None => {
                let p = self
                    .create(
                        &client,
                        &kp,
                        &node_prefix(&id, &request.claim),
                        request.owner,
                        request.ttl,
                        retry,
                    )
                    .await?;
                self.set_place(&pk, p.clone());
                p
            }
        };
        let queue = Queue::new(&self.children(&client, &kp).await?);
        let Some(at) = queue
            .nodes
            .iter()
            .position(|n| n.id.as_deref() == Some(id.as_str()))
        else {
            self.forget(&pk, &place.path);
            return Ok(None);
        };
        let earliest = &queue.nodes[at];
        if !place.path.ends_with(&earliest.name) {
            // An earlier node of ours whose answer was lost: keep that place in the line,
            // drop the newer one.
            place = self.adopt(&client, &pk, &place, earliest).await?;
        }
        if let Some(capacity) = queue.mismatch(&request.claim, &id) {
            if place.held_until.is_none() {
                self.delete(&client, &place.path).await?;
                self.forget(&pk, &place.path);
            }
            return Err(LockError::capacity_mismatch(
                request.key,
                capacity,
                &request.claim,
            ));
        }
        if !queue.granted(at) {
            return Ok(Some(AcquireOutcome::Held(Contention::new(None).with_hint(
                WaitHint::at_revision(place.seq).with_reservation(true),
            ))));
        }
        // `None`: expired between the read and now; claim again.
        Ok(self
            .hold(&pk, &place, start, request.ttl, client.session_timeout())
            .map(|ttl| AcquireOutcome::Acquired(Grant::new(FencingToken(place.token), ttl))))
    }

    /// Takes `earliest` (an older node of ours) as the place, deleting `newer`.
    async fn adopt(
        &self,
        client: &Client,
        pk: &PlaceKey,
        newer: &Place,
        earliest: &Node,
    ) -> Result<Place, LockError> {
        let path = format!("{}/{}", pk.0, earliest.name);
        let stat = self
            .session
            .run("reading a claim", &path, client.check_stat(&path))
            .await?;
        let Some(stat) = stat else {
            return Ok(newer.clone());
        };
        self.delete(client, &newer.path).await?;
        let place = Place {
            path,
            seq: earliest.seq,
            token: token_of(stat.czxid),
            session: client.session_id(),
            held_until: None,
        };
        self.set_place(pk, place.clone());
        Ok(place)
    }

    /// Deletes `owner`'s node of `key`: the known place, or (after a lost answer, or a
    /// place of an earlier session) any node with the owner's id. Answers whether a node
    /// that held was deleted.
    pub async fn remove(
        &self,
        key: &LockKey,
        owner: &Owner,
        only_waiting: bool,
    ) -> Result<bool, LockError> {
        let pk = self.place_key(key, owner);
        let client = self.session.client().await?;
        if let Some(place) = self.place(&pk) {
            if !same_session(&client, place.session) {
                // Deleted with its session.
                self.forget(&pk, &place.path);
                return Ok(false);
            }
            let held = place.held_until.is_some_and(|t| t > Instant::now());
            if only_waiting && place.held_until.is_some() {
                return Ok(false);
            }
            let deleted = self.delete(&client, &place.path).await?;
            self.forget(&pk, &place.path);
            return Ok(deleted && held);
        }
        let id = self.owner_id(owner);
        let queue = Queue::new(&self.children(&client, &pk.0).await?);
        let mut released = false;
        for (i, node) in queue.nodes.iter().enumerate() {
            if node.id.as_deref() == Some(id.as_str()) && !(only_waiting && queue.granted(i)) {
                let deleted = self
                    .delete(&client, &format!("{}/{}", pk.0, node.name))
                    .await?;
                released |= deleted && queue.granted(i);
            }
        }
        Ok(released)
    }
}

/// A `czxid` as a token (zxids are positive).
pub(crate) fn token_of(czxid: i64) -> u64 {
    u64::try_from(czxid).unwrap_or(0)
}

/// Deletes the node at `path` once its TTL has run out unrenewed, unless it was released
/// first: a hold nobody renews ends after its TTL even while the session lives.
async fn expire(inner: Weak<Inner>, pk: PlaceKey, path: String) {
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let Some(until) = strong
            .place(&pk)
            .filter(|p| p.path == path)
            .and_then(|p| p.held_until)
        else {
            return;
        };
        drop(strong);
        if Instant::now() < until {
            tokio::time::sleep_until(until.into()).await;
            continue;
        }
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let Some(place) = strong.place(&pk).filter(|p| p.path == path) else {
            return;
        };
        strong.forget(&pk, &path);
        // Until the delete goes through or the session that owns the node is gone.
        loop {
            match strong.session.current().await {
                Some(client) if same_session(&client, place.session) => {
                    if strong.delete(&client, &path).await.is_ok() {
                        return;
                    }
                }
                _ => return,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
