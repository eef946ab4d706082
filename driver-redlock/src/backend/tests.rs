//! The tallies of release and extend rounds, on the shared Redlock test servers
//! (`DISTLOCK_TEST_REDLOCK_URLS`, from `scripts/servers.sh start`).

use std::sync::Arc;
use std::time::Duration;

use lockcore::driver::{AcquireOutcome, ExtendOutcome, LockBackendExt, OwnerToken};
use lockcore::{LockBackend, LockKey, Owner, ReleaseOutcome};

use super::RedlockBackend;

/// The five shared test servers' URLs.
fn shared_urls() -> Vec<String> {
    let urls: Vec<String> = std::env::var("DISTLOCK_TEST_REDLOCK_URLS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert!(
        urls.len() >= 5,
        "DISTLOCK_TEST_REDLOCK_URLS does not hold five redis URLs: run `scripts/servers.sh \
         start` and the tests through `scripts/test.sh` (or source target/test-servers.env)"
    );
    urls
}

async fn backend(urls: &[String], prefix: &str) -> Arc<RedlockBackend> {
    RedlockBackend::builder(urls.to_vec())
        .prefix(prefix)
        .instance_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap()
}

const TTL: Duration = Duration::from_secs(10);

#[tokio::test]
async fn release_and_extend_count_the_instances_that_agreed() {
    let urls = shared_urls();
    let prefix = format!("distlock-test:{}:", &OwnerToken::generate().to_hex()[..16]);
    let five = backend(&urls[..5], &prefix).await;
    let key = LockKey::new("tally").unwrap();
    let owner = Owner::new("tally");

    // Held on all five: each round stops at the third agreement.
    let acquired = five.try_acquire(&key, &owner, TTL).await.unwrap();
    assert!(matches!(acquired, AcquireOutcome::Acquired(_)));
    let t = five.inner.extend(&key, &owner, TTL).await.unwrap();
    assert!(matches!(t.outcome, ExtendOutcome::Extended(_)), "{t:?}");
    assert_eq!((t.agreed, t.answered), (3, 3));
    let t = five.inner.release(&key, &owner).await.unwrap();
    assert_eq!(t.outcome, ReleaseOutcome::Released);
    assert_eq!((t.agreed, t.answered), (3, 3));

    // Held nowhere: they stop once three answered no.
    let t = five.inner.extend(&key, &owner, TTL).await.unwrap();
    assert!(matches!(t.outcome, ExtendOutcome::NotHeld), "{t:?}");
    assert_eq!((t.agreed, t.answered), (0, 3));
    let t = five.inner.release(&key, &owner).await.unwrap();
    assert_eq!(t.outcome, ReleaseOutcome::NotHeld);
    assert_eq!((t.agreed, t.answered), (0, 3));

    // Held on three of the five (a backend of its own on them): exactly a majority.
    let three = backend(&urls[..3], &prefix).await;
    let acquired = three.try_acquire(&key, &owner, TTL).await.unwrap();
    assert!(matches!(acquired, AcquireOutcome::Acquired(_)));
    let t = five.inner.extend(&key, &owner, TTL).await.unwrap();
    assert!(matches!(t.outcome, ExtendOutcome::Extended(_)), "{t:?}");
    assert_eq!(t.agreed, 3, "{t:?}");
    assert!((3..=5).contains(&t.answered), "{t:?}");
    let t = five.inner.release(&key, &owner).await.unwrap();
    assert_eq!(t.outcome, ReleaseOutcome::Released);
    assert_eq!(t.agreed, 3, "{t:?}");
    assert!((3..=5).contains(&t.answered), "{t:?}");

    three.shutdown().await;
    five.shutdown().await;
}
