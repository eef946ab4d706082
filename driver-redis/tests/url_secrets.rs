//! Passwords given in the URL — in the userinfo or as `?password=` — authenticate, and never
//! appear in an error or in `Debug` output (of the builder or of the backend), against a real
//! server that wants a password.

mod common;

use std::time::Duration;

use common::{shared_url, start_server};
use conformance_tests::process::free_port;
use distlock_redis::RedisBackend;
use lockcore::{LockClient, LockError};

const RIGHT: &str = "right-pw";
/// Wrong passwords: a distinctive one, and common words that also appear in the messages.
const WRONG: &[&str] = &["hunter2-s3cret", "redis", "lock"];

/// `?password=` is the password: the right one connects, a wrong one is a clear
/// `Backend` error that shows the URL redacted and never the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_password_authenticates_and_never_shows() {
    let port = free_port().unwrap();
    let _server = start_server(port, &["--requirepass", RIGHT]).await.unwrap();
    let ok = RedisBackend::builder(format!("redis://127.0.0.1:{port}/0?password={RIGHT}"))
        .build()
        .await
        .expect("the query password authenticates");
    assert_eq!(
        format!("{ok:?}"),
        format!("RedisBackend {{ url: redis://127.0.0.1:{port}/0?password=***, prefix: \"distlock:\", fencing: true }}")
    );
    let userinfo = RedisBackend::builder(format!("redis://default:{RIGHT}@127.0.0.1:{port}/0"))
        .prefix("billing:")
        .build()
        .await
        .expect("the userinfo password authenticates");
    assert_eq!(
        format!("{userinfo:?}"),
        format!(
            "RedisBackend {{ url: redis://default:***@127.0.0.1:{port}/0, prefix: \"billing:\", fencing: true }}"
        )
    );
    let locks = LockClient::new(ok);
    locks
        .lock("k")
        .try_acquire()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    for wrong in WRONG {
        for url in [
            format!("redis://127.0.0.1:{port}/0?password={wrong}"),
            format!("redis://127.0.0.1:{port}/0?pass={wrong}&prefix=p:"),
            format!("redis://default:{wrong}@127.0.0.1:{port}/0"),
        ] {
            let builder = RedisBackend::builder(url.as_str());
            let shown = format!("{builder:?}");
            assert!(
                !shown.contains(&format!("={wrong}")) && !shown.contains(&format!(":{wrong}@")),
                "{shown}"
            );
            let err = builder.build().await.unwrap_err();
            assert!(matches!(err, LockError::Backend { .. }), "{url}: {err:?}");
            let text = format!("{err} {err:?}");
            assert!(
                !text.contains(&format!("={wrong}")) && !text.contains(&format!(":{wrong}@")),
                "{text}"
            );
            if *wrong == "hunter2-s3cret" {
                assert!(!text.contains(wrong), "{text}");
            }
        }
    }
}

/// An unreachable port is `Unavailable`, and the message does not carry the password.
#[tokio::test]
async fn unreachable_server_error_has_no_password() {
    let port = free_port().unwrap();
    for url in [
        format!("redis://127.0.0.1:{port}/0?password=hunter2-s3cret"),
        format!("redis://u:hunter2-s3cret@127.0.0.1:{port}/0"),
    ] {
        let err = RedisBackend::builder(url.as_str())
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Unavailable { .. }), "{err:?}");
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    }
}

/// A wrong password against the shared server (no password configured): refused, not shown.
#[tokio::test]
async fn password_for_a_server_without_one_is_not_shown() {
    let url = format!("{}0?password=hunter2-s3cret", shared_url());
    let err = RedisBackend::builder(url).build().await.unwrap_err();
    assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
}
