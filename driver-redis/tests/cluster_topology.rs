//! What only a Redis Cluster has: locks spread over every master, releases announced on
//! the lock's shard alone over one pub/sub connection per node, and a slot migrated while
//! a lock is held and waited on. Against the shared test cluster (three masters, three
//! replicas); the tests of this file take turns, since they count the cluster's
//! subscriptions and move one of its slots.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::cluster::{cluster_ports, ClusterHarness};
use common::{bounded, key, raw};
use distlock_redis::redis::aio::MultiplexedConnection;
use distlock_redis::redis::{self, RedisResult};
use lockcore::driver::{ClaimRequest, SetOutcome};
use lockcore::{LockBackend, LockClient, LockKey, Owner};

/// The tests of this file take turns.
static TURNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A master of the cluster: its node id, port and slot ranges.
#[derive(Debug, Clone)]
struct Master {
    id: String,
    port: u16,
    slots: Vec<(u16, u16)>,
}

impl Master {
    fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

async fn node(port: u16) -> MultiplexedConnection {
    raw(&format!("redis://127.0.0.1:{port}/")).await
}

/// The masters, as the first node of the cluster sees them.
async fn masters() -> Vec<Master> {
    let mut conn = node(cluster_ports()[0]).await;
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut masters: Vec<Master> = nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if !fields.get(2)?.split(',').any(|f| f == "master") {
                return None;
            }
            let port = fields[1]
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect();
            Some(Master {
                id: fields[0].to_owned(),
                port,
                slots,
            })
        })
        .collect();
    masters.sort_by_key(|m| m.port);
    masters
}

async fn keyslot(conn: &mut MultiplexedConnection, name: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(name)
        .query_async(conn)
        .await
        .unwrap()
}

/// `PUBSUB SHARDNUMSUB channel` on one node.
async fn shard_subscribers(port: u16, channel: &str) -> i64 {
    let mut conn = node(port).await;
    let answer: (String, i64) = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query_async(&mut conn)
        .await
        .unwrap();
    answer.1
}

/// The connections to one node that hold sharded subscriptions (`ssub=` in `CLIENT LIST`).
async fn sharded_subscribers(port: u16) -> usize {
    let mut conn = node(port).await;
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    list.lines()
        .filter(|l| {
            l.split_whitespace()
                .any(|f| f.strip_prefix("ssub=").is_some_and(|n| n != "0"))
        })
        .count()
}

/// Polls `check` until it holds, within 5 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_spread_over_every_master_with_their_fence_keys() {
    let _turn = TURNS.lock().await;
    bounded(async {
        let harness = ClusterHarness::new();
        let locks = LockClient::new(harness.backend().await.unwrap());
        let masters = masters().await;
        assert_eq!(masters.len(), 3, "{masters:?}");
        let mut conn = node(masters[0].port).await;
        let mut per_master: BTreeMap<u16, usize> = BTreeMap::new();
        let mut guards = Vec::new();
        for i in 0..48 {
            let k = key(&format!("spread-{i}"));
            let guard = locks.lock(k.as_str()).acquire().await.unwrap();
            let names = distlock_redis::__redlock::names(&harness.prefix, &k);
            let slot = keyslot(&mut conn, &names.lock).await;
            assert_eq!(slot, keyslot(&mut conn, &names.fence()).await);
            assert_eq!(slot, keyslot(&mut conn, &names.leases()).await);
            assert_eq!(slot, keyslot(&mut conn, &names.channel()).await);
            let owner = masters.iter().find(|m| m.owns(slot)).unwrap();
            // The lock and its fence key are on the slot's master itself.
            let mut direct = node(owner.port).await;
            let stored: i64 = redis::cmd("EXISTS")
                .arg(&names.lock)
                .arg(names.fence())
                .query_async(&mut direct)
                .await
                .unwrap();
            assert_eq!(stored, 2, "{} on {}", names.lock, owner.port);
            *per_master.entry(owner.port).or_default() += 1;
            guards.push(guard);
        }
        assert_eq!(per_master.len(), 3, "{per_master:?}");
        let mut tokens = BTreeSet::new();
        for guard in guards {
            tokens.insert(guard.token());
            guard.release().await.unwrap();
        }
        assert_eq!(tokens.len(), 48);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_announced_on_its_shard_only_over_one_connection_per_node() {
    let _turn = TURNS.lock().await;
    bounded(async {
        let harness = ClusterHarness::new();
        let holder = LockClient::new(harness.backend().await.unwrap());
        let waiting = LockClient::new(harness.backend().await.unwrap());
        let masters = masters().await;
        let mut conn = node(masters[0].port).await;
        let ttl = Duration::from_secs(30);
        // Twelve locks held, each waited on by two tasks of one client.
        let mut held = Vec::new();
        let mut waiters = Vec::new();
        for i in 0..12 {
            let k = key(&format!("shard-{i}"));
            held.push(holder.lock(k.as_str()).ttl(ttl).acquire().await.unwrap());
            for _ in 0..2 {
                let waiting = waiting.clone();
                let k = k.clone();
                waiters.push(tokio::spawn(async move {
                    let guard = waiting.lock(k.as_str()).ttl(ttl).acquire().await.unwrap();
                    guard.release().await.unwrap();
                }));
            }
        }
        let names = |i: usize| {
            distlock_redis::__redlock::names(&harness.prefix, &key(&format!("shard-{i}")))
        };
        for i in 0..12 {
            let channel = names(i).channel();
            let slot = keyslot(&mut conn, &channel).await;
            let owner = masters.iter().find(|m| m.owns(slot)).unwrap().port;
            eventually(&format!("{channel} subscribed on {owner}"), || {
                let channel = channel.clone();
                async move { shard_subscribers(owner, &channel).await == 1 }
            })
            .await;
            for other in masters.iter().filter(|m| m.port != owner) {
                assert_eq!(shard_subscribers(other.port, &channel).await, 0);
            }
        }
        // One connection per master carries every subscription of the waiting client (the
        // holder's backend subscribes nothing).
        for m in &masters {
            assert_eq!(sharded_subscribers(m.port).await, 1, "master {}", m.port);
        }
        // Releases hand over long before the 30 s TTL: only the announcement can wake them.
        let started = tokio::time::Instant::now();
        for guard in held {
            guard.release().await.unwrap();
        }
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("a waiter was not woken by the release")
                .unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(5));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_renewals_keep_locks_on_every_master() {
    let _turn = TURNS.lock().await;
    bounded(async {
        let harness = ClusterHarness::new();
        let locks = LockClient::new(harness.backend().await.unwrap());
        // Taken together, so that their renewals fall due together and go out as batches,
        // one per hash slot.
        let ttl = Duration::from_millis(600);
        let taken = (0..64).map(|i| {
            let locks = locks.clone();
            async move {
                locks
                    .lock(format!("renewed-{i}"))
                    .ttl(ttl)
                    .acquire()
                    .await
                    .unwrap()
            }
        });
        let guards = futures_util::future::join_all(taken).await;
        tokio::time::sleep(ttl * 4).await;
        for (i, guard) in guards.iter().enumerate() {
            assert!(!guard.is_lost(), "renewed-{i} was lost");
            let info = locks.inspect(format!("renewed-{i}")).await.unwrap();
            assert_eq!(info.map(|i| i.token), Some(guard.token()), "renewed-{i}");
        }
        for guard in guards {
            guard.release().await.unwrap();
        }
    })
    .await;
}

/// Moves `slot` from `from` to `to` with its keys, as `redis-cli --cluster reshard` does.
async fn migrate(slot: u16, from: &Master, to: &Master, all: &[Master]) -> RedisResult<()> {
    let mut source = node(from.port).await;
    let mut target = node(to.port).await;
    let setslot = |how: &str, id: &str| {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot).arg(how).arg(id);
        cmd
    };
    let _: () = setslot("IMPORTING", &from.id)
        .query_async(&mut target)
        .await?;
    let _: () = setslot("MIGRATING", &to.id)
        .query_async(&mut source)
        .await?;
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query_async(&mut source)
            .await?;
        if keys.is_empty() {
            break;
        }
        let _: () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(to.port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query_async(&mut source)
            .await?;
    }
    for m in [to, from].into_iter().chain(all.iter()) {
        let mut conn = node(m.port).await;
        let _: () = setslot("NODE", &to.id).query_async(&mut conn).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_under_a_held_and_awaited_lock_keeps_the_holder_and_wakes_the_waiter() {
    let _turn = TURNS.lock().await;
    bounded(async {
        let harness = ClusterHarness::new();
        let holder = LockClient::new(harness.backend().await.unwrap());
        let waiting = LockClient::new(harness.backend().await.unwrap());
        let masters = masters().await;
        let k = key(&format!("migrating-{}", harness.prefix));
        let names = distlock_redis::__redlock::names(&harness.prefix, &k);
        let mut conn = node(masters[0].port).await;
        let slot = keyslot(&mut conn, &names.lock).await;
        let from = masters.iter().find(|m| m.owns(slot)).unwrap().clone();
        let to = masters
            .iter()
            .find(|m| m.port != from.port)
            .unwrap()
            .clone();

        // A short TTL: the watchdog renews every 200 ms, before, during and after the move.
        let ttl = Duration::from_millis(600);
        let guard = holder.lock(k.as_str()).ttl(ttl).acquire().await.unwrap();
        let token = guard.token();
        let (acquired_tx, mut acquired) = tokio::sync::oneshot::channel();
        let waiter = {
            let waiting = waiting.clone();
            let k = k.clone();
            tokio::spawn(async move {
                let guard = waiting
                    .lock(k.as_str())
                    .ttl(Duration::from_secs(30))
                    .acquire()
                    .await
                    .unwrap();
                let _ = acquired_tx.send(tokio::time::Instant::now());
                guard
            })
        };
        let channel = names.channel();
        eventually("the waiter's sharded subscription", || {
            let channel = channel.clone();
            async move { shard_subscribers(from.port, &channel).await == 1 }
        })
        .await;

        migrate(slot, &from, &to, &masters).await.unwrap();
        // The lock and its fence key moved with the slot.
        let mut target = node(to.port).await;
        let moved: i64 = redis::cmd("EXISTS")
            .arg(&names.lock)
            .arg(names.fence())
            .query_async(&mut target)
            .await
            .unwrap();
        assert_eq!(moved, 2);

        // Several renewals on the new master: the holder keeps the lock, the waiter waits.
        tokio::time::sleep(ttl * 3).await;
        assert!(
            !guard.is_lost(),
            "the holder lost the lock across the migration"
        );
        assert!(
            acquired.try_recv().is_err(),
            "the waiter acquired a held lock"
        );
        let info = holder.inspect(&k).await.unwrap().expect("held");
        assert_eq!(info.token, token);
        // The waiter subscribed again, on the new master.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while shard_subscribers(to.port, &channel).await != 1 {
            if tokio::time::Instant::now() > deadline {
                let on_old = shard_subscribers(from.port, &channel).await;
                let ended = if waiter.is_finished() {
                    format!("{:?}", waiter.await.map(|g| g.token()))
                } else {
                    "still waiting".to_owned()
                };
                panic!("the waiter did not subscribe on the new master (on the old one: {on_old}; waiter {ended})");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let released = tokio::time::Instant::now();
        guard.release().await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter was not woken after the migration")
            .unwrap();
        let woke = acquired.try_recv().unwrap();
        assert!(woke.duration_since(released) < Duration::from_secs(2));
        assert!(next.token() > token);
        next.release().await.unwrap();

        // Give the slot back, so the cluster is as the other tests found it.
        migrate(slot, &to, &from, &masters).await.unwrap();
    })
    .await;
}

/// `CLUSTER SETSLOT slot NODE <owner>` sent to the slot's own master (as `redis-cli
/// --cluster` does to every master after a move) drops that master's sharded subscriptions
/// of the slot, with no move at all. Sent over and over, some drops land while the
/// waiter's renewed subscription is on its way: a confirmation that arrives after such a
/// drop must not count, or the waiter sleeps unsubscribed through the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_dropped_over_and_over_by_their_own_master_leave_the_waiter_subscribed() {
    let _turn = TURNS.lock().await;
    bounded(async {
        let harness = ClusterHarness::new();
        let holder = LockClient::new(harness.backend().await.unwrap());
        let waiting = LockClient::new(harness.backend().await.unwrap());
        let masters = masters().await;
        let k = key(&format!("dropped-{}", harness.prefix));
        let names = distlock_redis::__redlock::names(&harness.prefix, &k);
        let channel = names.channel();
        let mut conn = node(masters[0].port).await;
        let slot = keyslot(&mut conn, &names.lock).await;
        let owner = masters.iter().find(|m| m.owns(slot)).unwrap().clone();

        let guard = holder
            .lock(k.as_str())
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        let waiter = {
            let waiting = waiting.clone();
            let k = k.clone();
            tokio::spawn(async move {
                waiting
                    .lock(k.as_str())
                    .ttl(Duration::from_secs(30))
                    .acquire()
                    .await
                    .unwrap()
            })
        };
        eventually("the waiter's sharded subscription", || {
            let channel = channel.clone();
            async move { shard_subscribers(owner.port, &channel).await == 1 }
        })
        .await;

        let mut on_owner = node(owner.port).await;
        for i in 0..1500u64 {
            let _: () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&owner.id)
                .query_async(&mut on_owner)
                .await
                .unwrap();
            // Room for the waiter to subscribe again, and a drop at a different moment of
            // its renewed subscription each time.
            tokio::time::sleep(Duration::from_micros(100 * (i % 10))).await;
        }
        eventually("the waiter subscribed again after the last drop", || {
            let channel = channel.clone();
            async move { shard_subscribers(owner.port, &channel).await == 1 }
        })
        .await;
        // No wake-up left to find the release but the announcement on the subscription.
        assert!(!waiter.is_finished(), "the waiter acquired a held lock");
        let token = guard.token();
        let released = tokio::time::Instant::now();
        guard.release().await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("the waiter slept through the release")
            .unwrap();
        assert!(released.elapsed() < Duration::from_secs(2));
        assert!(next.token() > token);
        next.release().await.unwrap();
    })
    .await;
}

/// In a Cluster a set is taken in one script only when every lock's name is in one slot
/// (each key is its own hash tag, so that is chance); otherwise key by key (`None`), and a
/// set taken either way holds every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_take_one_script_only_within_a_slot() {
    bounded(async {
        let h = ClusterHarness::new();
        let b = h.backend().await.unwrap();
        let name = |k: &LockKey| distlock_redis::__redlock::names(&h.prefix, k).lock;
        let base = key("set-0");
        let slot = common::cluster::key_slot(&name(&base));
        let mut candidates = (1..200_000).map(|i| key(&format!("set-{i}")));
        let same = candidates
            .find(|k| common::cluster::key_slot(&name(k)) == slot)
            .expect("a key in the same slot");
        let apart = key("set-apart");
        assert_ne!(common::cluster::key_slot(&name(&apart)), slot);
        let o = Owner::new("set");
        let ttl = Duration::from_secs(30);
        let mut together = [base.clone(), same];
        together.sort();
        let requests: Vec<_> = together
            .iter()
            .map(|k| ClaimRequest::exclusive(k, &o, ttl))
            .collect();
        let answer = b.claim_all(&requests).await.unwrap();
        assert!(
            matches!(&answer, Some(SetOutcome::Acquired(g)) if g.len() == 2),
            "{answer:?}"
        );
        for k in &together {
            b.release(k, &o).await.unwrap();
        }
        let mut split = [base, apart];
        split.sort();
        let requests: Vec<_> = split
            .iter()
            .map(|k| ClaimRequest::exclusive(k, &o, ttl))
            .collect();
        assert_eq!(b.claim_all(&requests).await.unwrap(), None);
        let client = LockClient::new(b.clone());
        let set = client
            .lock_all(split.iter().map(|k| k.as_str()))
            .acquire()
            .await
            .unwrap();
        set.release().await.unwrap();
    })
    .await;
}
