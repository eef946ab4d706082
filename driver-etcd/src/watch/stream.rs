//! One watch stream per backend, carrying the watch of every waited-on queue. Each gRPC
//! stream costs the client tens of kilobytes (HTTP/2 buffers), so a stream per waited-on
//! key would cost that much per waiter.
//!
//! etcd answers the create requests of one stream in the order they were sent, so a
//! create is matched to its answer by a queue of pending creates; after that, its events
//! and its cancellation come tagged with the watch ID. When the stream ends (an endpoint
//! went away, an error), every watch on it ends: their waiters are woken to look for
//! themselves, and the next watch opens a new stream (on whichever endpoint answers).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use etcd_client::{
    WatchFilterType, WatchOptions, WatchRequestSender, WatchResponse, WatchResponseStream,
};
use lockcore::LockError;
use tokio::sync::oneshot;

use super::Running;
use crate::endpoints::Endpoints;
use crate::lock;

/// A watch the store registered: its ID on the stream, the revision it reports events
/// after, and the stream generation it lives on.
#[derive(Clone, Copy, Debug)]
pub(super) struct Registered {
    pub(super) id: i64,
    pub(super) at: i64,
    stream: u64,
}

/// The shared stream of one backend.
pub(super) struct Streams {
    endpoints: Arc<Endpoints>,
    shared: Arc<Shared>,
}

/// What the stream's reader shares with the senders.
#[derive(Default)]
struct Shared {
    /// Held while a create or a cancel is sent, so that the store sees creates in the
    /// order of [`Routes::pending`].
    sender: tokio::sync::Mutex<Option<(WatchRequestSender, u64)>>,
    routes: Mutex<Routes>,
}

#[derive(Default)]
struct Routes {
    /// The generation of the stream believed alive.
    live: Option<u64>,
    next_stream: u64,
    /// Creates sent on the live stream and not yet answered, in the order sent.
    pending: VecDeque<(Arc<Running>, oneshot::Sender<Registered>)>,
    /// The registered watches of the live stream.
    by_id: HashMap<i64, Arc<Running>>,
}

impl Routes {
    /// Takes every watch of the stream believed alive, registered or pending.
    fn take_all(&mut self) -> Vec<Arc<Running>> {
        let pending = std::mem::take(&mut self.pending)
            .into_iter()
            .map(|(r, _)| r);
        std::mem::take(&mut self.by_id)
            .into_values()
            .chain(pending)
            .collect()
    }
}

impl Streams {
    pub(super) fn new(endpoints: Arc<Endpoints>) -> Self {
        Streams {
            endpoints,
            shared: Arc::default(),
        }
    }

    /// Registers a watch of the deletions under `prefix` from the store's current revision,
    /// its answers going to `running`: `None` if the stream ended before the store answered.
    pub(super) async fn watch(
        &self,
        prefix: &[u8],
        running: Arc<Running>,
    ) -> Result<Option<Registered>, LockError> {
        let options = WatchOptions::new()
            .with_prefix()
            .with_filters([WatchFilterType::NoPut]);
        let (tx, rx) = oneshot::channel();
        {
            let shared = &*self.shared;
            let mut sender = shared.sender.lock().await;
            let live = lock(&shared.routes).live;
            // Taken out while the create is sent, and put back only once it is: a create
            // abandoned half-sent (its caller timed out) would put the queue of pending
            // creates out of step with the store's answers, so the stream is dropped then
            // (which closes it; its reader ends its watches).
            let on_live = match sender.take() {
                Some((s, g)) if Some(g) == live => Some((s, g)),
                other => {
                    *sender = other;
                    None
                }
            };
            if let Some((mut s, g)) = on_live {
                lock(&shared.routes).pending.push_back((running, tx));
                match s.watch(prefix, Some(options)).await {
                    Ok(()) => *sender = Some((s, g)),
                    Err(e) => {
                        tracing::debug!(error = %e, "etcd: the watch stream refused a create; opening another");
                        return Ok(None);
                    }
                }
            } else {
                // A new stream, opened with this watch as its first create.
                let opened = self
                    .endpoints
                    .call("watch", |mut c| {
                        let (prefix, options) = (prefix.to_vec(), options.clone());
                        async move { c.watch(prefix, Some(options)).await }
                    })
                    .await?;
                let (s, responses) = opened.split();
                let mut routes = lock(&shared.routes);
                // Whatever was left of an earlier stream ended with it.
                let ended = routes.take_all();
                let generation = routes.next_stream;
                routes.next_stream += 1;
                routes.live = Some(generation);
                routes.pending.push_back((running, tx));
                drop(routes);
                ended.iter().for_each(|w| w.end());
                *sender = Some((s, generation));
                tokio::spawn(read(self.shared.clone(), responses, generation));
            }
        }
        Ok(rx.await.ok())
    }

    /// Cancels a registered watch (nothing to do if its stream has ended).
    pub(super) async fn cancel(&self, watch: Registered) {
        self.shared.cancel(watch.id, watch.stream).await;
    }

    /// Ends every watch and closes the stream (at shutdown).
    pub(super) async fn shutdown(&self) {
        *self.shared.sender.lock().await = None;
        let mut routes = lock(&self.shared.routes);
        routes.live = None;
        routes.take_all();
    }
}

impl Shared {
    /// Cancels watch `id` of stream `stream`, if that stream is still the live one.
    async fn cancel(&self, id: i64, stream: u64) {
        let mut sender = self.sender.lock().await;
        {
            let mut routes = lock(&self.routes);
            if routes.live != Some(stream) {
                return;
            }
            routes.by_id.remove(&id);
        }
        if let Some((s, g)) = sender.as_mut() {
            if *g == stream && s.cancel(id).await.is_err() {
                // Dropping the sender closes the stream; its reader ends its watches.
                *sender = None;
            }
        }
    }
}

/// Reads stream `generation` until it ends, routing each answer to its key's waiters.
async fn read(shared: Arc<Shared>, mut responses: WatchResponseStream, generation: u64) {
    while let Ok(Some(resp)) = responses.message().await {
        route(&shared, generation, &resp);
    }
    tracing::debug!("etcd: watch stream ended");
    let mut routes = lock(&shared.routes);
    if routes.live != Some(generation) {
        return;
    }
    routes.live = None;
    let ended = routes.take_all();
    drop(routes);
    // Events may have been missed: each watch's waiters look for themselves.
    ended.iter().for_each(|w| w.end());
}

/// One answer of the stream: a create's confirmation, a cancellation, or events. Answers
/// of a stream that is no longer the live one are dropped: its watch IDs may be reused
/// by the live stream, whose watches ended it.
fn route(shared: &Arc<Shared>, generation: u64, resp: &WatchResponse) {
    let id = resp.watch_id();
    let mut routes = lock(&shared.routes);
    if routes.live != Some(generation) {
        return;
    }
    if resp.created() {
        let Some((r, tx)) = routes.pending.pop_front() else {
            return;
        };
        if resp.canceled() {
            drop(routes);
            r.end();
            return;
        }
        let at = resp.header().map(|h| h.revision()).unwrap_or(i64::MAX);
        routes.by_id.insert(id, r);
        drop(routes);
        let registered = Registered {
            id,
            at,
            stream: generation,
        };
        if tx.send(registered).is_err() {
            // Its caller gave up waiting (timed out): nobody would cancel it.
            let shared = shared.clone();
            tokio::spawn(async move { shared.cancel(id, generation).await });
        }
        return;
    }
    if resp.canceled() {
        let ended = routes.by_id.remove(&id);
        drop(routes);
        if let Some(r) = ended {
            tracing::debug!(reason = resp.cancel_reason(), "etcd: watch cancelled");
            r.end();
        }
        return;
    }
    let Some(r) = routes.by_id.get(&id).cloned() else {
        return;
    };
    drop(routes);
    r.answer(resp);
}
