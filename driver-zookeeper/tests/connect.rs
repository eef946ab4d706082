//! Connecting: digest authentication (a root made by one user is refused to another, with a
//! message that says so), unreachable servers, and URLs refused before anything is sent.

mod common;

use std::time::{Duration, Instant};

use common::{random_root, url_from_env};
use distlock_zookeeper::ZkConfig;
use lockcore::{LockClient, LockError};

fn server() -> String {
    let url = url_from_env("DISTLOCK_TEST_ZK_URL");
    ZkConfig::parse(&url).unwrap().place()
}

/// A root made by `app:s3cret` (ACL `creator_all`) serves that user, and refuses another
/// password with an error naming the ACL and the credentials.
#[tokio::test]
async fn digest_auth_guards_the_nodes() {
    tokio::time::timeout(Duration::from_secs(30), async {
        // Under a top node of its own: the nodes `app` creates on the way to the root get its
        // ACL too, and every other test's root is under `/distlock-test`.
        let root = format!("/distlock-auth-test{}", random_root());
        let owner = LockClient::new(
            distlock_zookeeper::connect(&format!("zk://app:s3cret@{}{root}", server()))
                .await
                .unwrap(),
        );
        let g = owner.lock("guarded").try_acquire().await.unwrap().unwrap();
        let intruder = LockClient::new(
            distlock_zookeeper::connect(&format!("zk://app:wrong@{}{root}", server()))
                .await
                .unwrap(),
        );
        let err = intruder.lock("guarded").try_acquire().await.unwrap_err();
        let mut text = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(e) = source {
            text = format!("{text}: {e}");
            source = e.source();
        }
        assert!(matches!(err, LockError::Backend { .. }), "{text}");
        assert!(
            text.contains("not authorised") && !text.contains("wrong"),
            "{text}"
        );
        assert!(
            intruder.inspect("guarded").await.is_err(),
            "another user read the holders"
        );
        g.release().await.unwrap();
    })
    .await
    .expect("the test did not finish in 30 s");
}

/// No server listening: `connect` answers `Unavailable` at once (the connection was
/// refused, so nothing was sent), naming the servers.
#[tokio::test]
async fn unreachable_servers_are_unavailable() {
    let port = conformance_tests::process::free_port().unwrap();
    let started = Instant::now();
    let err = distlock_zookeeper::connect(&format!("zk://127.0.0.1:{port}?connect_timeout=2s"))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// Malformed URLs and TLS without the `tls` feature are `Config` errors that say what to
/// change, and never show the password.
#[tokio::test]
async fn bad_urls_are_config_errors() {
    for (url, says) in [
        ("zk://h1?session_timeout=10", "session_timeout"),
        ("zk://h1?bogus=1", "bogus"),
        ("zk://app@h1", "user and a password"),
        ("zk://app:s3cret@h1/a//b", "root path"),
    ] {
        let err = distlock_zookeeper::connect(url).await.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, LockError::Config { .. }), "{url}: {text}");
        assert!(
            text.contains(says) && !text.contains("s3cret"),
            "{url}: {text}"
        );
    }
    if !cfg!(feature = "tls") {
        let err = distlock_zookeeper::connect(&format!("zks://{}", server()))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("`tls` feature"), "{err}");
    }
}
