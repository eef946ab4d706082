//! Curator's layout: a node made as Curator's `InterProcessMutex` makes one
//! (`<path>/_c_<uuid>-lock-<seq>`, ephemeral sequential, the client's address as data) holds
//! the lock for distlock's clients of the same key, and a distlock holder's node sorts
//! first for a Curator contender by Curator's own rule (the text after `lock-`).

mod common;

use std::time::Duration;

use common::{random_root, test_config, url_from_env};
use distlock_zookeeper::zookeeper_client::{Acls, Client, CreateMode};
use distlock_zookeeper::{ZkBackend, ZkConfig};
use lockcore::{LockClient, LockKey};

/// Curator's sort key: the text after the last `lock-`.
fn curator_sequence(name: &str) -> &str {
    name.rfind("lock-")
        .map_or(name, |at| &name[at + "lock-".len()..])
}

#[tokio::test]
async fn curator_and_distlock_exclude_each_other() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let hosts = ZkConfig::parse(&url_from_env("DISTLOCK_TEST_ZK_URL"))
            .unwrap()
            .place();
        let root = random_root();
        let backend = ZkBackend::new(test_config(&hosts, &root));
        let path = backend.lock_path(&LockKey::new("shared-with-java").unwrap());
        let locks = LockClient::new(backend);
        let java = Client::connector()
            .with_session_timeout(Duration::from_secs(5))
            .connect(&hosts)
            .await
            .unwrap();
        let open = Acls::anyone_all();
        java.mkdir(&path, &CreateMode::Persistent.with_acls(open))
            .await
            .unwrap();

        // A Curator holder first: distlock waits, and shows it as the holder.
        let curator = format!("{path}/_c_0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9-lock-");
        let mode = CreateMode::EphemeralSequential.with_acls(open);
        let (stat, seq) = java.create(&curator, b"10.0.0.7", &mode).await.unwrap();
        let held = locks.lock("shared-with-java").try_acquire().await.unwrap();
        assert!(held.is_none(), "distlock took a key a Curator mutex holds");
        let info = locks.inspect("shared-with-java").await.unwrap().unwrap();
        assert_eq!(info.token.0, u64::try_from(stat.czxid).unwrap());
        assert!(info.holder.contains("10.0.0.7"), "{}", info.holder);
        java.delete(&format!("{curator}{seq}"), None).await.unwrap();

        // A distlock holder first: a Curator contender's node does not sort first.
        let g = locks
            .lock("shared-with-java")
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        let (_, seq) = java.create(&curator, b"10.0.0.7", &mode).await.unwrap();
        let mut children = java.list_children(&path).await.unwrap();
        children.sort_by(|a, b| curator_sequence(a).cmp(curator_sequence(b)));
        assert!(
            !children[0].starts_with("_c_0f1e2d3c"),
            "Curator would hold beside distlock: {children:?}"
        );
        java.delete(&format!("{curator}{seq}"), None).await.unwrap();
        g.release().await.unwrap();
    })
    .await
    .expect("the test did not finish in 30 s");
}
