//! The pub/sub connection a backend's waiters share: a plain connection to one server
//! (`SUBSCRIBE`, `PUBLISH`), or a cluster connection whose sharded subscriptions
//! (`SSUBSCRIBE`, answered to `SPUBLISH`) each go to the master that owns the channel's
//! slot, so a release is announced only on its shard. The cluster client keeps one
//! connection per node it subscribed on, whatever the number of channels or waiters.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use lockcore::LockError;
use redis::aio::PubSubSink;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, RedisResult, Value};

use crate::config::ClusterTarget;
use crate::error;
use crate::sentinel::SentinelConnection;

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
            let pubsub = tokio::time::timeout(connect_timeout, client.get_async_pubsub())
                .await
                .map_err(|_| error::timed_out(what, connect_timeout))?
                .map_err(error::map)?;
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
                let conn = tokio::time::timeout(connect_timeout, client.get_async_connection())
                    .await
                    .map_err(|_| error::timed_out(what, connect_timeout))?
                    .map_err(error::map)?;
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
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match push.kind {
        PushKind::SMessage | PushKind::Message => match push.data.as_slice() {
            [channel, Value::BulkString(payload)] => Some(Event::Message {
                channel: text(channel)?,
                payload: payload.clone(),
            }),
            _ => None,
        },
        PushKind::SUnsubscribe => Some(Event::Dropped(Some(text(push.data.first()?)?))),
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
