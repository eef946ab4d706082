//! Reading a Redlock holder's token back: between the grants and the fencing write-back
//! each instance's copy carries its own token, so neither an inspect nor a renewal may
//! report one of those as the holder's. Leader election observers rely on it: a term they
//! report must be the leader's.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::RedlockHarness;
use driver_redis::redis::AsyncCommands;
use lockcore::{AcquireOutcome, ExtendOutcome, LockBackend, LockClient, LockKey, Owner};

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

/// A renewal answers the holder's token T, the one on the written-back copies (`0T`), even
/// when most renewing instances still hold copies not written back that agree on another.
#[tokio::test(flavor = "multi_thread")]
async fn extend_answers_the_written_back_token() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let h = RedlockHarness::new(5);
        let b = h.builder().build().await.unwrap();
        let (k, o) = (LockKey::new("extended").unwrap(), Owner::new("o"));
        let ttl = Duration::from_secs(10);
        let AcquireOutcome::Acquired(grant) = b.try_acquire(&k, &o, ttl).await.unwrap() else {
            panic!("a fresh key was held");
        };
        let lock = driver_redis::__redlock::names(&h.prefix, &k).lock;
        let stale = format!("{} 5 o", o.token().to_hex());
        for (i, url) in h.urls.iter().enumerate() {
            let client = driver_redis::redis::Client::open(url.as_str()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            match i {
                // Copies as their instances granted them: token 5, not written back.
                0 | 1 => {
                    let _: () = driver_redis::redis::cmd("SET")
                        .arg(&lock)
                        .arg(&stale)
                        .arg("KEEPTTL")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
                // The written-back copy.
                2 => {
                    let value: String = conn.get(&lock).await.unwrap();
                    assert!(value.contains(&format!(" 0{} ", grant.token.0)), "{value}");
                }
                // No copy: these answer that the owner does not hold it.
                _ => {
                    let _: () = conn.del(&lock).await.unwrap();
                }
            }
        }
        match b.extend(&k, &o, ttl).await.unwrap() {
            ExtendOutcome::Extended(renewed) => assert_eq!(renewed.token, grant.token),
            ExtendOutcome::NotHeld => panic!("three copies of five did not renew"),
        }
    })
    .await
    .unwrap();
}
