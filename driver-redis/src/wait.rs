//! One pub/sub connection per backend, shared by every waiter of every key.
//!
//! A waiter registers its key's release channel here; the first registration of a channel
//! sends `SUBSCRIBE` and waits for the server's confirmation, later ones reuse it, and the
//! last one to leave sends `UNSUBSCRIBE`. A reader task turns each release message into one
//! [`ReleaseNotifier::notify_one`]: a release wakes one waiter of this process, not all
//! of them. A channel stays subscribed for [`LINGER`] after its last waiter left, so a
//! busy lock does not pay a SUBSCRIBE/UNSUBSCRIBE round trip every time its waiters briefly
//! drop to zero (waiters then queue behind those round trips and lose every race to a
//! holder that re-acquires at once). When the connection breaks, every waiter is woken
//! (messages may have been missed) and the next registration reconnects and subscribes all
//! live channels again.
//! On a Redis Cluster the subscriptions are sharded (see [`Source`]); a node's connection
//! breaking, or a channel's slot moving to another master, wakes every waiter and makes the
//! next registration of each affected channel subscribe it again, on its new master.
//!
//! Ours, not the redis crate's resubscribing `ConnectionManager`: that one keeps a set of
//! channels for one address, where waiters need counts with a linger and, under Sentinel, a
//! connection that moves with the master.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use lockcore::driver::{ReleaseNotifier, Subscription};
use lockcore::{LockError, LockKey};
use redis::aio::PubSubSink;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, RedisResult, Value};
use tokio::sync::oneshot;

use crate::connection::{within, ClusterTarget};
use crate::error;
use crate::sentinel::SentinelConnection;
use crate::store::text;

/// How long a channel stays subscribed after its last waiter left.
const LINGER: Duration = Duration::from_secs(2);

/// How many times one registration subscribes again when the server drops the channel
/// while the subscription is on its way.
const MAX_RESUBSCRIBE: u32 = 3;

/// The shared pub/sub connection and the channels it is subscribed to.
pub(crate) struct Waiters {
    source: Source,
    connect_timeout: Duration,
    response_timeout: Duration,
    shared: Arc<Shared>,
    /// Serialises SUBSCRIBE/UNSUBSCRIBE and reconnection, so the server sees them in the
    /// order the reference counts changed.
    conn: tokio::sync::Mutex<Option<Conn>>,
}

/// Decides whether a release message (key, payload) should wake a waiter; driver-redlock
/// uses it to wake one waiter per release however many of its instances announce it.
pub type MessageFilter = Arc<dyn Fn(&LockKey, &[u8]) -> bool + Send + Sync>;

#[derive(Default)]
struct Shared {
    notifier: Arc<ReleaseNotifier>,
    filter: Option<MessageFilter>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
    /// The generation of the connection believed alive, if any.
    live: Option<u64>,
    next_generation: u64,
}

struct Channel {
    key: LockKey,
    refs: usize,
    /// The connection generation on which the server confirmed the subscription.
    subscribed_on: Option<u64>,
    /// How many times the server dropped the subscription (a Cluster slot moving, a node's
    /// connection breaking). A confirmation counts only if no drop came while it was
    /// awaited: a drop's push and a confirmation travel apart, so the later of the two
    /// to reach this state is not always the later of the two at the server.
    drops: u64,
    /// When the last waiter left (`None` while there are waiters).
    idle_since: Option<Instant>,
    /// Whether a task is already waiting to unsubscribe the channel once it is idle.
    sweeping: bool,
}

struct Conn {
    sink: Sink,
    generation: u64,
    /// Dropping this stops the reader task, which closes the connection.
    _stop: oneshot::Sender<()>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes every waiter: announcements may have been missed.
    fn wake_everyone(&self) {
        self.notifier.notify_everyone();
    }
}

/// A waiter's interest in one channel; dropping it gives the interest up.
pub struct Registration {
    waiters: Arc<Waiters>,
    channel: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let sweep = {
            let mut state = self.waiters.shared.state();
            match state.channels.get_mut(&self.channel) {
                Some(c) => {
                    c.refs = c.refs.saturating_sub(1);
                    if c.refs == 0 {
                        c.idle_since = Some(Instant::now());
                    }
                    let sweep = c.refs == 0 && !c.sweeping;
                    if sweep {
                        c.sweeping = true;
                    }
                    sweep
                }
                None => false,
            }
        };
        if sweep {
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => {
                    let waiters = self.waiters.clone();
                    let channel = std::mem::take(&mut self.channel);
                    handle.spawn(async move { waiters.unsubscribe_when_idle(channel).await });
                }
                // No runtime to unsubscribe from: the subscription lasts until the
                // connection closes, which costs the server a few bytes.
                Err(_) => {
                    if let Some(c) = self.waiters.shared.state().channels.get_mut(&self.channel) {
                        c.sweeping = false;
                    }
                }
            }
        }
    }
}

impl Waiters {
    pub(crate) fn new(
        source: Source,
        connect_timeout: Duration,
        response_timeout: Duration,
        notifier: Option<(Arc<ReleaseNotifier>, Option<MessageFilter>)>,
    ) -> Self {
        let (notifier, filter) = notifier.unwrap_or_default();
        Waiters {
            source,
            connect_timeout,
            response_timeout,
            shared: Arc::new(Shared {
                notifier,
                filter,
                state: Mutex::default(),
            }),
            conn: tokio::sync::Mutex::new(None),
        }
    }

    /// Registers in-process interest in `key`'s releases for the waiter at `place` in this
    /// process's line. Call before re-checking the key.
    pub(crate) fn subscribe_local(&self, key: &LockKey, place: u64) -> Subscription {
        self.shared.notifier.subscribe(key, place)
    }

    /// The notifier this backend's waiters subscribe with.
    pub(crate) fn notifier(&self) -> &ReleaseNotifier {
        &self.shared.notifier
    }

    /// Wakes this backend's waiter of `key` first in line, if any (a release that the
    /// server did not announce).
    pub(crate) fn wake_local(&self, key: &LockKey) {
        self.shared.notifier.notify_one(key);
    }

    /// Makes sure the server sends `channel`'s messages to this backend, and keeps it
    /// subscribed while the returned registration lives.
    ///
    /// # Errors
    ///
    /// [`LockError::Unavailable`] when the pub/sub connection cannot be (re)established or
    /// the server does not confirm in time.
    pub(crate) async fn register(
        self: &Arc<Self>,
        key: &LockKey,
        channel: &str,
    ) -> Result<Registration, LockError> {
        let ready = {
            let mut state = self.shared.state();
            let live = state.live;
            if !state.channels.contains_key(channel) {
                state.channels.insert(
                    channel.to_owned(),
                    Channel {
                        key: key.clone(),
                        refs: 0,
                        subscribed_on: None,
                        drops: 0,
                        idle_since: None,
                        sweeping: false,
                    },
                );
            }
            let Some(c) = state.channels.get_mut(channel) else {
                return Err(error::unexpected("channel registry"));
            };
            c.refs += 1;
            c.idle_since = None;
            live.is_some() && c.subscribed_on == live
        };
        // Created now, so a failure or a cancelled wait below still gives the interest up.
        let registration = Registration {
            waiters: self.clone(),
            channel: channel.to_owned(),
        };
        if !ready {
            self.subscribe(channel).await?;
        }
        Ok(registration)
    }

    async fn subscribe(&self, channel: &str) -> Result<(), LockError> {
        let mut conn = self.conn.lock().await;
        // A cluster connection that has not seen a slot move (a migration, a failover) sends
        // the subscription to the slot's old master, which answers MOVED: a new connection
        // learns the cluster's slots afresh and subscribes every channel where it belongs.
        let mut redirected = false;
        let mut dropped_meanwhile = 0;
        loop {
            let generation = match self.live_connection(&mut conn).await {
                Ok(g) => g,
                Err(e) => {
                    *conn = None;
                    return Err(e);
                }
            };
            let drops = {
                let state = self.shared.state();
                match state.channels.get(channel) {
                    Some(c) if c.subscribed_on == Some(generation) => return Ok(()),
                    Some(c) => c.drops,
                    None => 0,
                }
            };
            let Some(live) = conn.as_mut() else {
                return Err(error::unexpected("pub/sub connection vanished"));
            };
            match tokio::time::timeout(
                self.response_timeout,
                live.sink.subscribe(&[channel.to_owned()]),
            )
            .await
            {
                Ok(Ok(())) => {
                    match self.shared.state().channels.get_mut(channel) {
                        Some(c) if c.drops == drops => {
                            c.subscribed_on = Some(generation);
                            return Ok(());
                        }
                        Some(_) => {}
                        None => return Ok(()),
                    }
                    // The server dropped the channel while the subscription was on its way:
                    // perhaps this very subscription (a slot set again on its own master).
                    // Subscribing twice is harmless; sleeping unsubscribed is not.
                    dropped_meanwhile += 1;
                    if dropped_meanwhile > MAX_RESUBSCRIBE {
                        // The slot keeps moving: the next registration tries again.
                        return Ok(());
                    }
                    tracing::debug!(
                        channel,
                        "redis subscription dropped while confirmed; subscribing again"
                    );
                }
                Ok(Err(e)) if !redirected && is_redirection(&e) => {
                    tracing::debug!(channel, "redis subscription redirected; reconnecting");
                    self.forget(&mut conn, generation);
                    redirected = true;
                }
                Ok(Err(e)) => {
                    self.forget(&mut conn, generation);
                    return Err(error::map(e));
                }
                Err(_) => {
                    self.forget(&mut conn, generation);
                    return Err(error::timed_out("SUBSCRIBE", self.response_timeout));
                }
            }
        }
    }

    /// Drops a connection that failed, so the next registration reconnects.
    fn forget(&self, conn: &mut Option<Conn>, generation: u64) {
        *conn = None;
        let mut state = self.shared.state();
        if state.live == Some(generation) {
            state.live = None;
        }
    }

    /// The generation of a live connection, connecting (and re-subscribing every channel
    /// that still has waiters) if there is none.
    async fn live_connection(&self, conn: &mut Option<Conn>) -> Result<u64, LockError> {
        if let Some(c) = conn.as_ref() {
            if self.shared.state().live == Some(c.generation) {
                return Ok(c.generation);
            }
        }
        *conn = None;
        let (mut sink, stream) = self
            .source
            .connect(self.connect_timeout, self.response_timeout)
            .await?;
        let (generation, channels, reconnect) = {
            let mut state = self.shared.state();
            let generation = state.next_generation;
            state.next_generation += 1;
            let channels: Vec<(String, u64)> = state
                .channels
                .iter()
                .filter(|(_, c)| c.refs > 0)
                .map(|(name, c)| (name.clone(), c.drops))
                .collect();
            (generation, channels, generation > 0)
        };
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(read(self.shared.clone(), stream, generation, stopped));
        if !channels.is_empty() {
            let names: Vec<String> = channels.iter().map(|(name, _)| name.clone()).collect();
            within("SUBSCRIBE", self.response_timeout, sink.subscribe(&names)).await?;
        }
        {
            let mut state = self.shared.state();
            for (name, drops) in &channels {
                if let Some(c) = state.channels.get_mut(name) {
                    // A channel dropped meanwhile is subscribed again at its next registration.
                    if c.drops == *drops {
                        c.subscribed_on = Some(generation);
                    }
                }
            }
            state.live = Some(generation);
        }
        if reconnect {
            // Releases announced while no connection listened were missed: let every
            // waiter look again (spurious wake-ups are allowed, sleeping through one is not).
            tracing::debug!("redis pub/sub connection re-established");
            self.shared.wake_everyone();
        }
        *conn = Some(Conn {
            sink,
            generation,
            _stop: stop,
        });
        Ok(generation)
    }

    /// Unsubscribes `channel` once it has had no waiter for [`LINGER`].
    async fn unsubscribe_when_idle(&self, channel: String) {
        let mut nap = LINGER;
        loop {
            tokio::time::sleep(nap).await;
            let mut conn = self.conn.lock().await;
            let subscribed_on = {
                let mut state = self.shared.state();
                let Some(c) = state.channels.get_mut(&channel) else {
                    return;
                };
                match c.idle_since {
                    Some(since) if c.refs == 0 => {
                        let idle = since.elapsed();
                        if idle < LINGER {
                            nap = LINGER - idle;
                            continue;
                        }
                    }
                    // Waiters came back: the next one to leave schedules a new sweep.
                    _ => {
                        c.sweeping = false;
                        return;
                    }
                }
                state
                    .channels
                    .remove(&channel)
                    .and_then(|c| c.subscribed_on)
            };
            let Some(live) = conn.as_mut() else { return };
            if subscribed_on != Some(live.generation) {
                return;
            }
            let generation = live.generation;
            match tokio::time::timeout(self.response_timeout, live.sink.unsubscribe(&channel)).await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %lockcore::ErrorChain(&e), "redis UNSUBSCRIBE failed; reconnecting later");
                    self.forget(&mut conn, generation);
                }
                Err(_) => self.forget(&mut conn, generation),
            }
            return;
        }
    }

    /// Makes the next registration open a new connection (the server moved: a new master
    /// under Sentinel), and wakes every waiter to register again.
    pub(crate) fn reset(&self) {
        self.shared.state().live = None;
        self.shared.wake_everyone();
    }

    /// Closes the pub/sub connection and wakes every waiter.
    pub(crate) async fn shutdown(&self) {
        let mut conn = self.conn.lock().await;
        *conn = None;
        self.shared.state().live = None;
        self.shared.wake_everyone();
    }
}

/// Whether `e` is a Redis Cluster redirection (`MOVED`, `ASK`).
fn is_redirection(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::Moved | redis::ServerErrorKind::Ask)
    )
}

/// Turns release messages into wake-ups until the connection ends or is dropped.
async fn read(
    shared: Arc<Shared>,
    mut events: Events,
    generation: u64,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            event = events.next() => match event {
                Some(Event::Message { channel, payload }) => {
                    let key = shared
                        .state()
                        .channels
                        .get(&channel)
                        .map(|c| c.key.clone());
                    if let Some(key) = key {
                        let wake = match &shared.filter {
                            Some(filter) => filter(&key, &payload),
                            None => true,
                        };
                        if wake {
                            shared.notifier.notify_one(&key);
                        }
                    }
                }
                Some(Event::Dropped(channel)) => {
                    // Subscribe again at the next registration (on a moved slot's new
                    // master), and let every waiter look again meanwhile.
                    {
                        let mut state = shared.state();
                        match &channel {
                            // The confirmation of our own UNSUBSCRIBE of an idle channel.
                            Some(name) if !state.channels.contains_key(name) => continue,
                            Some(name) => {
                                if let Some(c) = state.channels.get_mut(name) {
                                    c.subscribed_on = None;
                                    c.drops += 1;
                                }
                            }
                            // A node's connection broke. The cluster client subscribes
                            // its channels again when it reconnects, to the node it lost;
                            // when that node's slots went to its replica meanwhile, only a
                            // subscription by slot reaches the new master: the next
                            // registration of each channel sends one.
                            None => {
                                for c in state.channels.values_mut() {
                                    c.subscribed_on = None;
                                    c.drops += 1;
                                }
                            }
                        }
                    }
                    tracing::debug!(channel = channel.as_deref().unwrap_or("*"), "redis subscription dropped by the server");
                    shared.wake_everyone();
                }
                None => break,
            },
        }
    }
    {
        let mut state = shared.state();
        if state.live == Some(generation) {
            state.live = None;
            tracing::debug!("redis pub/sub connection closed");
        }
    }
    shared.wake_everyone();
}

// The pub/sub connection a backend's waiters share: a plain connection to one server
// (`SUBSCRIBE`, `PUBLISH`), or a cluster connection whose sharded subscriptions
// (`SSUBSCRIBE`, answered to `SPUBLISH`) each go to the master that owns the channel's
// slot, so a release is announced only on its shard. The cluster client keeps one
// connection per node it subscribed on, whatever the number of channels or waiters.

/// Where the pub/sub connection goes.
pub(crate) enum Source {
    Single(redis::Client),
    Cluster(ClusterTarget),
    /// The master the sentinels name when the connection is made.
    Sentinel(Arc<SentinelConnection>),
}

/// What the connection reports.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A message on a channel: a release announcement.
    Message { channel: String, payload: Vec<u8> },
    /// Announcements may have been missed: the connection to a node broke (`None`), or the
    /// server dropped one channel's subscription because its slot moved to another master
    /// (`Some(channel)`).
    Dropped(Option<String>),
}

/// The events of one connection, until it closes.
pub(crate) type Events = BoxStream<'static, Event>;

/// The sending half: subscriptions.
pub(crate) enum Sink {
    Single(PubSubSink),
    Cluster(ClusterConnection),
}

impl Source {
    /// Opens the connection within `connect_timeout`.
    ///
    /// # Errors
    ///
    /// [`LockError::Unavailable`] when it cannot be made in time.
    pub(crate) async fn connect(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<(Sink, Events), LockError> {
        let what = "connecting the pub/sub connection";
        let single = |client: redis::Client| async move {
            let pubsub = within(what, connect_timeout, client.get_async_pubsub()).await?;
            let (sink, stream) = pubsub.split();
            let events = stream.map(|msg| Event::Message {
                channel: msg.get_channel_name().to_owned(),
                payload: msg.get_payload_bytes().to_vec(),
            });
            Ok((Sink::Single(sink), events.boxed()))
        };
        match self {
            Source::Single(client) => single(client.clone()).await,
            Source::Sentinel(sentinel) => {
                single(sentinel.master_client().await.map_err(error::map)?).await
            }
            Source::Cluster(target) => {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                let client = target.client(connect_timeout, response_timeout, Some(tx))?;
                let conn = within(what, connect_timeout, client.get_async_connection()).await?;
                let pushes = futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|push| (push, rx))
                });
                let events = pushes.filter_map(|push| std::future::ready(cluster_event(push)));
                Ok((Sink::Cluster(conn), events.boxed()))
            }
        }
    }
}

/// The event a cluster node's push message means, if any (subscription confirmations and
/// other pushes mean nothing to the waiters).
fn cluster_event(push: PushInfo) -> Option<Event> {
    let owned = |v: &Value| text(v).map(str::to_owned);
    match push.kind {
        PushKind::SMessage | PushKind::Message => match push.data.as_slice() {
            [channel, Value::BulkString(payload)] => Some(Event::Message {
                channel: owned(channel)?,
                payload: payload.clone(),
            }),
            _ => None,
        },
        PushKind::SUnsubscribe => Some(Event::Dropped(Some(owned(push.data.first()?)?))),
        PushKind::Disconnection => Some(Event::Dropped(None)),
        _ => None,
    }
}

impl Sink {
    /// Subscribes `channels` (on a cluster, each on its own shard).
    pub(crate) async fn subscribe(&mut self, channels: &[String]) -> RedisResult<()> {
        match self {
            Sink::Single(sink) => sink.subscribe(channels).await,
            Sink::Cluster(conn) => {
                // One SSUBSCRIBE per channel: channels of different slots cannot share one.
                let sent = channels.iter().map(|channel| {
                    let mut conn = conn.clone();
                    async move { conn.ssubscribe(channel).await }
                });
                futures_util::future::join_all(sent)
                    .await
                    .into_iter()
                    .collect()
            }
        }
    }

    /// Unsubscribes `channel`.
    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Sink::Single(sink) => sink.unsubscribe(channel).await,
            Sink::Cluster(conn) => conn.sunsubscribe(channel).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(kind: PushKind, data: Vec<Value>) -> PushInfo {
        PushInfo { kind, data }
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn cluster_pushes_become_events() {
        assert_eq!(
            cluster_event(push(
                PushKind::SMessage,
                vec![bulk("p{k}:released"), bulk("7")]
            )),
            Some(Event::Message {
                channel: "p{k}:released".into(),
                payload: b"7".to_vec()
            })
        );
        assert_eq!(
            cluster_event(push(
                PushKind::SUnsubscribe,
                vec![bulk("p{k}:released"), Value::Int(0)]
            )),
            Some(Event::Dropped(Some("p{k}:released".into())))
        );
        assert_eq!(
            cluster_event(push(PushKind::Disconnection, vec![])),
            Some(Event::Dropped(None))
        );
        assert_eq!(
            cluster_event(push(
                PushKind::SSubscribe,
                vec![bulk("p{k}:released"), Value::Int(1)]
            )),
            None
        );
        assert_eq!(
            cluster_event(push(PushKind::SMessage, vec![bulk("x")])),
            None
        );
    }
}
