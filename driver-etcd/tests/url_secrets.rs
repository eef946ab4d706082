//! An etcd password given in the URL — userinfo or `?password=` — authenticates, and never
//! appears in an error or `Debug`, against a real member with authentication on and an
//! unreachable port.

mod common;

use std::time::Duration;

use common::{members, wait_ready, TempDir, TTL};
use conformance_tests::process::free_port;
use distlock_etcd::etcd_client::{Client, Permission};
use distlock_etcd::EtcdConfig;
use lockcore::{LockClient, LockError};

async fn round_trip(url: &str) -> Result<(), LockError> {
    let locks = LockClient::new(distlock_etcd::connect(url).await?);
    let g = locks.lock("k").ttl(TTL).try_acquire().await?.expect("free");
    g.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_password_authenticates_and_never_shows() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let dir = TempDir::new("etcd-url-secrets");
        let mut member = members(1, &dir).pop().unwrap();
        member.start().await.unwrap();
        let endpoint = format!("127.0.0.1:{}", member.client_port);
        wait_ready(
            &EtcdConfig::new([endpoint.clone()]),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        let mut admin = Client::connect([format!("http://{endpoint}")], None)
            .await
            .unwrap();
        admin.user_add("root", "rootpw", None).await.unwrap();
        admin.user_grant_role("root", "root").await.unwrap();
        admin.role_add("locks").await.unwrap();
        admin
            .role_grant_permission("locks", Permission::read_write("app/").with_prefix())
            .await
            .unwrap();
        admin.user_add("app", "right-pw", None).await.unwrap();
        admin.user_grant_role("app", "locks").await.unwrap();
        admin.auth_enable().await.unwrap();

        round_trip(&format!(
            "etcd://{endpoint}/app?user=app&password=right-pw&timeout=2s"
        ))
        .await
        .expect("?user=&password= authenticate");
        let dead = format!("127.0.0.1:{}", free_port().unwrap());
        for wrong in ["hunter2-s3cret", "etcd", "lock"] {
            for url in [
                format!("etcd://{endpoint}/app?user=app&password={wrong}&timeout=2s"),
                format!("etcd://app:{wrong}@{endpoint}/app?timeout=2s"),
                format!("etcd://app:{wrong}@{dead}/app?timeout=500ms&connect_timeout=200ms"),
            ] {
                let cfg = EtcdConfig::parse(&url).unwrap();
                let shown = format!("{cfg:?}");
                assert!(!shown.contains(&format!("\"{wrong}\"")), "{shown}");
                let err = round_trip(&url).await.unwrap_err();
                let text = format!("{err} {err:?}");
                assert!(
                    !text.contains(&format!("={wrong}")) && !text.contains(&format!(":{wrong}@")),
                    "{url}: {text}"
                );
                if wrong == "hunter2-s3cret" {
                    assert!(!text.contains(wrong), "{url}: {text}");
                }
            }
        }
    })
    .await
    .expect("timed out");
}
