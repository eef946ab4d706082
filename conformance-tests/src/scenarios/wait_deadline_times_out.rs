use std::sync::Arc;
use std::time::Instant;

use lockcore::LockError;

use crate::scenarios::{clients, is_free, Keys};
use crate::{check, Failure, Harness, Outcome};

/// A wait deadline that passes while the lock is held fails with `Timeout` near the
/// deadline; the timed-out waiter leaves nothing held.
pub async fn wait_deadline_times_out(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("deadline");
    let ttl = h.ttl();
    let c = clients(&*h, 3).await?;
    let a = c[0].lock(&key).ttl(ttl * 30).acquire().await?;
    let started = Instant::now();
    match c[1].lock(&key).ttl(ttl * 30).wait(ttl).acquire().await {
        Err(LockError::Timeout { .. }) => {}
        Ok(_) => return Err(Failure("acquired a lock another owner holds".into())),
        Err(e) => return Err(Failure(format!("expected Timeout, got {e}"))),
    }
    let waited = started.elapsed();
    check!(
        waited + ttl / 10 >= ttl,
        "timed out after {waited:?}, before the {ttl:?} deadline"
    );
    check!(
        waited <= ttl * 3,
        "timed out only after {waited:?} for a {ttl:?} deadline"
    );
    check!(
        c[2].inspect(&key).await?.map(|i| i.token) == Some(a.token()),
        "the holder changed"
    );
    a.release().await?;
    check!(
        is_free(&c[2], &key, ttl).await?,
        "the timed-out waiter left the key held"
    );
    Ok(())
}
