//! The ZooKeeper backend and its [`LockBackend`] impl. A claim's place in a queue lives in
//! `places`, renewal in `renew`, waiting in `wait`; the layout and the grant rule in `store`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::driver::{
    AcquireOutcome, Capabilities, ClaimRequest, ExtendOutcome, Renewal, WaitHint,
};
use lockcore::{
    Claim, FencingToken, LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseOutcome,
};
use zookeeper_client::Error as ZkError;

use crate::capabilities::{CAPABILITIES, NAME};
use crate::config::ZkConfig;
use crate::places::{token_of, Inner};
use crate::store::{key_path, Queue};

/// A lock store on a ZooKeeper ensemble, in Curator's lock layout (see `docs/zookeeper.md`).
///
/// * **The session is the lease.** The backend opens one session; every node it creates
///   is ephemeral, so the servers delete all of them when the session expires (the
///   holder's process stopped, or was cut off for longer than the session timeout). The
///   client library's heartbeats keep the session, whatever the number of holds.
/// * **A hold's own TTL.** A hold nobody renews must still end after its TTL while the
///   session lives: the backend deletes its node when its TTL runs out, by this
///   process's monotonic clock. A hold's TTL is at most the session timeout, so a holder
///   cut off from the servers is never trusted longer than the servers keep its node.
/// * **Claims queue** as ephemeral sequential nodes under the key's node; a claim holds
///   when the claims before it leave room for it (`store`), and waits by watching the node
///   just before it (an exclusive claim) or the key's children (a shared one).
/// * **Fencing token**: the holder node's `czxid`, the zxid of the transaction that
///   created it. zxids increase with every write of the ensemble, across leader
///   elections (the epoch is their high half) and session expiries.
///
/// # Cancel safety
///
/// A request leaves when its future is made, so a claim dropped midway may still create
/// its node. The node's name carries the owner's id, so the next claim or release of the
/// same owner finds it: lockcore's compensating release after a cancelled acquire removes
/// it, and a node left by a process that went away goes with its session.
#[derive(Debug)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

impl ZkBackend {
    /// A backend for `cfg`. Nothing is sent yet: the session opens at the first operation
    /// (use [`connect`](crate::connect) to open it at once and see refused credentials
    /// there).
    pub fn new(cfg: ZkConfig) -> Arc<Self> {
        Arc::new(ZkBackend {
            inner: Arc::new(Inner::new(cfg)),
        })
    }

    /// Opens the session and the root path now.
    ///
    /// # Errors
    ///
    /// As [`connect`](crate::connect).
    pub async fn checked(self: Arc<Self>) -> Result<Arc<Self>, LockError> {
        self.inner.session.client().await?;
        Ok(self)
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        self.inner.session.cfg()
    }

    /// The path of `key`'s node (the key escaped into one segment under the root): a
    /// Curator `InterProcessMutex` on this path excludes distlock's exclusive locks of
    /// `key`, and they exclude it.
    pub fn lock_path(&self, key: &LockKey) -> String {
        key_path(&self.config().root, key)
    }
}

/// A node's data: this driver's `<ttl ms> <label>`, or another program's (Curator writes
/// the client's address), shown beside the node's name.
fn read_data(data: &[u8], name: &str) -> (Option<Duration>, String) {
    let text = String::from_utf8_lossy(data);
    match text.split_once(' ') {
        Some((ms, label)) if !ms.is_empty() && ms.bytes().all(|b| b.is_ascii_digit()) => {
            (ms.parse().ok().map(Duration::from_millis), label.to_owned())
        }
        _ => (None, format!("{name} ({text})")),
    }
}

#[async_trait]
impl LockBackend for ZkBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// Creates the owner's node in the key's queue (or finds it there), then reads the
    /// queue: granted when the claims before it leave room. A refused claim keeps its
    /// node, its place in the line, until it is granted or abandoned.
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        if !CAPABILITIES.supports(&request.claim) {
            return Err(LockError::claims_unsupported(NAME, &request.claim));
        }
        self.inner.claim(request).await
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        Ok(if self.inner.remove(key, owner, false).await? {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        crate::renew::renew(&self.inner, renewals).await
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        let client = self.inner.session.client().await?;
        let kp = self.lock_path(key);
        // ZooKeeper's reads are consistent per session only: another session's release may
        // not have reached the server this one reads from. Catch it up with the leader first.
        (self.inner.session)
            .run("syncing before reading the holders", &kp, async {
                match client.sync(&kp).await {
                    Err(ZkError::NoNode) => Ok(()),
                    other => other,
                }
            })
            .await?;
        let queue = Queue::new(&self.inner.children(&client, &kp).await?);
        let mut infos = Vec::new();
        for node in queue.holders() {
            let path = format!("{kp}/{}", node.name);
            let read = self
                .inner
                .session
                .run("reading a holder", &path, async {
                    match client.get_data(&path).await {
                        Ok(found) => Ok(Some(found)),
                        Err(ZkError::NoNode) => Ok(None),
                        Err(e) => Err(e),
                    }
                })
                .await?;
            if let Some((data, stat)) = read {
                let (ttl, label) = read_data(&data, &node.name);
                infos.push(
                    LockInfo::new(label, FencingToken(token_of(stat.czxid)), ttl)
                        .with_claim(node.claim.unwrap_or(Claim::exclusive())),
                );
            }
        }
        Ok(infos)
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        _place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        crate::wait::wait_released(&self.inner, &self.lock_path(key), hint, max_wait).await
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.inner.remove(key, owner, true).await.map(|_| ())
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        let client = self.inner.session.client().await?;
        let kp = self.lock_path(key);
        let mut released = false;
        for child in self.inner.children(&client, &kp).await? {
            released |= self.inner.delete(&client, &format!("{kp}/{child}")).await?;
        }
        Ok(if released {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    async fn shutdown(&self) {
        self.inner.forget_all();
        self.inner.session.close().await;
    }
}
