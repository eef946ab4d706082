use std::sync::Arc;
use std::time::Duration;

use crate::scenarios::{while_delayed, Keys};
use crate::{check, Failure, Harness, Outcome};

/// An acquire whose answers are slow, and which first finds the key held, gets a token
/// strictly above every token granted to the holders that came in meanwhile.
pub async fn slow_acquire_token_above_meanwhile(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let key = keys.key("slow");
    let ttl = h.ttl();
    let slow = store.client().await?;
    let others = [store.client().await?, store.client().await?];
    // Warm every client's connections so the delay hits the acquire itself.
    let _ = slow.client.inspect(&key).await?;
    for o in &others {
        let _ = o.client.inspect(&key).await?;
    }
    let first = others[0].client.lock(&key).ttl(ttl * 20).acquire().await?;
    let mut meanwhile = vec![first.token()];
    // Under half the TTL scale: a driver's request timeout (Redlock's per-instance one)
    // must let an answer that late through.
    slow.link.delay_answers(ttl / 4).await;
    let mut request = Box::pin(
        slow.client
            .lock(&key)
            .ttl(ttl * 20)
            .wait(ttl * 30)
            .acquire(),
    );
    // The slow acquire finds the key held; its holder lets go while the answer is on its way.
    tokio::select! {
        r = &mut request => {
            slow.link.delay_answers(Duration::ZERO).await;
            return Err(Failure(format!(
                "an acquire of a held key answered {:?}",
                r.map(|g| g.token())
            )));
        }
        _ = tokio::time::sleep(ttl / 2) => {}
    }
    // The slow acquire is polled while the holder lets go: its attempt in flight may hold
    // what the store needs for every write (on SQLite, the process's turn to write the file)
    // until it is polled again.
    let mut early = None;
    let released = {
        let release = first.release();
        tokio::pin!(release);
        loop {
            tokio::select! {
                r = &mut release => break r,
                r = &mut request, if early.is_none() => early = Some(r),
            }
        }
    };
    released?;
    // Others take and release the key for as long as the slow acquire is on its way: every
    // grant they get comes before the slow acquire wrote the lock (it holds it after).
    let mut turn = 0;
    let granted = loop {
        if let Some(r) = early.take() {
            break r;
        }
        let other = &others[turn % others.len()].client;
        turn += 1;
        tokio::select! {
            r = &mut request => break r,
            r = other.lock(&key).ttl(ttl * 20).try_acquire() => {
                if let Some(g) = r? {
                    meanwhile.push(g.token());
                    // Released while the slow acquire is polled, as the first holder's
                    // was: its attempt may hold SQLite's write turn.
                    let release = g.release();
                    tokio::pin!(release);
                    loop {
                        tokio::select! {
                            r = &mut release => {
                                r?;
                                break;
                            }
                            r = &mut request, if early.is_none() => early = Some(r),
                        }
                    }
                }
            }
        }
        tokio::select! {
            r = &mut request => break r,
            _ = tokio::time::sleep(Duration::from_millis(2)) => {}
        }
    };
    slow.link.delay_answers(Duration::ZERO).await;
    let g = granted.map_err(|e| while_delayed(e, ttl / 4))?;
    let highest = meanwhile.iter().max().copied();
    check!(
        highest.is_none_or(|t| g.token() > t),
        "the slow acquire got token {} below a holder that came in meanwhile ({highest:?}; all: {meanwhile:?})",
        g.token()
    );
    let info = others[0].client.inspect(&key).await?;
    check!(
        info.as_ref().map(|i| i.token) == Some(g.token()),
        "the store shows {:?}, the slow acquire got token {}",
        info.map(|i| i.token),
        g.token()
    );
    let token = g.token();
    g.release().await?;
    let next = others[0].client.lock(&key).ttl(ttl * 20).acquire().await?;
    check!(
        next.token() > token,
        "the next holder got token {} after {token}",
        next.token()
    );
    next.release().await?;
    Ok(())
}
