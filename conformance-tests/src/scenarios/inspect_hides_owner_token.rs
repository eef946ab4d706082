use std::sync::Arc;

use lockcore::Owner;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Inspect shows the holder's label, token and remaining TTL, `None` for a free key, and
/// never the owner token (in any field, its `Debug` form or its JSON).
pub async fn inspect_hides_owner_token(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("inspected");
    let ttl = h.ttl() * 10;
    let c = clients(&*h, 2).await?;
    check!(
        c[1].inspect(&key).await?.is_none(),
        "a never-used key is shown as held"
    );
    let owner = Owner::new("inspect-me");
    let secret = owner.token().to_hex();
    let g = c[0].lock(&key).ttl(ttl).owner(owner).acquire().await?;
    let Some(info) = c[1].inspect(&key).await? else {
        return Err(Failure("a held key is shown as free".into()));
    };
    check!(
        info.holder == "inspect-me",
        "holder label is {:?}",
        info.holder
    );
    check!(
        info.token == g.token(),
        "inspect shows token {}, the holder has {}",
        info.token,
        g.token()
    );
    let shown = format!(
        "{info:?} {}",
        serde_json::to_string(&info).unwrap_or_default()
    );
    check!(
        !shown.to_lowercase().contains(&secret),
        "inspect reveals the owner token: {shown}"
    );
    check!(
        !format!("{g:?}").contains(&secret),
        "the guard's Debug reveals the owner token"
    );
    g.release().await?;
    check!(
        c[1].inspect(&key).await?.is_none(),
        "a released key is shown as held"
    );
    Ok(())
}
