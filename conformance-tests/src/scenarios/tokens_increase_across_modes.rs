use std::sync::Arc;

use lockcore::{FencingToken, LockClient};

use crate::scenarios::{clients, Keys};
use crate::{check, Harness, Outcome};

/// Every grant takes the key's next token whatever its mode: tokens of one key strictly
/// increase in grant order across readers, writers, semaphore holders, clients and expiry
/// take-overs (the semaphore part runs when the backend declares semaphores).
pub async fn tokens_increase_across_modes(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let c = clients(&*h, 3).await?;
    let key = keys.key("read-write");
    let mut tokens: Vec<(&str, FencingToken)> = Vec::new();
    let read = |c: &LockClient| c.lock(&key).shared().ttl(ttl * 10).wait(ttl * 20);
    let write = |c: &LockClient| c.lock(&key).ttl(ttl * 10).wait(ttl * 20);

    let r = read(&c[0]).acquire().await?;
    tokens.push(("reader", r.token()));
    r.release().await?;
    let w = write(&c[1]).acquire().await?;
    tokens.push(("writer", w.token()));
    w.release().await?;
    let r1 = read(&c[2]).acquire().await?;
    tokens.push(("reader", r1.token()));
    let r2 = read(&c[0]).acquire().await?;
    tokens.push(("second reader beside it", r2.token()));
    r1.release().await?;
    r2.release().await?;
    let w = write(&c[2]).acquire().await?;
    tokens.push(("writer", w.token()));
    w.release().await?;
    // Take-overs: a reader that dies (no renewal) is followed by a writer, a writer that
    // dies by a reader.
    let dead_reader = read(&c[0]).ttl(ttl).watchdog(false).acquire().await?;
    tokens.push(("reader left to expire", dead_reader.token()));
    let w = write(&c[1]).acquire().await?;
    tokens.push(("writer after the reader's expiry", w.token()));
    w.release().await?;
    let dead_writer = write(&c[1]).ttl(ttl).watchdog(false).acquire().await?;
    tokens.push(("writer left to expire", dead_writer.token()));
    let r = read(&c[2]).acquire().await?;
    tokens.push(("reader after the writer's expiry", r.token()));
    r.release().await?;
    drop((dead_reader, dead_writer));
    // Another key's grants in between take nothing from this key's order.
    let other = c[0]
        .lock(keys.key("another"))
        .shared()
        .ttl(ttl * 10)
        .acquire()
        .await?;
    other.release().await?;
    let w = write(&c[0]).acquire().await?;
    tokens.push(("writer", w.token()));
    w.release().await?;
    check!(
        tokens.windows(2).all(|p| p[0].1 < p[1].1),
        "tokens of one key did not strictly increase in grant order: {tokens:?}"
    );

    if !c[0].capabilities().semaphores {
        return Ok(());
    }
    let key = keys.key("semaphore");
    let sem = |c: &LockClient, permits: u32| {
        c.semaphore(&key, 2)
            .permits(permits)
            .ttl(ttl * 10)
            .wait(ttl * 20)
    };
    let mut tokens: Vec<(&str, FencingToken)> = Vec::new();
    let a = sem(&c[0], 1).acquire().await?;
    tokens.push(("1 permit", a.token()));
    let b = sem(&c[1], 1).acquire().await?;
    tokens.push(("1 permit beside it", b.token()));
    a.release().await?;
    b.release().await?;
    let both = sem(&c[2], 2).acquire().await?;
    tokens.push(("2 permits", both.token()));
    both.release().await?;
    let dead = sem(&c[0], 2).ttl(ttl).watchdog(false).acquire().await?;
    tokens.push(("2 permits left to expire", dead.token()));
    let next = sem(&c[1], 1).acquire().await?;
    tokens.push(("1 permit after the expiry", next.token()));
    next.release().await?;
    drop(dead);
    // A free key takes any capacity, and the new kind continues the key's tokens.
    let w = c[2]
        .lock(&key)
        .ttl(ttl * 10)
        .wait(ttl * 20)
        .acquire()
        .await?;
    tokens.push(("exclusive lock on the freed semaphore key", w.token()));
    w.release().await?;
    check!(
        tokens.windows(2).all(|p| p[0].1 < p[1].1),
        "tokens of one semaphore key did not strictly increase in grant order: {tokens:?}"
    );
    Ok(())
}
