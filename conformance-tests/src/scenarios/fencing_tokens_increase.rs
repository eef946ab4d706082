use std::sync::Arc;

use crate::scenarios::{clients, Keys};
use crate::{check, Harness, Outcome};

/// Tokens of successive holders of one key strictly increase across clients, releases and
/// expiry take-overs.
pub async fn fencing_tokens_increase(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("fenced");
    let ttl = h.ttl();
    let c = clients(&*h, 3).await?;
    let mut tokens = Vec::new();
    for round in 0..6 {
        let client = &c[round % c.len()];
        let g = client
            .lock(&key)
            .ttl(ttl * 10)
            .wait(ttl * 20)
            .acquire()
            .await?;
        tokens.push(g.token());
        g.release().await?;
    }
    // An expiry take-over: the first holder never releases.
    let expiring = c[0].lock(&key).ttl(ttl).watchdog(false).acquire().await?;
    tokens.push(expiring.token());
    let next = c[1]
        .lock(&key)
        .ttl(ttl * 10)
        .wait(ttl * 20)
        .acquire()
        .await?;
    tokens.push(next.token());
    next.release().await?;
    drop(expiring);
    let other = c[2]
        .lock(keys.key("other-key"))
        .ttl(ttl * 10)
        .acquire()
        .await?;
    other.release().await?;
    let last = c[2]
        .lock(&key)
        .ttl(ttl * 10)
        .wait(ttl * 20)
        .acquire()
        .await?;
    tokens.push(last.token());
    last.release().await?;
    check!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens did not strictly increase: {tokens:?}"
    );
    Ok(())
}
