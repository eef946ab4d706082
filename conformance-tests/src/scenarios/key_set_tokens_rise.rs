use std::sync::Arc;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Each key of a set gets its own fencing token, above the token of every earlier holder
/// of that key, whether that holder took it alone or in a set.
pub async fn key_set_tokens_rise(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl() * 20;
    let (a, b) = (keys.key("a"), keys.key("b"));
    let c = clients(&*h, 2).await?;
    let mut last = [None, None];
    for round in 0..4 {
        let client = &c[round % 2];
        let tokens = if round % 2 == 0 {
            let set = client
                .lock_all([b.clone(), a.clone()])
                .ttl(ttl)
                .acquire()
                .await?;
            let tokens = [set.token(&a), set.token(&b)];
            set.release().await?;
            tokens
        } else {
            let one = client.lock(&a).ttl(ttl).acquire().await?;
            let two = client.lock(&b).ttl(ttl).acquire().await?;
            let tokens = [Some(one.token()), Some(two.token())];
            one.release().await?;
            two.release().await?;
            tokens
        };
        for (i, token) in tokens.into_iter().enumerate() {
            let Some(token) = token else {
                return Err(Failure(format!(
                    "round {round}: the set has no token for key {i}"
                )));
            };
            check!(
                last[i].is_none_or(|before| token > before),
                "round {round}: key {i} got token {token}, not above the previous holder's {:?}",
                last[i]
            );
            last[i] = Some(token);
        }
    }
    Ok(())
}
