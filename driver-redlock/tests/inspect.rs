//! Inspecting a Redlock key while acquisitions run: between the grants and the fencing
//! write-back each instance's copy carries its own token, so an inspect then must not
//! report any of them as the holder's. Leader election observers rely on it: a term they
//! report must be the leader's.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::RedlockHarness;
use lockcore::{LockClient, Owner};

#[tokio::test(flavor = "multi_thread")]
async fn inspect_reports_only_the_holders_token() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let h = RedlockHarness::new(3);
        let holder = LockClient::new(h.builder().build().await.unwrap());
        let watcher = LockClient::new(h.builder().build().await.unwrap());
        let seen: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let looking = {
            let (watcher, seen, stop) = (watcher.clone(), seen.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    if let Some(info) = watcher.inspect("inspected").await.unwrap() {
                        seen.lock().unwrap().push((info.holder, info.token.0));
                    }
                }
            })
        };
        let mut tokens = HashMap::new();
        for i in 0..100 {
            let label = format!("holder-{i}");
            let guard = holder
                .lock("inspected")
                .owner(Owner::new(&label))
                .acquire()
                .await
                .unwrap();
            tokens.insert(label, guard.token().0);
            tokio::time::sleep(Duration::from_millis(2)).await;
            guard.release().await.unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        looking.await.unwrap();
        let seen = seen.lock().unwrap();
        let wrong: Vec<_> = seen
            .iter()
            .filter(|(label, token)| tokens.get(label) != Some(token))
            .collect();
        assert!(seen.len() > 20, "only {} looks saw a holder", seen.len());
        assert!(
            wrong.is_empty(),
            "{} of {} looks reported a token the holder does not have, e.g. {:?}",
            wrong.len(),
            seen.len(),
            &wrong[..wrong.len().min(3)]
        );
    })
    .await
    .unwrap();
}
