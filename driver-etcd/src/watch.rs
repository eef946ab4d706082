//! Waiting for releases: one watch of a lock queue's deletions per backend, shared by the
//! backend's waiters in that queue and kept open while they come and go.
//!
//! A watch per wait was opened at every hand-off, and etcd registers a watch that starts
//! "now" at the revision it read just before registering it: when a write lands between
//! the two (a hand-off every millisecond or so makes that about one watch in a thousand),
//! the watch starts "unsynced" and gets its events only from the store's background sync,
//! which runs every 100 ms. That waiter then learned of its predecessor's release 0–100 ms
//! late, and the whole queue waited with it. A watch that stays open is registered once
//! per queue (while its waiters keep coming back), and its events come as writes apply.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{EventType, WatchResponse};
use lockcore::LockError;
use tokio::sync::{broadcast, OnceCell};

use crate::endpoints::Endpoints;
use crate::lock;
use stream::{Registered, Streams};

mod stream;

/// How long a watch outlives its last waiter, so a waiter that lost the race for a
/// release and waits again does not open a new watch each time.
const LINGER: Duration = Duration::from_secs(2);

/// How many deletion batches a waiter may fall behind before it is told to look again.
/// Each queue's watch keeps this many slots, and lockcore sends one waiting request per key
/// and client, so a watch has a waiter or two: more slots would cost memory on every
/// waited-on key (256 of them about 11 KB; lockbench `etcd --case scale_waiters` on 10,000
/// keys shows it), and a waiter that falls behind only reads the queue again.
const BACKLOG: usize = 16;

/// The queue watches of one backend.
pub(crate) struct QueueWatches {
    inner: Arc<Inner>,
}

struct Inner {
    /// The one stream every queue's watch runs on.
    streams: Streams,
    /// By queue prefix: the watch being opened or running.
    slots: Mutex<HashMap<Vec<u8>, Arc<Slot>>>,
    closed: AtomicBool,
}

/// A queue's watch: opened once by whichever waiter comes first (`None`: the store
/// cancelled it at once).
type Slot = OnceCell<Option<Arc<Running>>>;

/// A running watch of a queue's deletions.
struct Running {
    tx: broadcast::Sender<Message>,
    state: Mutex<State>,
}

struct State {
    /// Every deletion up to this revision has been passed on to the waiters subscribed
    /// then.
    delivered: i64,
    /// No more deletions will be passed on.
    ended: bool,
}

#[derive(Clone)]
enum Message {
    /// The keys deleted, each with the revision of its deletion.
    Deleted(Arc<[(Vec<u8>, i64)]>),
    /// The watch ended: whoever still listens must look for itself.
    Ended,
}

impl Running {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Ends the watch (the store cancelled it, its stream ended, or nobody listens):
    /// whoever subscribed before looks for itself, as events may have been missed.
    fn end(&self) {
        let mut state = self.state();
        if !state.ended {
            state.ended = true;
            let _ = self.tx.send(Message::Ended);
        }
    }

    /// An answer of the watch: its events, and the revision they bring it to.
    fn answer(&self, resp: &WatchResponse) {
        let deleted: Vec<(Vec<u8>, i64)> = resp
            .events()
            .iter()
            .filter(|ev| ev.event_type() == EventType::Delete)
            .filter_map(|ev| ev.kv().map(|kv| (kv.key().to_vec(), kv.mod_revision())))
            .collect();
        let rev = resp.header().map_or(0, |h| h.revision());
        // Under the state's lock: a waiter subscribing now either gets this message or
        // sees `delivered` past it.
        let mut state = self.state();
        if state.ended {
            return;
        }
        if !deleted.is_empty() {
            let _ = self.tx.send(Message::Deleted(deleted.into()));
        }
        state.delivered = state.delivered.max(rev);
    }
}

/// One waiter on a queue's watch.
pub(crate) struct QueueWaiter {
    rx: broadcast::Receiver<Message>,
    /// Deletions up to this revision happened before the waiter subscribed and will not
    /// be passed on to it: a waiter that saw the queue at an earlier revision must read it
    /// again.
    pub(crate) delivered: i64,
}

impl QueueWaiter {
    /// The keys of the next deletions after revision `from` (those up to it are already
    /// known to the waiter, from its own read); `None` when the watch can tell no more
    /// (ended, or the waiter fell too far behind): look again.
    pub(crate) async fn deleted_after(&mut self, from: i64) -> Option<Vec<Vec<u8>>> {
        loop {
            match self.rx.recv().await {
                Ok(Message::Deleted(keys)) => {
                    let keys: Vec<Vec<u8>> = keys
                        .iter()
                        .filter(|(_, rev)| *rev > from)
                        .map(|(k, _)| k.clone())
                        .collect();
                    if !keys.is_empty() {
                        return Some(keys);
                    }
                }
                Ok(Message::Ended) | Err(_) => return None,
            }
        }
    }
}

impl QueueWatches {
    pub(crate) fn new(endpoints: Arc<Endpoints>) -> Self {
        QueueWatches {
            inner: Arc::new(Inner {
                streams: Streams::new(endpoints),
                slots: Mutex::default(),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// Subscribes to the deletions under `prefix` (a lock's queue), opening the watch if
    /// none runs; `None` if the store cancelled it at once.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a watch being opened is finished by the next waiter.
    pub(crate) async fn subscribe(&self, prefix: &[u8]) -> Result<Option<QueueWaiter>, LockError> {
        // Twice: a watch found ending makes way for a new one.
        for _ in 0..2 {
            if self.inner.closed.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let slot = {
                let mut slots = lock(&self.inner.slots);
                slots.entry(prefix.to_vec()).or_default().clone()
            };
            let opened = slot
                .get_or_try_init(|| open(&self.inner, prefix, &slot))
                .await?;
            if let Some(running) = opened {
                let state = running.state();
                if !state.ended {
                    return Ok(Some(QueueWaiter {
                        rx: running.tx.subscribe(),
                        delivered: state.delivered,
                    }));
                }
            }
            self.inner.forget(prefix, &slot);
        }
        Ok(None)
    }

    /// Stops every watch and closes the stream; their waiters look for themselves.
    pub(crate) fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::Relaxed);
        let slots = std::mem::take(&mut *lock(&self.inner.slots));
        for slot in slots.values() {
            if let Some(Some(running)) = slot.get() {
                running.end();
            }
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let inner = self.inner.clone();
            handle.spawn(async move { inner.streams.shutdown().await });
        }
    }
}

impl Inner {
    /// Removes `slot` from the map if it is still the one there.
    fn forget(&self, prefix: &[u8], slot: &Arc<Slot>) {
        let mut slots = lock(&self.slots);
        if slots.get(prefix).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            slots.remove(prefix);
        }
    }
}

/// Opens the watch of `slot` on the backend's stream, from the store's current revision.
async fn open(
    inner: &Arc<Inner>,
    prefix: &[u8],
    slot: &Arc<Slot>,
) -> Result<Option<Arc<Running>>, LockError> {
    let running = Arc::new(Running {
        tx: broadcast::channel(BACKLOG).0,
        state: Mutex::new(State {
            delivered: 0,
            ended: false,
        }),
    });
    let Some(registered) = inner.streams.watch(prefix, running.clone()).await? else {
        return Ok(None);
    };
    {
        let mut state = running.state();
        state.delivered = state.delivered.max(registered.at);
    }
    tokio::spawn(linger(
        Arc::downgrade(inner),
        prefix.to_vec(),
        slot.clone(),
        running.clone(),
        registered,
    ));
    Ok(Some(running))
}

/// Keeps a queue's watch until it ends or nobody has listened for [`LINGER`]; then
/// cancels it and forgets it.
async fn linger(
    inner: Weak<Inner>,
    prefix: Vec<u8>,
    slot: Arc<Slot>,
    running: Arc<Running>,
    registered: Registered,
) {
    let half = LINGER / 2;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + half, half);
    let mut idle = 0u32;
    loop {
        tick.tick().await;
        if running.state().ended {
            break;
        }
        idle = if running.tx.receiver_count() == 0 {
            idle + 1
        } else {
            0
        };
        // Idle at two ticks in a row: nobody for at least half of LINGER.
        if idle >= 2 {
            break;
        }
    }
    // Ended under the state's lock, so nobody subscribes to it from now on.
    running.end();
    if let Some(inner) = inner.upgrade() {
        inner.forget(&prefix, &slot);
        inner.streams.cancel(registered).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listening() -> (broadcast::Sender<Message>, QueueWaiter) {
        let (tx, rx) = broadcast::channel(BACKLOG);
        (tx, QueueWaiter { rx, delivered: 0 })
    }

    fn deleted(keys: &[(&str, i64)]) -> Message {
        let keys: Vec<(Vec<u8>, i64)> = keys
            .iter()
            .map(|(k, rev)| (k.as_bytes().to_vec(), *rev))
            .collect();
        Message::Deleted(keys.into())
    }

    /// Deletions up to the waiter's own read of the queue are skipped: a name deleted by
    /// then (an earlier place of that name, gone before the read showed the new one) must
    /// not count as the deletion of the place the read saw.
    #[tokio::test]
    async fn deletions_up_to_the_waiters_read_are_skipped() {
        let (tx, mut waiter) = listening();
        let _ = tx.send(deleted(&[("a", 5)]));
        let _ = tx.send(deleted(&[("b", 6), ("c", 7)]));
        assert_eq!(waiter.deleted_after(6).await, Some(vec![b"c".to_vec()]));
    }

    /// A watch that ended, or a waiter that fell too far behind it, says "look again".
    #[tokio::test]
    async fn an_ended_watch_or_a_lagging_waiter_looks_again() {
        let (tx, mut waiter) = listening();
        let _ = tx.send(Message::Ended);
        assert_eq!(waiter.deleted_after(0).await, None);
        let (tx, mut waiter) = listening();
        for rev in 1..=BACKLOG as i64 + 1 {
            let _ = tx.send(deleted(&[("a", rev)]));
        }
        assert_eq!(waiter.deleted_after(0).await, None);
    }
}
