//! A Redis Cluster master killed under contention, on a cluster of its own: its replica
//! takes its slots, the client follows within the cluster's failover time, a lock held on
//! it either stays or is reported lost, and tokens keep rising.

mod common;

use std::time::Duration;

use common::cluster::{key_slot, ClusterSet};
use common::contention::{Contenders, Outcome};
use common::{bounded, TIMEOUT};
use distlock_redis::RedisBackend;
use lockcore::{LockClient, RetryPolicy};

async fn client(set: &ClusterSet) -> LockClient {
    LockClient::new(
        RedisBackend::builder(set.url())
            .prefix("failover:")
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .build()
            .await
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_hands_its_slots_to_its_replica_and_tokens_keep_rising() {
    bounded(async {
        let mut set = ClusterSet::start().await.unwrap();
        let masters = set.masters().await.unwrap();
        let owner = |name: &str| {
            let slot = key_slot(&format!("failover:{{{name}}}"));
            masters
                .iter()
                .find(|(_, slots)| slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
                .map(|(port, _)| *port)
                .unwrap()
        };
        let doomed = owner("counter");
        // A lock held on the same master the whole time, renewed by the watchdog.
        let held_key = (0..)
            .map(|i| format!("held-{i}"))
            .find(|k| owner(k) == doomed)
            .unwrap();
        let holder = client(&set).await;
        let held = holder
            .lock(held_key.as_str())
            .ttl(Duration::from_secs(6))
            .acquire()
            .await
            .unwrap();

        // And a waiter of another client on it, across the failover: it retries what fails
        // meanwhile, as a caller that waits through failovers asks it to.
        let waiting = client(&set).await;
        let waiter = {
            let held_key = held_key.clone();
            tokio::spawn(async move {
                waiting
                    .lock(held_key.as_str())
                    .ttl(Duration::from_secs(6))
                    .retry(RetryPolicy::new().max_elapsed(Duration::from_secs(30)))
                    .acquire()
                    .await
            })
        };

        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(client(&set).await);
        }
        let contenders = Contenders::start(clients, "counter");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before_kill = contenders.highest().expect("grants before the kill");
        let killed_ms = contenders.now_ms();
        set.kill(doomed);

        // Grants resume once the replica took the slots.
        let recovered = contenders.grant_after(killed_ms).await;
        // Every node learns of the promotion by gossip: wait until the one asked knows.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let promoted = loop {
            let masters = set.masters().await.unwrap();
            if masters.len() == 3 {
                break masters;
            }
            assert!(tokio::time::Instant::now() < deadline, "{masters:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(promoted.iter().all(|(port, _)| *port != doomed));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Outcome {
            stale,
            above: after,
        } = contenders.stop(before_kill).await;
        assert!(after > 0);
        assert_eq!(
            stale, 0,
            "a grant after the failover had a token below an earlier one"
        );

        // The held lock either survived on the promoted replica (same token) or its holder
        // was told it is lost.
        let now = holder.inspect(held_key.as_str()).await.unwrap();
        let kept = now.as_ref().is_some_and(|info| info.token == held.token());
        assert!(
            kept || held.is_lost(),
            "the held lock is gone ({now:?}) but its holder was not told"
        );
        if kept {
            // The waiter subscribed again, on the replica that took the slot.
            let channel = format!("failover:{{{held_key}}}:released");
            let new_owner = promoted
                .iter()
                .find(|(_, slots)| {
                    let slot = key_slot(&channel);
                    slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
                })
                .map(|(port, _)| *port)
                .unwrap();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let mut conn = common::raw(&format!("redis://127.0.0.1:{new_owner}/")).await;
                let (_, subscribers): (String, i64) = distlock_redis::redis::cmd("PUBSUB")
                    .arg("SHARDNUMSUB")
                    .arg(&channel)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if subscribers == 1 {
                    break;
                }
                if tokio::time::Instant::now() > deadline {
                    let ended = if waiter.is_finished() {
                        format!("{:?}", waiter.await.map(|r| r.map(|g| g.token())))
                    } else {
                        "still waiting".to_owned()
                    };
                    panic!("the waiter did not subscribe on the promoted replica ({ended})");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            held.release().await.unwrap();
            let next = tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("the waiter was not served after the release")
                .unwrap()
                .unwrap();
            next.release().await.unwrap();
        } else {
            waiter.abort();
        }
        eprintln!(
            "killed master: grants resumed {recovered:?} after the kill ({after} grants after it); \
             the lock held on it was {}",
            if kept { "kept" } else { "lost, and reported" }
        );
    })
    .await;
}
