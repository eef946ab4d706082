//! Waiting in a key's queue: an exclusive claim watches the node just before its own (so
//! a release wakes one waiter, not the herd); a shared claim watches the key's children,
//! since any earlier claim's end may leave it room.

use std::sync::Arc;
use std::time::Duration;

use lockcore::driver::WaitHint;
use lockcore::LockError;
use zookeeper_client::Error as ZkError;

use crate::places::Inner;
use crate::store::Queue;

/// Resolves when the claim of `hint` (its node's sequence number) may fit under `kp`, when
/// its node is gone, or after `max_wait`. Every watch is set by the read that checks, so
/// a change between the refusal and the wait is never slept through.
pub(crate) async fn wait_released(
    inner: &Arc<Inner>,
    kp: &str,
    hint: &WaitHint,
    max_wait: Duration,
) -> Result<(), LockError> {
    let Some(seq) = hint.revision() else {
        // No place of ours to wait from: a pause, then the claim again.
        tokio::time::sleep(hint.retry_delay().unwrap_or(max_wait).min(max_wait)).await;
        return Ok(());
    };
    let deadline = tokio::time::Instant::now() + max_wait;
    let client = inner.session.client().await?;
    let queue = Queue::new(&inner.children(&client, kp).await?);
    let Some(at) = queue.position_of_seq(seq) else {
        return Ok(());
    };
    if at == 0 || queue.granted(at) {
        return Ok(());
    }
    let exclusive = queue.nodes[at].claim.is_none_or(|c| c.is_exclusive());
    let watcher = if exclusive {
        let path = format!("{kp}/{}", queue.nodes[at - 1].name);
        let (stat, watcher) = inner
            .session
            .run(
                "watching a claim",
                &path,
                client.check_and_watch_stat(&path),
            )
            .await?;
        if stat.is_none() {
            return Ok(());
        }
        watcher
    } else {
        let found = inner
            .session
            .run("watching a lock's queue", kp, async {
                match client.list_and_watch_children(kp).await {
                    Err(ZkError::NoNode) => Ok(None),
                    other => other.map(Some),
                }
            })
            .await?;
        let Some((children, watcher)) = found else {
            return Ok(());
        };
        let queue = Queue::new(&children);
        match queue.position_of_seq(seq) {
            Some(at) if !queue.granted(at) => watcher,
            _ => return Ok(()),
        }
    };
    let _ = tokio::time::timeout_at(deadline, watcher.changed()).await;
    Ok(())
}
