use std::sync::Arc;

use lockcore::{ClaimMode, Owner};

use crate::scenarios::{clients, writer_fits, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Readers on several clients hold one key at once; `inspect_all` lists every one of them as
/// shared, in grant order (distinct, ascending tokens), and never shows an owner token.
pub async fn readers_share(h: Arc<dyn Harness>) -> Outcome {
    const READERS: usize = 4;
    let keys = Keys::new();
    let key = keys.key("shared");
    let ttl = h.ttl() * 10;
    let c = clients(&*h, READERS + 1).await?;
    let mut guards = Vec::with_capacity(READERS);
    let mut secrets = Vec::with_capacity(READERS);
    for (i, client) in c.iter().take(READERS).enumerate() {
        let owner = Owner::new(format!("reader-{i}"));
        secrets.push(owner.token().to_hex());
        let request = client.lock(&key).shared().ttl(ttl).owner(owner);
        // The last reader waits (a wait that must end at once): the waiting path must
        // grant a shared claim beside others just as try_acquire does.
        let guard = if i + 1 == READERS {
            Some(request.wait(ttl).acquire().await?)
        } else {
            request.try_acquire().await?
        };
        let Some(guard) = guard else {
            return Err(Failure(format!(
                "reader {i} was refused while only readers held the key"
            )));
        };
        check!(
            guard.claim().mode() == ClaimMode::Shared,
            "reader {i}'s guard shows mode {}",
            guard.claim().mode()
        );
        guards.push(guard);
    }
    let observer = &c[READERS];
    let probe = observer.new_owner();
    let all = observer.inspect_all(&key).await?;
    check!(
        all.len() == READERS,
        "inspect_all lists {} leases for {READERS} readers: {all:?}",
        all.len()
    );
    for (i, (info, guard)) in all.iter().zip(&guards).enumerate() {
        check!(
            info.claim.mode() == ClaimMode::Shared,
            "lease {i} is shown as {}",
            info.claim.mode()
        );
        check!(
            info.token == guard.token(),
            "lease {i} shows token {}, reader {i} (granted {i}th) holds {}",
            info.token,
            guard.token()
        );
        check!(
            info.holder == format!("reader-{i}"),
            "lease {i} shows holder {:?}",
            info.holder
        );
    }
    check!(
        all.windows(2).all(|w| w[0].token < w[1].token),
        "inspect_all is not in grant order (tokens ascending): {all:?}"
    );
    let shown = format!(
        "{all:?} {}",
        serde_json::to_string(&all).unwrap_or_default()
    )
    .to_lowercase();
    for secret in &secrets {
        check!(
            !shown.contains(secret),
            "inspect_all reveals an owner token: {shown}"
        );
    }
    match observer.inspect(&key).await? {
        Some(one) => check!(
            guards.iter().any(|g| g.token() == one.token),
            "inspect shows token {}, which no reader holds",
            one.token
        ),
        None => {
            return Err(Failure(
                "inspect shows a key held by readers as free".into(),
            ))
        }
    }
    check!(
        !writer_fits(observer, &key, ttl, &probe).await?,
        "a writer got in while readers held the key"
    );
    for guard in guards {
        guard.release().await?;
    }
    let left = observer.inspect_all(&key).await?;
    check!(
        left.is_empty(),
        "leases left after every reader released: {left:?}"
    );
    check!(
        writer_fits(observer, &key, ttl, &probe).await?,
        "a writer was refused after every reader released"
    );
    Ok(())
}
