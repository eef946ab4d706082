//! [`Connection`]: the commands connection of a backend, to one server, to a Redis
//! Cluster or to the master Redis Sentinel names, behind the one interface the operations
//! use, each request bounded and sent once more after a broken connection ([`Commands`]);
//! and [`ClusterTarget`], how to reach a cluster's nodes (commands and pub/sub).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockcore::store_url::{ExposeSecret, SecretString};
use lockcore::LockError;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::{ConnectionInfo, PushInfo};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, ScriptInvocation,
    ServerErrorKind, Value,
};

use crate::error;
use crate::sentinel::SentinelConnection;
use crate::store::Lua;

/// Where a backend's commands go: one server (reconnecting by itself); a Redis Cluster,
/// whose client routes each command to the master of its keys' slot and follows `MOVED`
/// and `ASK` redirections and failovers; or the master the sentinels name, found again
/// after a failover. All multiplex: clones share the connections. Ours because the redis
/// crate has no one type over its single, cluster and Sentinel connections.
/// A Redis Cluster: the nodes to discover it from, and how to talk to every node.
#[derive(Clone)]
pub(crate) struct ClusterTarget {
    /// The seed nodes, without credentials.
    pub(crate) nodes: Vec<ConnectionInfo>,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<SecretString>,
    pub(crate) tls: Option<redis::TlsCertificates>,
}

impl ClusterTarget {
    /// A client of the cluster (RESP3, so that it can take sharded subscriptions), whose
    /// push messages go to `push` when given. Connecting happens later, in the caller's
    /// bound; the client makes one connection per node it routes to.
    pub(crate) fn client(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
        push: Option<tokio::sync::mpsc::UnboundedSender<PushInfo>>,
    ) -> Result<ClusterClient, LockError> {
        let mut builder = ClusterClientBuilder::new(self.nodes.clone())
            .use_protocol(redis::ProtocolVersion::RESP3)
            .connection_timeout(connect_timeout)
            .response_timeout(response_timeout)
            // Redirections and a failover are retried inside the operation's bound.
            .retries(8)
            .min_retry_wait(10)
            .max_retry_wait(500);
        if let Some(user) = &self.user {
            builder = builder.username(user);
        }
        if let Some(password) = &self.password {
            builder = builder.password(password.expose_secret());
        }
        if let Some(tls) = &self.tls {
            builder = builder.certs(tls.clone());
        }
        if let Some(push) = push {
            builder = builder.push_sender(push);
        }
        builder
            .build()
            .map_err(|e| LockError::config(format!("invalid redis cluster URL: {e}")))
    }
}

#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelConnection>),
}

/// A backend's commands: where they go, and the bound on each operation.
pub(crate) struct Commands {
    pub(crate) conn: Connection,
    /// The bound on one operation: connecting plus answering (a script sent again after
    /// `NOSCRIPT` included).
    pub(crate) op_timeout: Duration,
}

impl Commands {
    /// Whether the commands go to a Redis Cluster (scripts publish on sharded channels).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conn, Connection::Cluster(_))
    }

    /// Runs one request, within the operation bound when `bounded` (otherwise only the
    /// connection's response timeout, for driver-redlock, which bounds a whole round of
    /// requests with one timer), mapping its errors.
    ///
    /// A request that fails at once on a broken connection is sent once more: the first
    /// failure makes the connection manager reconnect, and the second send waits for that
    /// new connection. Every operation is idempotent per owner, so a second send can only
    /// repeat its effect; the one visible difference is a release whose first attempt was
    /// applied but whose answer was lost, which reports `NotHeld` ("already released").
    /// Timeouts are not sent again. Ours, not lockcore's retry policy: the redis crate's
    /// `ConnectionManager` reconnects but never sends again, and lockcore retries only
    /// waiting requests, so without it a `try_acquire` after a restart fails
    /// (`tests/redis.rs`: `restart_empty_…` and `refused_attempts_leave_nothing_for_shutdown`).
    async fn send<T, F, Fut>(&self, what: &str, bounded: bool, request: F) -> Result<T, LockError>
    where
        F: Fn(Connection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let attempts = async {
            match request(self.conn.clone()).await {
                Err(e) if error::is_unavailable(&e) && !e.is_timeout() => {
                    tracing::debug!(error = %lockcore::ErrorChain(&e), "redis {what} failed on a broken connection; sending it once more");
                    request(self.conn.clone()).await
                }
                other => other,
            }
        };
        if bounded {
            within(what, self.op_timeout, attempts).await
        } else {
            attempts.await.map_err(error::map)
        }
    }

    /// Runs one of the [`scripts`](crate::store), as [`send`](Self::send).
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        what: &str,
        invocation: &ScriptInvocation<'_>,
        bounded: bool,
    ) -> Result<T, LockError> {
        self.send(what, bounded, |mut conn| async move {
            invocation.invoke_async(&mut conn).await
        })
        .await
    }

    /// Runs one plain command, as [`send`](Self::send).
    pub(crate) async fn command<T: FromRedisValue>(
        &self,
        what: &str,
        command: &Cmd,
        bounded: bool,
    ) -> Result<T, LockError> {
        self.send(what, bounded, |mut conn| async move {
            command.query_async(&mut conn).await
        })
        .await
    }

    /// Runs `evalsha`, an `EVALSHA` of `script` built by hand (all of a request's keys and
    /// arguments written into one buffer, where a `ScriptInvocation` allocates each),
    /// within the operation bound as [`send`](Self::send), loading the script and sending
    /// it again on a `NOSCRIPT` answer (after a restart or `SCRIPT FLUSH`).
    pub(crate) async fn evalsha<T: FromRedisValue>(
        &self,
        what: &str,
        script: &Lua,
        evalsha: &Cmd,
    ) -> Result<T, LockError> {
        self.send(what, true, |mut conn| async move {
            match evalsha.query_async(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    let _: String = script.load_cmd().query_async(&mut conn).await?;
                    evalsha.query_async(&mut conn).await
                }
                other => other,
            }
        })
        .await
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(conn) => conn.req_packed_command(cmd),
            Connection::Cluster(conn) => conn.req_packed_command(cmd),
            Connection::Sentinel(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
            Connection::Sentinel(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(conn) => conn.get_db(),
            Connection::Cluster(conn) => conn.get_db(),
            Connection::Sentinel(conn) => conn.get_db(),
        }
    }
}

/// `request`'s answer within `after`, its errors mapped.
pub(crate) async fn within<T>(
    what: &str,
    after: Duration,
    request: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(after, request).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(error::map(e)),
        Err(_) => Err(error::timed_out(what, after)),
    }
}
