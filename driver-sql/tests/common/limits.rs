//! Holds taken and given back by a backend's own calls (MySQL, PostgreSQL), no watchdog:
//! the tests renew them themselves.

use std::time::Duration;

use lockcore::{AcquireOutcome, LockBackend, LockKey, Owner};

/// `n` keys under a fresh prefix, held by `owner` on `b` for a minute (no watchdog: the
/// tests renew them themselves).
pub async fn hold(b: &dyn LockBackend, owner: &Owner, n: usize) -> Vec<LockKey> {
    let prefix = super::random_suffix();
    let mut keys = Vec::with_capacity(n);
    for i in 0..n {
        let key = LockKey::new(format!("{prefix}-{i}")).unwrap();
        let outcome = b
            .try_acquire(&key, owner, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(
            matches!(outcome, AcquireOutcome::Acquired(_)),
            "{outcome:?}"
        );
        keys.push(key);
    }
    keys
}

/// Releases `keys`, held by `owner` on `b`.
pub async fn release(b: &dyn LockBackend, owner: &Owner, keys: &[LockKey]) {
    for key in keys {
        b.release(key, owner).await.unwrap();
    }
}
