//! The namespace's layout marker: plain and FIFO clients never share a namespace.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use lockcore::LockError;

use super::requests::failed_get;
use super::EtcdBackend;
use crate::encoding::layout_marker;

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

    /// This backend once its namespace's layout is checked, or left to check at the first
    /// operation if no endpoint answers.
    pub(crate) async fn checked(self: Arc<Self>) -> Result<Arc<Self>, LockError> {
        match self.ensure_layout().await {
            Ok(()) => Ok(self),
            Err(e @ LockError::Unavailable { .. }) => {
                tracing::debug!(error = %lockcore::ErrorChain(&e), "etcd: layout check deferred to the first operation");
                Ok(self)
            }
            Err(e) => Err(e),
        }
    }
}
