//! Waiting for releases: one etcd watch per waited-on key, shared by this backend's
//! waiters, who are woken one at a time (the plain layout), every key's watch on one
//! stream (`stream.rs`); and the FIFO layout's watch of each queue's deletions, shared by
//! the backend's waiters in that queue (`queue.rs`).

mod queue;
mod stream;

pub(crate) use queue::{QueueWaiter, QueueWatches};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{KeyValue, WatchOptions, WatchStream};
use lockcore::driver::{ReleaseNotifier, Subscription};
use lockcore::{LockError, LockKey};

use crate::endpoints::Endpoints;
use stream::{Route, Streams};

/// How long a watch outlives its last waiter, so a waiter that lost the race for a
/// release and waits again does not open a new watch each time.
const LINGER: Duration = Duration::from_secs(2);

/// The watches of one backend.
pub(crate) struct Watches {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Arc<Endpoints>,
    /// The stream every key's watch runs on.
    streams: Streams,
    notifier: ReleaseNotifier,
    entries: Mutex<HashMap<Vec<u8>, Entry>>,
    next_gen: AtomicU64,
    closed: AtomicBool,
    /// The keys whose new watch is being backed by reads (see [`catch_up`]).
    catching_up: AtomicUsize,
}

struct Entry {
    gen: u64,
    /// The first revision the watch reports events from.
    from: i64,
    /// The revision of the latest delete the watch reported.
    last_delete: i64,
    waiters: usize,
    idle_since: Instant,
}

/// What a waiter learns when it registers on a key's watch.
pub(crate) enum Coverage {
    /// A release after the waiter's revision was already seen: try again now.
    Released,
    /// The watch reports every event after the waiter's revision.
    Covered,
    /// The watch started later than the waiter's revision: the waiter must look at the
    /// key itself to learn whether it was released in between.
    Recheck,
}

/// One waiter, subscribed before it re-checks the key.
pub(crate) struct Waiting {
    inner: Arc<Inner>,
    key: LockKey,
    etcd_key: Vec<u8>,
    subscription: Option<Subscription>,
    gen: Option<u64>,
}

impl Watches {
    pub(crate) fn new(endpoints: Arc<Endpoints>) -> Self {
        Watches {
            inner: Arc::new(Inner {
                streams: Streams::new(endpoints.clone()),
                endpoints,
                notifier: ReleaseNotifier::new(),
                entries: Mutex::new(HashMap::new()),
                next_gen: AtomicU64::new(1),
                closed: AtomicBool::new(false),
                catching_up: AtomicUsize::new(0),
            }),
        }
    }

    /// Registers interest in `key` at once, for the waiter at `place` in this process's
    /// line (lower is woken first): no wake-up from this moment on is missed.
    pub(crate) fn subscribe(&self, key: &LockKey, etcd_key: &[u8], place: u64) -> Waiting {
        Waiting {
            subscription: Some(self.inner.notifier.subscribe(key, place)),
            inner: self.inner.clone(),
            key: key.clone(),
            etcd_key: etcd_key.to_vec(),
            gen: None,
        }
    }

    /// This backend deleted `key` at `revision` (a release): wakes one of its waiters now.
    pub(crate) fn released(&self, key: &LockKey, etcd_key: &[u8], revision: i64) {
        self.inner.saw_delete(key, etcd_key, None, revision);
    }

    /// Stops every watch and wakes every waiter.
    pub(crate) fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::Relaxed);
        let inner = self.inner.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { inner.streams.shutdown().await });
        }
        self.inner
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.inner.notifier.notify_everyone();
    }
}

impl Waiting {
    /// Makes sure a watch reports every event after revision `seen` (the revision at which
    /// the waiter saw the key held), opening one if none runs.
    pub(crate) fn watch_from(&mut self, seen: i64) -> Coverage {
        let mut entries = self.inner.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = entries.get_mut(&self.etcd_key) {
            e.waiters += 1;
            self.gen = Some(e.gen);
            if e.last_delete > seen {
                return Coverage::Released;
            }
            return if e.from <= seen + 1 {
                Coverage::Covered
            } else {
                Coverage::Recheck
            };
        }
        let gen = self.inner.next_gen.fetch_add(1, Ordering::Relaxed);
        entries.insert(
            self.etcd_key.clone(),
            Entry {
                gen,
                from: seen + 1,
                last_delete: 0,
                waiters: 1,
                idle_since: Instant::now(),
            },
        );
        self.gen = Some(gen);
        drop(entries);
        tokio::spawn(run(
            self.inner.clone(),
            self.key.clone(),
            self.etcd_key.clone(),
            gen,
            seen + 1,
        ));
        Coverage::Covered
    }

    /// Resolves when a release of the key wakes this waiter.
    pub(crate) async fn released(&mut self) {
        if let Some(s) = self.subscription.take() {
            s.released().await;
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(gen) = self.gen else { return };
        let mut entries = self.inner.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = entries.get_mut(&self.etcd_key) {
            if e.gen == gen {
                e.waiters = e.waiters.saturating_sub(1);
                if e.waiters == 0 {
                    e.idle_since = Instant::now();
                }
            }
        }
    }
}

impl Inner {
    /// Forgets the entry of generation `gen` and wakes every waiter on the key: events may
    /// have been missed, so each must look for itself.
    fn end(&self, key: &LockKey, etcd_key: &[u8], gen: u64) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.get(etcd_key).is_some_and(|e| e.gen == gen) {
            entries.remove(etcd_key);
        }
        drop(entries);
        self.notifier.notify_all(key);
    }

    /// Whether the watch of generation `gen` should keep running.
    fn wanted(&self, etcd_key: &[u8], gen: u64) -> bool {
        if self.closed.load(Ordering::Relaxed) {
            return false;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        match entries.get(etcd_key) {
            Some(e) if e.gen == gen => {
                if e.waiters == 0 && e.idle_since.elapsed() >= LINGER {
                    entries.remove(etcd_key);
                    false
                } else {
                    true
                }
            }
            _ => false,
        }
    }

    /// A delete of the key at `revision`, seen by the watch of generation `gen` (or, with
    /// `gen == None`, made by this backend itself: its waiters need not wait for the watch
    /// to report it).
    fn saw_delete(&self, key: &LockKey, etcd_key: &[u8], gen: Option<u64>, revision: i64) {
        let wake = {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            match entries.get_mut(etcd_key) {
                Some(e) if gen.map_or(true, |g| g == e.gen) => {
                    // Reported once: by our own release or by the watch, whichever is first.
                    let new = revision > e.last_delete;
                    e.last_delete = e.last_delete.max(revision);
                    // Nobody registered: a waiter still on its way learns of the delete from
                    // `last_delete`; a wake-up now would be stored and spent on a waiter of
                    // a later round, which would try in vain.
                    new && e.waiters > 0
                }
                _ => false,
            }
        };
        if wake {
            // One waiter per release: the others would only fail their transaction (each
            // a raft write) and go back to sleep.
            self.notifier.notify_one(key);
        }
    }
}

/// Opens a watch on `key` (with failover, like every call).
async fn open(
    endpoints: &Endpoints,
    key: &[u8],
    options: Option<WatchOptions>,
) -> Result<WatchStream, LockError> {
    endpoints
        .call("watch", |mut c| {
            let key = key.to_vec();
            let options = options.clone();
            async move { c.watch(key, options).await }
        })
        .await
}

/// The key's current version and the revision of the read (with failover, like every
/// call).
async fn get(endpoints: &Endpoints, key: &[u8]) -> Result<(Option<KeyValue>, i64), LockError> {
    endpoints
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

/// Opens a watch on `key` from the store's current revision and waits until the store has
/// registered it: the stream, and the revision it reports events after (which tells whether
/// anything was written since the caller looked); `None` if the watch was cancelled or its
/// stream ended first.
///
/// A watch that starts in the past is served only by a background sync every 100 ms, one
/// at the current revision at once: a caller that needs a prompt wake-up opens it here,
/// then re-checks what changed in between. Even so, etcd reads its current revision just
/// before it registers the watch, and a write in between leaves the watch behind
/// ("unsynced") until the next sync: a watch opened per wait on a busy key is late about
/// once in a thousand, so the watches opened here are shared and kept open.
async fn open_from_now(
    endpoints: &Endpoints,
    key: &[u8],
    options: Option<WatchOptions>,
) -> Result<Option<(WatchStream, i64)>, LockError> {
    let mut stream = open(endpoints, key, options).await?;
    // Registered once the store says so.
    loop {
        match stream.message().await {
            Ok(Some(r)) if r.created() => {
                let at = r.header().map(|h| h.revision()).unwrap_or(i64::MAX);
                return Ok(Some((stream, at)));
            }
            Ok(Some(r)) if r.canceled() => return Ok(None),
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return Ok(None),
        }
    }
}

/// How long a watch may be behind the store after it began: etcd's background sync of
/// unsynced watches runs every 100 ms.
const SYNC_WINDOW: Duration = Duration::from_millis(100);

/// How often the key is read meanwhile.
const SYNC_CHECK: Duration = Duration::from_millis(10);

/// At most this many keys of one backend are read so at once: with thousands of keys
/// waited on together, ten reads each would crowd out the requests themselves. Past it, a
/// watch relies on etcd's sync alone.
const CATCHING_UP_MAX: usize = 8;

/// Reads the key every [`SYNC_CHECK`] for [`SYNC_WINDOW`] after its watch began, reporting
/// a release the watch may not have reported yet; `false` if the watch is no longer
/// wanted.
///
/// etcd registers a watch "from now" at the revision it read just before registering it
/// (`v3rpc/watch.go`); a write in between leaves the watch unsynced, and it gets its events
/// only from the sync every 100 ms. The waiters cannot tell (etcd 3.4 answers a progress
/// request whether or not the watch is synced); what they can tell is that something was
/// written after that revision (`read_at` above `at`), which is when this runs. A release
/// in the window then wakes a waiter within about 10 ms, not up to 100 ms later. A delete
/// reported twice (here and by the watch) wakes once.
async fn catch_up(
    inner: &Arc<Inner>,
    key: &LockKey,
    etcd_key: &[u8],
    gen: u64,
    mut incarnation: Option<i64>,
) -> bool {
    let end = tokio::time::Instant::now() + SYNC_WINDOW;
    while tokio::time::Instant::now() + SYNC_CHECK <= end {
        tokio::time::sleep(SYNC_CHECK).await;
        if !inner.wanted(etcd_key, gen) {
            return false;
        }
        match get(&inner.endpoints, etcd_key).await {
            Ok((Some(kv), _)) => {
                let now = kv.create_revision();
                if let Some(before) = incarnation.filter(|before| now > *before) {
                    // Deleted before its new incarnation was created.
                    inner.saw_delete(key, etcd_key, Some(gen), (now - 1).max(before + 1));
                }
                incarnation = Some(now);
            }
            Ok((None, read_at)) => {
                if incarnation.take().is_some() {
                    inner.saw_delete(key, etcd_key, Some(gen), read_at);
                }
            }
            // The watch still reports; only the early look is lost.
            Err(_) => return true,
        }
    }
    true
}

/// The key's watch, shared by this backend's waiters: reports every delete after revision
/// `from - 1` (the first waiter's look at the key), until no waiter has wanted it for
/// [`LINGER`]. It runs on the backend's shared stream ([`Streams`]); this task registers
/// it, reads what happened before it began, and cancels it when it is no longer wanted.
///
/// It starts at the store's current revision, not at `from`: etcd serves a watch whose
/// start revision is not above its current revision ("unsynced") only from a background
/// loop that runs every 100 ms, so every event of its first 0–100 ms would come that much
/// late, and in a busy hand-off something has nearly always been written since the waiter
/// looked. What happened between `from` and the watch's start is read from the key itself
/// (one `Get`, only when something was written in between).
async fn run(inner: Arc<Inner>, key: LockKey, etcd_key: Vec<u8>, gen: u64, from: i64) {
    // Bounded like any call: the waiters count on this watch until it ends.
    let budget = inner.endpoints.config().timeout;
    let route = Route {
        key: key.clone(),
        etcd_key: etcd_key.clone(),
        gen,
    };
    let registered = tokio::time::timeout(budget, inner.streams.watch(&inner, route))
        .await
        .unwrap_or_else(|_| {
            Err(LockError::unavailable(
                crate::capabilities::NAME,
                format!("watch: not registered within {budget:?}"),
            ))
        });
    let watch = match registered {
        Ok(Some(watch)) => watch,
        Ok(None) => {
            // Its stream ended before it began: the waiters look for themselves.
            inner.end(&key, &etcd_key, gen);
            return;
        }
        Err(e) => {
            tracing::debug!(key = %key, error = %lockcore::ErrorChain(&e), "etcd: cannot open a watch");
            // Not at once: a waiter woken now would only find the store still down.
            tokio::time::sleep(Duration::from_millis(100)).await;
            inner.end(&key, &etcd_key, gen);
            return;
        }
    };
    if watch.at >= from {
        // Written since the first waiter looked: a release in between shows as a missing
        // key or a newer incarnation of it.
        let (incarnation, read_at) = match get(&inner.endpoints, &etcd_key).await {
            Ok((Some(kv), read_at)) => {
                if kv.create_revision() >= from {
                    // Deleted before its new incarnation was created.
                    let deleted_by = (kv.create_revision() - 1).max(from);
                    inner.saw_delete(&key, &etcd_key, Some(gen), deleted_by);
                }
                (Some(kv.create_revision()), read_at)
            }
            Ok((None, read_at)) => {
                inner.saw_delete(&key, &etcd_key, Some(gen), read_at);
                (None, read_at)
            }
            Err(e) => {
                tracing::debug!(key = %key, error = %lockcore::ErrorChain(&e), "etcd: cannot read a watched key");
                inner.streams.cancel(watch).await;
                inner.end(&key, &etcd_key, gen);
                return;
            }
        };
        if read_at > watch.at {
            // A slot among the keys being caught up (none left: etcd's sync, as before).
            let busy = inner.catching_up.fetch_add(1, Ordering::Relaxed) >= CATCHING_UP_MAX;
            let wanted = busy || catch_up(&inner, &key, &etcd_key, gen, incarnation).await;
            inner.catching_up.fetch_sub(1, Ordering::Relaxed);
            if !wanted {
                inner.streams.cancel(watch).await;
                return;
            }
        }
    }
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        if !inner.wanted(&etcd_key, gen) {
            inner.streams.cancel(watch).await;
            return;
        }
    }
}
