use std::sync::Arc;

use lockcore::FencedResource;

use crate::scenarios::{clients, Keys};
use crate::{check, Harness, Outcome};

/// A holder whose lease expired writes with its old token after the next holder wrote:
/// a `FencedResource` rejects the stale write and keeps the new holder's value.
pub async fn stale_token_rejected(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("resource");
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let resource = FencedResource::new(String::new());
    let a = c[0].lock(&key).ttl(ttl).watchdog(false).acquire().await?;
    check!(
        resource.write(a.token(), |v| *v = "a".into()).is_ok(),
        "the first holder's write was rejected"
    );
    let b = c[1]
        .lock(&key)
        .ttl(ttl * 10)
        .wait(ttl * 20)
        .acquire()
        .await?;
    check!(
        resource.write(b.token(), |v| *v = "b".into()).is_ok(),
        "the new holder's write was rejected"
    );
    check!(
        resource.write(a.token(), |v| *v = "stale".into()).is_err(),
        "a stale token's write was accepted"
    );
    check!(
        resource.read() == "b",
        "the resource holds {:?}",
        resource.read()
    );
    b.release().await?;
    Ok(())
}
