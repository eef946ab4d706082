//! Failovers under Redis Sentinel, each on a master, replica and three sentinels of its own:
//! the client follows the new master, waiters are woken there, tokens keep rising, and
//! with no master at all a request fails as `Unavailable` instead of hanging.

mod common;

use std::time::Duration;

use common::contention::{Contenders, Outcome};
use common::sentinel::{SentinelSet, MASTER};
use common::{bounded, TIMEOUT};
use distlock_redis::RedisBackend;
use lockcore::{LockClient, LockError};

async fn client(set: &SentinelSet, prefix: &str) -> LockClient {
    LockClient::new(
        RedisBackend::builder(set.url())
            .prefix(prefix)
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .build()
            .await
            .unwrap(),
    )
}

/// Waits until the sentinels name a master other than `old`; returns its port.
async fn new_master(set: &SentinelSet, old: u16) -> u16 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(port) = set.named_master().await.filter(|&p| p != old) {
            return port;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sentinels named no new master within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_moves_the_holder_and_its_waiter_to_the_new_master() {
    bounded(async {
        // The old master cannot be made a replica (as if cut off from the sentinels): it
        // stays a master for the whole test, and what is published on the new one never
        // reaches it.
        let set = SentinelSet::start_with(&[
            "--rename-command",
            "REPLICAOF",
            "",
            "--rename-command",
            "SLAVEOF",
            "",
        ])
        .await
        .unwrap();
        let holder = client(&set, "failover:").await;
        let waiting = client(&set, "failover:").await;
        // A long TTL, so that only the release's announcement can wake the waiter soon.
        let guard = holder
            .lock("ledger")
            .ttl(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        let before = guard.token();
        let (woken_tx, woken) = tokio::sync::oneshot::channel();
        let waiter = tokio::spawn(async move {
            let next = waiting
                .lock("ledger")
                .ttl(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            let _ = woken_tx.send(tokio::time::Instant::now());
            next
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A failover the sentinels run while both servers live: the old master becomes a
        // replica and answers writes with READONLY.
        let mut sentinel =
            common::raw(&format!("redis://127.0.0.1:{}/", set.sentinel_ports[0])).await;
        let started = tokio::time::Instant::now();
        let _: String = distlock_redis::redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(MASTER)
            .query_async(&mut sentinel)
            .await
            .unwrap();
        let promoted = new_master(&set, set.master_port).await;
        assert_eq!(promoted, set.replica_port);
        let named = started.elapsed();

        // The old master still answers as a master (a sentinel turns it into a replica within
        // 10 s); the holder's renewals must go to the new one from the announcement on.
        let pttl = |port: u16| async move {
            let mut conn = common::raw(&format!("redis://127.0.0.1:{port}/")).await;
            let ms: i64 = distlock_redis::redis::cmd("PTTL")
                .arg("failover:{ledger}")
                .query_async(&mut conn)
                .await
                .unwrap();
            ms
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.extend().await.unwrap();
            // Renewed to 10 s on the new master, while the old master's copy runs down.
            if pttl(promoted).await > 9_800 && pttl(set.master_port).await < 9_500 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the holder's renewals did not move to the new master"
            );
        }
        let followed = started.elapsed();
        // The waiter subscribed again, on the new master (the old one, still a master,
        // never hears of releases there).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let mut conn = common::raw(&format!("redis://127.0.0.1:{promoted}/")).await;
            let (_, subscribers): (String, i64) = distlock_redis::redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg("failover:{ledger}:released")
                .query_async(&mut conn)
                .await
                .unwrap();
            if subscribers == 1 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the waiter did not subscribe on the new master"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let info = holder.inspect("ledger").await.unwrap().expect("held");
        assert_eq!(info.token, before);
        assert!(!guard.is_lost(), "the holder lost its lock in a planned failover");

        let released = tokio::time::Instant::now();
        guard.release().await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter was not woken on the new master")
            .unwrap();
        let woke = woken.await.unwrap();
        assert!(woke.duration_since(released) < Duration::from_secs(2));
        assert!(next.token() > before);
        next.release().await.unwrap();
        eprintln!("planned failover: the sentinels named the new master {named:?} after SENTINEL FAILOVER; the holder renewed there at {followed:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_under_contention_is_followed_and_tokens_keep_rising() {
    bounded(async {
        let mut set = SentinelSet::start().await.unwrap();
        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(client(&set, "killed:").await);
        }
        let contenders = Contenders::start(clients, "counter");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before_kill = contenders.highest().expect("grants before the kill");
        let killed_ms = contenders.now_ms();
        set.master.take().unwrap().kill();
        let promoted = new_master(&set, set.master_port).await;
        assert_eq!(promoted, set.replica_port);
        // Grants resume on the new master.
        let recovered = contenders.grant_after(killed_ms).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Outcome {
            stale,
            above: after,
        } = contenders.stop(before_kill).await;
        // Tokens kept rising across the failover: the new master's grants were all above
        // the old master's, so the register accepted them.
        assert!(after > 0);
        assert_eq!(
            stale, 0,
            "a grant on the new master had a token below an earlier one"
        );
        eprintln!(
            "killed master: grants resumed {recovered:?} after the kill ({after} grants after it)"
        );

        // No master left at all: a request is refused promptly, not hung.
        set.replica.take().unwrap().kill();
        let locks = client_or_unavailable(&set).await;
        if let Some(locks) = locks {
            let started = tokio::time::Instant::now();
            let outcome = locks.lock("counter").try_acquire().await;
            assert!(
                matches!(outcome, Err(LockError::Unavailable { .. })),
                "{outcome:?}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{:?}",
                started.elapsed()
            );
        }
    })
    .await;
}

/// A client of `set`, or `None` when connecting already says `Unavailable` (promptly).
async fn client_or_unavailable(set: &SentinelSet) -> Option<LockClient> {
    let started = tokio::time::Instant::now();
    let built = RedisBackend::builder(set.url())
        .prefix("killed:")
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .build()
        .await;
    match built {
        Ok(backend) => Some(LockClient::new(backend)),
        Err(e) => {
            assert!(matches!(e, LockError::Unavailable { .. }), "{e}");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{:?}",
                started.elapsed()
            );
            None
        }
    }
}

/// The switch announcement is the fast path; a demoted master's `READONLY` is the path
/// that does not depend on hearing it. Here the sentinels are told of the new master
/// without a failover (removed, then set to monitor it), so nothing is announced: the
/// first write to the demoted master fails as `Unavailable`, and the next request goes to
/// the master the sentinels name now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_master_answering_readonly_sends_the_client_to_the_master_named_now() {
    bounded(async {
        let set = SentinelSet::start().await.unwrap();
        let locks = client(&set, "readonly:").await;
        let first = locks.lock("a").try_acquire().await.unwrap().expect("free");
        first.release().await.unwrap();
        // The backend's listener subscribed (it asks the sentinels once more then): from
        // here on only READONLY can tell the client its master changed.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let mut listening = 0;
            for &s in &set.sentinel_ports {
                let mut conn = common::raw(&format!("redis://127.0.0.1:{s}/")).await;
                // Sentinels have no PUBSUB command: count subscribed connections.
                let clients: String = distlock_redis::redis::cmd("CLIENT")
                    .arg("LIST")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let n = clients
                    .lines()
                    .filter(|l| l.split_whitespace().any(|f| f.strip_prefix("sub=").is_some_and(|n| n != "0")))
                    .count();
                listening += n;
            }
            if listening == 1 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the backend does not listen to the sentinels"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let again = locks.lock("a").try_acquire().await.unwrap().expect("free");
        again.release().await.unwrap();

        let cmd = |port: u16, args: &'static [&'static str]| async move {
            let mut conn = common::raw(&format!("redis://127.0.0.1:{port}/")).await;
            let mut cmd = distlock_redis::redis::cmd(args[0]);
            for a in &args[1..] {
                cmd.arg(*a);
            }
            let _: distlock_redis::redis::Value = cmd.query_async(&mut conn).await.unwrap();
        };
        for &s in &set.sentinel_ports {
            cmd(s, &["SENTINEL", "REMOVE", MASTER]).await;
        }
        cmd(set.replica_port, &["REPLICAOF", "NO", "ONE"]).await;
        let mut old = common::raw(&format!("redis://127.0.0.1:{}/", set.master_port)).await;
        let _: () = distlock_redis::redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(set.replica_port)
            .query_async(&mut old)
            .await
            .unwrap();
        for &s in &set.sentinel_ports {
            let mut conn = common::raw(&format!("redis://127.0.0.1:{s}/")).await;
            let _: () = distlock_redis::redis::cmd("SENTINEL")
                .arg("MONITOR")
                .arg(MASTER)
                .arg("127.0.0.1")
                .arg(set.replica_port)
                .arg(2)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        assert_eq!(set.named_master().await, Some(set.replica_port));

        // The client still talks to the old master, now a replica.
        let started = tokio::time::Instant::now();
        let mut failures = 0;
        let guard = loop {
            match locks.lock("b").try_acquire().await {
                Ok(Some(guard)) => break guard,
                Ok(None) => panic!("\"b\" is free"),
                Err(e) => {
                    assert!(
                        matches!(e, LockError::Unavailable { .. }) && e.is_retryable(),
                        "{e}"
                    );
                    failures += 1;
                    assert!(
                        started.elapsed() < Duration::from_secs(5),
                        "still failing after {failures} attempts: {}", lockcore::ErrorChain(&e)
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        let mut new = common::raw(&format!("redis://127.0.0.1:{}/", set.replica_port)).await;
        let held: i64 = distlock_redis::redis::cmd("EXISTS")
            .arg("readonly:{b}")
            .query_async(&mut new)
            .await
            .unwrap();
        assert_eq!(held, 1, "the lock is not on the master the sentinels name");
        guard.release().await.unwrap();
        eprintln!(
            "READONLY rediscovery: {failures} error(s) reached the caller; served by the new master after {:?}",
            started.elapsed()
        );
    })
    .await;
}
