//! A `redlock://` URL's password (userinfo or `?password=`) is never shown by an error or
//! `Debug`, against the real test instances (which have no password) and unreachable ones.

use std::time::Duration;

use conformance_tests::process::free_port;
use distlock_redlock::RedlockBackend;

fn instances() -> Vec<String> {
    let urls = std::env::var("DISTLOCK_TEST_REDLOCK_URLS")
        .expect("DISTLOCK_TEST_REDLOCK_URLS is not set: run scripts/servers.sh start");
    urls.split_whitespace()
        .map(|u| {
            u.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_and_unreachable_instances_never_show_the_password() {
    let hosts = instances().join(",");
    let dead: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port().unwrap()))
        .collect();
    let dead = dead.join(",");
    for url in [
        format!("redlock://{hosts}?password=hunter2-s3cret"),
        format!("redlock://u:hunter2-s3cret@{hosts}"),
        format!("redlock://{dead}?password=hunter2-s3cret&connect_timeout=300ms"),
        format!("redlock://u:hunter2-s3cret@{dead}?connect_timeout=300ms"),
    ] {
        let builder = RedlockBackend::builder_from_url(&url).unwrap();
        let shown = format!("{builder:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let err = tokio::time::timeout(Duration::from_secs(20), builder.build())
            .await
            .expect("bounded")
            .unwrap_err();
        let text = format!("{err} {err:?}");
        assert!(!text.contains("hunter2"), "{url}: {text}");
    }
}
