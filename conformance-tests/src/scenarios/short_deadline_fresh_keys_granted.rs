use std::sync::Arc;
use std::time::Duration;

use lockcore::LockError;

use crate::scenarios::Keys;
use crate::{Failure, Harness, Outcome};

/// A process alone on fresh keys is never refused, however short its deadline: each of many
/// `wait(0)` and `wait(1 ms)` acquisitions of a key nobody else uses is granted. (A deadline
/// shorter than one round trip that cut the attempt short refused a free key, and the
/// caller then found its own grant holding it.)
pub async fn short_deadline_fresh_keys_granted(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let client = h.client().await?;
    let mut refused = Vec::new();
    for n in 0..40 {
        let wait = Duration::from_millis(n % 2);
        let key = keys.key(&format!("fresh{n}"));
        match client.lock(&key).ttl(ttl * 10).wait(wait).acquire().await {
            Ok(guard) => {
                guard.release().await?;
            }
            Err(LockError::Timeout { .. }) => refused.push(format!("{key} (wait {wait:?})")),
            Err(e) => return Err(e.into()),
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(Failure(format!(
            "{} of 40 acquisitions of fresh keys with a short deadline were refused: {}",
            refused.len(),
            refused.join(", ")
        )))
    }
}
