//! [`Connection`]: the commands connection of a backend, to one server, to a Redis
//! Cluster or to the master Redis Sentinel names, behind the one interface the operations
//! use.

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::sentinel::SentinelConnection;

/// Where a backend's commands go: one server (reconnecting by itself); a Redis Cluster,
/// whose client routes each command to the master of its keys' slot and follows `MOVED`
/// and `ASK` redirections and failovers; or the master the sentinels name, found again
/// after a failover. All multiplex: clones share the connections. Ours because the redis
/// crate has no one type over its single, cluster and Sentinel connections.
#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelConnection>),
}

impl Connection {
    /// Whether the commands go to a Redis Cluster (scripts publish on sharded channels).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Connection::Cluster(_))
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
