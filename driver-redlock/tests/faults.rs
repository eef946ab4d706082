//! Redlock's own fault scenarios, each on redis-server processes of its own: a minority
//! killed, a majority killed, an instance frozen, a minority restarted empty with the `TIME`
//! floor switched off — plus the URL syntax against the shared servers.

mod common;

use std::time::{Duration, Instant};

use common::{RedlockFaultStore, RedlockHarness, INSTANCE_TIMEOUT};
use conformance_tests::FaultLink;
use distlock_redlock::RedlockBackend;
use driver_redis::RedisBackend;
use lockcore::driver::LockBackendExt;
use lockcore::{FencingToken, LockBackend, LockClient, LockError, LockKey};

const TTL: Duration = Duration::from_secs(2);

fn run<F: std::future::Future<Output = ()>>(limit: Duration, test: F) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(limit, test)
            .await
            .expect("the test did not finish in time")
    });
}

/// Whether instance `i` of `store` holds `key` (read with the single-instance driver).
async fn held_on(store: &RedlockFaultStore, i: usize, key: &str) -> bool {
    let single = RedisBackend::builder(store.url(i))
        .prefix(&store.prefix)
        .build()
        .await
        .unwrap();
    single
        .inspect(&LockKey::new(key).unwrap())
        .await
        .unwrap()
        .is_some()
}

async fn cycle(client: &LockClient, key: &str) -> (FencingToken, Duration) {
    let started = Instant::now();
    let guard = client
        .lock(key)
        .ttl(TTL)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("acquire {key}: {e}"));
    let took = started.elapsed();
    let token = guard.token();
    guard.release().await.unwrap();
    (token, took)
}

/// With two of five instances killed, acquisitions still succeed, and tokens rise.
#[test]
fn two_of_five_killed_still_acquire() {
    run(Duration::from_secs(30), async {
        let store = RedlockFaultStore::start(5).await.unwrap();
        let client = LockClient::new(store.builder().build().await.unwrap());
        let (before, _) = cycle(&client, "k").await;
        store.kill(1).await;
        store.kill(3).await;
        let mut last = before;
        for i in 0..10 {
            let (token, _) = cycle(&client, if i % 2 == 0 { "k" } else { "other" }).await;
            if i % 2 == 0 {
                assert!(token > last, "{token} after {last}");
                last = token;
            }
        }
    });
}

/// With three of five killed, an attempt fails with `QuorumNotReached` within twice the
/// per-instance timeout, and the two survivors hold nothing afterwards.
#[test]
fn three_of_five_killed_is_quorum_not_reached() {
    run(Duration::from_secs(30), async {
        let store = RedlockFaultStore::start(5).await.unwrap();
        let backend = store.builder().build().await.unwrap();
        let client = LockClient::new(backend.clone());
        cycle(&client, "k").await;
        for i in [0, 2, 4] {
            store.kill(i).await;
        }
        for attempt in 0..3 {
            let started = Instant::now();
            let err = client.lock("k").ttl(TTL).try_acquire().await.unwrap_err();
            let took = started.elapsed();
            assert!(
                matches!(
                    err,
                    LockError::QuorumNotReached {
                        got: 2,
                        needed: 3,
                        ..
                    }
                ),
                "attempt {attempt}: {err:?}"
            );
            // The message names each instance that failed, and how.
            let message = err.to_string();
            println!("{message}");
            assert!(
                message.starts_with(
                    "quorum not reached while acquiring \"k\": 2 of 5 instances answered, 3 needed; "
                ),
                "{message}"
            );
            for i in [0, 2, 4] {
                let addr = store
                    .url(i)
                    .trim_start_matches("redis://")
                    .trim_end_matches('/')
                    .to_owned();
                assert!(
                    message.contains(&format!("{addr}: ")),
                    "instance {addr} is not named: {message}"
                );
            }
            assert!(
                message.matches("refused").count() == 3 || message.contains("timed out"),
                "{message}"
            );
            assert!(err.is_retryable());
            assert!(
                took <= INSTANCE_TIMEOUT * 2,
                "attempt {attempt} took {took:?}"
            );
            // Nothing of the attempt stays on the survivors.
            assert!(!held_on(&store, 1, "k").await, "instance 1 still holds k");
            assert!(!held_on(&store, 3, "k").await, "instance 3 still holds k");
        }
        // And with a majority answering but blocked, it is contention, not a quorum error.
        store.restart(0).await;
        let other = LockClient::new(store.builder().build().await.unwrap());
        let held = other
            .lock("c")
            .ttl(TTL)
            .try_acquire()
            .await
            .unwrap()
            .unwrap();
        assert!(client
            .lock("c")
            .ttl(TTL)
            .try_acquire()
            .await
            .unwrap()
            .is_none());
        held.release().await.unwrap();
    });
}

/// With one of five frozen (SIGSTOP), acquisitions succeed within the per-instance timeout;
/// after SIGCONT that instance holds no grant beyond its TTL.
#[test]
fn frozen_instance_does_not_stall_acquisitions() {
    run(Duration::from_secs(30), async {
        let store = RedlockFaultStore::start(5).await.unwrap();
        let client = LockClient::new(store.builder().build().await.unwrap());
        cycle(&client, "warm").await;
        store.signal(2, "STOP").await;
        let keys: Vec<String> = (0..10).map(|i| format!("f{i}")).collect();
        for key in &keys {
            let (_, took) = cycle(&client, key).await;
            assert!(took <= INSTANCE_TIMEOUT, "{key}: acquire took {took:?}");
        }
        // Acquisitions that fail on contention must not leave a grant on it either.
        let held = client.lock("f0").ttl(TTL).acquire().await.unwrap();
        let loser = LockClient::new(store.builder().build().await.unwrap());
        assert!(loser
            .lock("f0")
            .ttl(TTL)
            .try_acquire()
            .await
            .unwrap()
            .is_none());
        held.release().await.unwrap();
        store.signal(2, "CONT").await;
        // The instance now runs the grants and releases queued for it, in order.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let queued_left: Vec<&String> = {
            let mut left = Vec::new();
            for key in &keys {
                if held_on(&store, 2, key).await {
                    left.push(key);
                }
            }
            left
        };
        if !queued_left.is_empty() {
            // At most until the TTL: nothing may outlive it.
            tokio::time::sleep(TTL).await;
            for key in &keys {
                assert!(!held_on(&store, 2, key).await, "{key} outlived its TTL");
            }
        }
        assert!(
            queued_left.is_empty(),
            "grants stayed on the thawed instance until their TTL: {queued_left:?}"
        );
    });
}

/// A minority restarted empty — one instance, then two, with the two up-to-date others
/// cut off for the last acquisition — still yields rising tokens with the `TIME` floor
/// switched off: only the write-back carries the token from one majority to the next.
/// Without fencing the light grant script keeps no counter: every token is 0.
#[test]
fn minority_restarted_empty_tokens_still_rise_without_time_floor() {
    run(Duration::from_secs(60), async {
        for fencing in [true, false] {
            let store = RedlockFaultStore::start(5).await.unwrap();
            let client = LockClient::new(
                store
                    .builder()
                    .time_floor(false)
                    .fencing(fencing)
                    .build()
                    .await
                    .unwrap(),
            );
            let mut tokens = Vec::new();
            for _ in 0..3 {
                tokens.push(cycle(&client, "k").await.0);
            }
            // Instance 0 loses its counter.
            store.kill(0).await;
            store.restart(0).await;
            tokens.push(cycle(&client, "k").await.0);
            // Instances 1 and 2 lose theirs, and 3 and 4 (which kept theirs) are cut off:
            // the next majority is {0, 1, 2}, which shares only instance 0 with the last one.
            store.kill(3).await;
            store.kill(4).await;
            store.kill(1).await;
            store.kill(2).await;
            store.restart(1).await;
            store.restart(2).await;
            tokens.push(cycle(&client, "k").await.0);
            let rising = tokens.windows(2).all(|w| w[1] > w[0]);
            if fencing {
                assert!(rising, "tokens did not rise with fencing: {tokens:?}");
                // Small counters, not microsecond timestamps: the floor really was off.
                assert!(tokens.iter().all(|t| t.0 < 1000), "{tokens:?}");
            } else {
                assert!(
                    tokens.iter().all(|t| t.0 == 0),
                    "without fencing every token is 0: {tokens:?}"
                );
            }
        }
    });
}

/// The `redlock://` URL connects to the shared servers with its options applied; malformed
/// URLs are configuration errors that never show the password.
/// A failed attempt is undone on the instances that had not answered it by a release that
/// must reach each of them before the same owner's next grant: queued behind it, the
/// release would delete the copy that grant just (re)made. On one thread, nothing spawned
/// runs before the test's next request is sent, so a release left to a background task
/// would always land behind it.
#[test]
fn an_abandoned_attempts_release_never_deletes_the_same_owners_next_grant() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let mut store = RedlockFaultStore::start(5).await.unwrap();
            store.fencing = false;
            let (backend, link) = store.proxied_backend().await.unwrap();
            let key = LockKey::new("abandoned").unwrap();
            // Another owner holds instances 0..3 for a short while.
            let other = store.builder().build().await.unwrap();
            let short = Duration::from_millis(300);
            let taken = Instant::now();
            let x = lockcore::Owner::new("x");
            assert!(matches!(
                other.try_acquire(&key, &x, short).await.unwrap(),
                lockcore::driver::AcquireOutcome::Acquired(_)
            ));
            for i in 3..5 {
                let single = RedisBackend::builder(store.url(i))
                    .prefix(&store.prefix)
                    .build()
                    .await
                    .unwrap();
                single.force_release(&key).await.unwrap();
            }
            // Instances 3 and 4 answer late: the attempt is decided (held) without them,
            // after their grants were sent.
            for i in 3..5 {
                conformance_tests::FaultLink::delay_answers(
                    &link.proxies[i],
                    Duration::from_millis(400),
                )
                .await;
            }
            let owner = lockcore::Owner::new("o");
            let first = backend.try_acquire(&key, &owner, TTL).await.unwrap();
            assert!(
                matches!(first, lockcore::driver::AcquireOutcome::Held(_)),
                "{first:?}"
            );
            // Let the other owner's lease run out without yielding to the runtime.
            std::thread::sleep(
                (taken + short + Duration::from_millis(50))
                    .saturating_duration_since(Instant::now()),
            );
            let second = backend.try_acquire(&key, &owner, TTL).await.unwrap();
            assert!(
                matches!(second, lockcore::driver::AcquireOutcome::Acquired(_)),
                "{second:?}"
            );
            // Requests are applied at once (only answers are delayed): the release of the
            // first attempt ran before the second grant on 3 and 4, which keep the copy.
            for i in 3..5 {
                assert!(
                    held_on(&store, i, "abandoned").await,
                    "instance {i} lost the copy"
                );
            }
            backend.release(&key, &owner).await.unwrap();
        })
        .await
        .expect("the test did not finish in time")
    });
}

#[test]
fn urls_connect_and_malformed_ones_are_config_errors() {
    run(Duration::from_secs(30), async {
        let harness = RedlockHarness::new(5);
        let hosts: Vec<String> = harness
            .urls
            .iter()
            .map(|u| {
                u.trim_start_matches("redis://")
                    .trim_end_matches('/')
                    .to_owned()
            })
            .collect();
        let url = format!(
            "redlock://{}?prefix={}&timeout=250ms&fencing=false",
            hosts.join(","),
            harness.prefix
        );
        let backend = distlock_redlock::connect(&url).await.unwrap();
        assert_eq!(backend.instances(), 5);
        assert_eq!(backend.quorum(), 3);
        assert_eq!(backend.prefix(), harness.prefix);
        assert!(!backend.fencing());
        let client = LockClient::new(backend);
        cycle(&client, "url").await;
        for bad in [
            "redlock://u:s3cret@127.0.0.1:1,127.0.0.1:x",
            "redlock://u:s3cret@127.0.0.1:1?nope=1",
            "redis://127.0.0.1:1",
        ] {
            match distlock_redlock::connect(bad).await {
                Err(e @ LockError::Config { .. }) => {
                    assert!(!e.to_string().contains("s3cret"), "{e}")
                }
                other => panic!("{bad}: {:?}", other.map(|_| ())),
            }
        }
        // Every instance unreachable: not a configuration problem, a quorum one.
        let dead = format!(
            "redlock://127.0.0.1:{}",
            conformance_tests::process::free_port().unwrap()
        );
        match RedlockBackend::builder_from_url(&dead)
            .unwrap()
            .build()
            .await
        {
            Err(
                e @ LockError::QuorumNotReached {
                    got: 0, needed: 1, ..
                },
            ) => {
                let message = e.to_string();
                let addr = dead.trim_start_matches("redlock://");
                assert!(
                    message.contains(&format!("{addr}: ")) && message.contains("refused"),
                    "{message}"
                );
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
    });
}

/// An attempt refused by a majority is undone on the instances that had not answered yet,
/// too: its grant, still queued on a frozen instance where the key happened to be free, is
/// released right behind it instead of staying there until its TTL.
#[test]
fn refused_attempt_is_undone_on_a_frozen_instance() {
    run(Duration::from_secs(30), async {
        let store = RedlockFaultStore::start(5).await.unwrap();
        let holder = LockClient::new(store.builder().build().await.unwrap());
        let loser = LockClient::new(store.builder().build().await.unwrap());
        // Both connected to every instance before one freezes.
        cycle(&holder, "warm").await;
        cycle(&loser, "warm").await;
        let ttl = Duration::from_secs(10);
        let held = holder
            .lock("g")
            .ttl(ttl)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        // Instance 2 lost the holder's copy (a break-lock there, or a restart).
        let single = RedisBackend::builder(store.url(2))
            .prefix(&store.prefix)
            .build()
            .await
            .unwrap();
        single
            .force_release(&LockKey::new("g").unwrap())
            .await
            .unwrap();
        store.signal(2, "STOP").await;
        // Refused (or, on a loaded machine, too few answers in time): undone either way.
        let attempt = loser.lock("g").ttl(ttl).try_acquire().await;
        assert!(
            !matches!(attempt, Ok(Some(_))),
            "granted a lock held on four instances"
        );
        store.signal(2, "CONT").await;
        // The thawed instance runs the queued grant, then the release queued behind it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !held_on(&store, 2, "g").await,
            "the refused attempt's grant stayed on the instance that had not answered"
        );
        held.release().await.unwrap();
    });
}

/// An extension that renews only a minority of the copies (the lock was broken on three
/// of five instances) is not an extension: the holder hears that it no longer holds it.
#[test]
fn extend_renewing_a_minority_is_not_held() {
    run(Duration::from_secs(30), async {
        let store = RedlockFaultStore::start(5).await.unwrap();
        let backend = store.builder().build().await.unwrap();
        let (key, owner) = (LockKey::new("m").unwrap(), lockcore::Owner::new("holder"));
        let ttl = Duration::from_secs(10);
        let mut granted = false;
        for _ in 0..50 {
            // Retried: a loaded machine may miss the instance timeout.
            if let Ok(lockcore::driver::AcquireOutcome::Acquired(_)) =
                backend.try_acquire(&key, &owner, ttl).await
            {
                granted = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(granted, "a free key was never granted");
        for i in 0..3 {
            let single = RedisBackend::builder(store.url(i))
                .prefix(&store.prefix)
                .build()
                .await
                .unwrap();
            single.force_release(&key).await.unwrap();
        }
        let extended = backend.extend(&key, &owner, ttl).await;
        assert!(
            !matches!(extended, Ok(lockcore::driver::ExtendOutcome::Extended(_))),
            "renewed on two of five instances, the extension still succeeded"
        );
    });
}

/// A grant whose two rounds (the grant, then the fence write-back) together outlast the
/// lease's validity, every answer slow but each round within the instance timeout, is not
/// handed out: the attempt is undone and answers contention, never a guard whose lease has
/// already ended.
#[test]
fn a_grant_later_than_its_validity_is_not_handed_out() {
    run(Duration::from_secs(30), async {
        let store = RedlockFaultStore::start(3).await.unwrap();
        let (backend, link) = store.proxied_backend().await.unwrap();
        let client = LockClient::new(backend);
        cycle(&client, "warm").await; // connected to every instance
        let ttl = Duration::from_millis(300);
        let delay = Duration::from_millis(200);
        assert!(delay < INSTANCE_TIMEOUT && delay * 2 > ttl);
        link.delay_answers(delay).await;
        let started = Instant::now();
        let attempt = client.lock("late").ttl(ttl).try_acquire().await;
        let took = started.elapsed();
        link.delay_answers(Duration::ZERO).await;
        match attempt {
            Ok(None) | Err(_) => {}
            Ok(Some(g)) => panic!(
                "a grant that took {took:?} for a {ttl:?} lease was handed out (valid_until \
                 {:?} before the attempt returned)",
                (started + took).saturating_duration_since(g.valid_until())
            ),
        }
        // Nothing of the attempt is left once the answers are quick again.
        let (_, took) = cycle(&client, "late").await;
        assert!(
            took < Duration::from_secs(1),
            "the key stayed held {took:?}"
        );
    });
}

/// A single-instance backend on instance `i` of `store` (same prefix), to look at or break
/// one copy.
async fn single(store: &RedlockFaultStore, i: usize) -> std::sync::Arc<RedisBackend> {
    RedisBackend::builder(store.url(i))
        .prefix(&store.prefix)
        .build()
        .await
        .unwrap()
}

/// An instance that refuses the fencing write-back (its copy vanished between the grant
/// and the write-back) has not acknowledged it, but it has answered: with the others
/// refusing, the grant is not handed out, the attempt is a retry (not "too few
/// answered"), and nothing of it is left.
#[test]
fn a_write_back_refused_by_a_majority_is_no_grant() {
    run(Duration::from_secs(30), async {
        let store = RedlockFaultStore::start(3).await.unwrap();
        let (backend, link) = store.proxied_backend().await.unwrap();
        let client = LockClient::new(backend.clone());
        cycle(&client, "warm").await; // connected to every instance
        let key = LockKey::new("refused").unwrap();
        let copies = [single(&store, 1).await, single(&store, 2).await];
        // Instances 1 and 2 apply the grant at once but answer late: long enough for the
        // test to delete their copies before the write-back reaches them.
        let delay = INSTANCE_TIMEOUT / 2;
        for i in [1, 2] {
            link.proxies[i].delay_answers(delay).await;
        }
        let owner = lockcore::Owner::new("refused-test");
        let claim = tokio::spawn({
            let (backend, key, owner) = (backend.clone(), key.clone(), owner.clone());
            async move {
                backend
                    .claim(&lockcore::driver::ClaimRequest::exclusive(
                        &key,
                        &owner,
                        Duration::from_secs(10),
                    ))
                    .await
            }
        });
        for copy in &copies {
            let deadline = Instant::now() + delay;
            while copy.inspect(&key).await.unwrap().is_none() {
                assert!(
                    Instant::now() < deadline,
                    "the grant never reached instance"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            copy.force_release(&key).await.unwrap();
        }
        let outcome = claim.await.unwrap();
        for i in [1, 2] {
            link.proxies[i].delay_answers(Duration::ZERO).await;
        }
        // Every granter answered the write-back (one took it, the rest refused): not a
        // grant, and not "too few answered" either, but a retry.
        assert!(
            matches!(outcome, Ok(lockcore::driver::AcquireOutcome::Held(_))),
            "one write-back acknowledged, the others refused: expected a retry, got {outcome:?}"
        );
        for i in 0..3 {
            assert!(
                !held_on(&store, i, "refused").await,
                "instance {i} still holds it"
            );
        }
    });
}

/// While instances that do not answer could still complete a holder's majority, the key is
/// not reported free: `holders` answers that too few instances answered, or names the
/// holder. Both for the exclusive lock and for a reader's shared lease.
#[test]
fn a_holder_on_silent_instances_is_not_reported_free() {
    run(Duration::from_secs(30), async {
        for shared in [false, true] {
            let store = RedlockFaultStore::start(5).await.unwrap();
            let client = LockClient::new(store.builder().build().await.unwrap());
            let watcher = store.builder().build().await.unwrap();
            let key = LockKey::new("silent").unwrap();
            // Both clients connected to every instance before any falls silent.
            watcher.holders(&key).await.unwrap();
            let request = client.lock("silent").ttl(TTL * 5);
            let request = if shared { request.shared() } else { request };
            let guard = request.acquire().await.unwrap();
            // The holder keeps instances 0, 1 and 2, a majority; 1 and 2 then stop answering.
            for i in [3, 4] {
                single(&store, i).await.force_release(&key).await.unwrap();
            }
            store.signal(1, "STOP").await;
            store.signal(2, "STOP").await;
            let seen = watcher.holders(&key).await;
            store.signal(1, "CONT").await;
            store.signal(2, "CONT").await;
            match seen {
                Err(LockError::QuorumNotReached { .. }) => {}
                Ok(holders) if !holders.is_empty() => {}
                other => panic!(
                    "shared {shared}: one copy seen, two instances silent that hold it too, \
                     yet: {other:?}"
                ),
            }
            guard.release().await.unwrap();
        }
    });
}
