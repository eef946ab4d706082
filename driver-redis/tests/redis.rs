//! The redis driver's own tests, beyond the shared conformance suite: faults on servers of
//! their own (stopped, frozen, restarted empty), credentials, URLs, key layout, hostile keys,
//! the connection budget of many waiters.

mod common;

use std::time::{Duration, Instant};

use common::{
    bounded, key, raw, start_server, start_server_ready_on, RedisFaultStore, RedisHarness, TIMEOUT,
};
use conformance_tests::process::free_port;
use distlock_redis::redis::{self, AsyncCommands};
use distlock_redis::RedisBackend;
use lockcore::driver::{AcquireOutcome, ExtendOutcome, LockBackendExt, WaitHint};
use lockcore::{FencingToken, LockBackend, LockClient, LockError, LockKey, Owner, ReleaseOutcome};

async fn acquire(b: &RedisBackend, k: &LockKey, owner: &Owner, ttl: Duration) -> FencingToken {
    match b.try_acquire(k, owner, ttl).await.unwrap() {
        AcquireOutcome::Acquired(grant) => grant.token,
        other => panic!("{k} was not free: {other:?}"),
    }
}

fn is_unavailable(e: &LockError) -> bool {
    matches!(e, LockError::Unavailable { .. }) && e.is_retryable()
}

/// A stopped server: every call fails with a retryable `Unavailable` within the
/// configured timeouts, and a held guard's `lost()` fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_server_fails_within_the_timeout_and_guard_is_lost() {
    bounded(async {
        let store = RedisFaultStore::start(&[]).await.unwrap();
        let (backend, _proxy) = store.proxied_backend().await.unwrap();
        let locks = LockClient::new(backend.clone());
        let ttl = Duration::from_millis(600);
        let guard = locks.lock("held").ttl(ttl).acquire().await.unwrap();
        store_stop(&store).await;

        let bound = TIMEOUT * 2 + Duration::from_millis(300);
        let owner = Owner::new("t");
        let k = key("other");
        let started = Instant::now();
        let e = backend.try_acquire(&k, &owner, ttl).await.unwrap_err();
        assert!(is_unavailable(&e), "{e}");
        assert!(started.elapsed() < bound, "took {:?}", started.elapsed());
        for op in ["release", "extend", "inspect", "force", "wait"] {
            let started = Instant::now();
            let r = match op {
                "release" => backend.release(&k, &owner).await.map(|_| ()),
                "extend" => backend.extend(&k, &owner, ttl).await.map(|_| ()),
                "inspect" => backend.inspect(&k).await.map(|_| ()),
                "force" => backend.force_release(&k).await.map(|_| ()),
                _ => {
                    backend
                        .wait_released(&k, &WaitHint::none(), u64::MAX, Duration::from_secs(5))
                        .await
                }
            };
            let e = r.expect_err(op);
            assert!(is_unavailable(&e), "{op}: {e}");
            assert!(
                started.elapsed() < bound,
                "{op} took {:?}",
                started.elapsed()
            );
        }
        tokio::time::timeout(ttl * 2, guard.lost())
            .await
            .expect("lost() did not fire while the server was down");
    })
    .await;
}

/// With the server gone (connections refused), failed acquisitions sent nothing: the
/// client compensates none of them, and its shutdown does not wait out a release retried
/// for every failed attempt (it used to take up to the TTL, 30 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_attempts_leave_nothing_for_shutdown() {
    bounded(async {
        let store = RedisFaultStore::start(&[]).await.unwrap();
        // Straight to the server: a proxy would accept the connection and then drop it.
        let backend = RedisBackend::builder(store.url())
            .prefix(&store.prefix)
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .build()
            .await
            .unwrap();
        let locks = LockClient::new(backend);
        let g = locks.lock("warm").acquire().await.unwrap();
        g.release().await.unwrap();
        store_stop(&store).await;
        for i in 0..5 {
            let e = locks
                .lock(format!("k{i}"))
                .ttl(Duration::from_secs(30))
                .try_acquire()
                .await
                .unwrap_err();
            assert!(is_unavailable(&e), "{e}");
            let chain = lockcore::ErrorChain(&e).to_string();
            assert!(chain.contains("refused"), "{chain}");
        }
        let started = Instant::now();
        assert!(
            locks.shutdown().await,
            "background work was left after refused attempts"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "shutdown took {:?}",
            started.elapsed()
        );
    })
    .await;
}

/// A frozen server (SIGSTOP: connections stay open, nothing answers): calls fail with
/// `Unavailable` after the response timeout, not never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_times_out() {
    bounded(async {
        let port = free_port().unwrap();
        let server = start_server(port, &[]).await.unwrap();
        let backend = RedisBackend::builder(format!("redis://127.0.0.1:{port}/"))
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(300))
            .build()
            .await
            .unwrap();
        server.signal("STOP").unwrap();
        let started = Instant::now();
        let e = backend
            .try_acquire(&key("k"), &Owner::new("t"), Duration::from_secs(1))
            .await
            .unwrap_err();
        let took = started.elapsed();
        server.signal("CONT").unwrap();
        assert!(is_unavailable(&e), "{e}");
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_millis(1200),
            "took {took:?}"
        );
        // And the backend works again once the server does.
        let owner = Owner::new("t");
        let k = key("after");
        acquire(&backend, &k, &owner, Duration::from_secs(1)).await;
        assert_eq!(
            backend.release(&k, &owner).await.unwrap(),
            ReleaseOutcome::Released
        );
    })
    .await;
}

async fn store_stop(store: &RedisFaultStore) {
    conformance_tests::FaultStore::stop(store).await.unwrap();
}

async fn store_start(store: &RedisFaultStore) {
    conformance_tests::FaultStore::start(store).await.unwrap();
}

/// A restart that loses everything: new acquisitions work, their tokens are above every
/// token issued before, and the old holder's renewal reports the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_empty_keeps_tokens_rising_and_old_holder_learns_the_loss() {
    bounded(async {
        let store = RedisFaultStore::start(&[]).await.unwrap();
        let (backend, _proxy) = store.proxied_backend().await.unwrap();
        let locks = LockClient::new(backend.clone());
        let ttl = Duration::from_millis(900);
        // Many tokens on one key and a few others, the last one held through the restart.
        let mut highest = 0;
        for i in 0..200 {
            let g = locks
                .lock(format!("k{}", i % 3))
                .ttl(ttl)
                .acquire()
                .await
                .unwrap();
            highest = highest.max(g.token().0);
            g.release().await.unwrap();
        }
        let old = Owner::new("old holder");
        let k = key("k0");
        let held = acquire(&backend, &k, &old, Duration::from_secs(30)).await;
        assert!(held.0 > highest);
        let guard = locks.lock("k1").ttl(ttl).acquire().await.unwrap();
        highest = held.0.max(guard.token().0);

        store_stop(&store).await;
        store_start(&store).await;

        let newcomer = Owner::new("new holder");
        let token = acquire(&backend, &k, &newcomer, Duration::from_secs(30)).await;
        assert!(token.0 > highest, "{token} after restart, {highest} before");
        assert_eq!(
            backend
                .extend(&k, &old, Duration::from_secs(30))
                .await
                .unwrap(),
            ExtendOutcome::NotHeld
        );
        assert_eq!(
            backend.release(&k, &old).await.unwrap(),
            ReleaseOutcome::NotHeld
        );
        // The watchdog of a guard held across the restart finds the lock gone.
        tokio::time::timeout(ttl * 2, guard.lost())
            .await
            .expect("the old guard's lost() did not fire after the restart");
        let g = locks.lock("k1").ttl(ttl).acquire().await.unwrap();
        assert!(g.token().0 > highest);
        g.release().await.unwrap();
    })
    .await;
}

/// Scripts flushed from the server (as after a restart or `SCRIPT FLUSH`) are loaded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_scripts_are_reloaded() {
    bounded(async {
        let store = RedisFaultStore::start(&[]).await.unwrap();
        let backend = RedisBackend::builder(store.url()).build().await.unwrap();
        let mut r = raw(&store.url()).await;
        let owner = Owner::new("t");
        let k = key("k");
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut r)
            .await
            .unwrap();
        acquire(&backend, &k, &owner, Duration::from_secs(5)).await;
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut r)
            .await
            .unwrap();
        assert!(backend.inspect(&k).await.unwrap().is_some());
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut r)
            .await
            .unwrap();
        // The watchdog's batch is an EVALSHA written by hand: it reloads its script too.
        let renewals = [lockcore::driver::Renewal::new(
            &k,
            &owner,
            Duration::from_secs(5),
        )];
        let renewed = backend.renew(&renewals).await.unwrap();
        assert!(
            matches!(
                renewed.as_slice(),
                [Ok(lockcore::driver::ExtendOutcome::Extended(_))]
            ),
            "{renewed:?}"
        );
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut r)
            .await
            .unwrap();
        assert_eq!(
            backend.release(&k, &owner).await.unwrap(),
            ReleaseOutcome::Released
        );
    })
    .await;
}

/// The stored layout: lock and fence key under the prefix with one hash tag, the fence a
/// decimal integer near the server's clock in µs with a TTL of a day plus an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_key_is_an_integer_string_with_a_ttl() {
    bounded(async {
        let h = RedisHarness::new();
        let backend = h.backend().await.unwrap();
        let mut r = raw(&h.url).await;
        let owner = Owner::new("layout");
        let k = key("invoice:42");
        let token = acquire(&backend, &k, &owner, Duration::from_secs(5)).await;
        let lock_key = format!("{}{{invoice:42}}", h.prefix);
        let fence_key = format!("{lock_key}:fence");
        let fence: String = r.get(&fence_key).await.unwrap();
        assert_eq!(fence, token.0.to_string());
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut r).await.unwrap();
        let now_us = secs * 1_000_000 + micros;
        assert!(
            token.0 <= now_us && now_us - token.0 < 5_000_000,
            "{token} vs {now_us}"
        );
        let fence_ttl: i64 = r.pttl(&fence_key).await.unwrap();
        assert!(fence_ttl > 24 * 3600 * 1000 && fence_ttl <= 25 * 3600 * 1000);
        let lock_ttl: i64 = r.pttl(&lock_key).await.unwrap();
        assert!(lock_ttl > 4000 && lock_ttl <= 5000, "{lock_ttl}");
        // The next token on the key is above the last even though the clock floor is lower
        // (a token pushed ahead of the clock).
        let ahead = now_us + 3_600_000_000;
        let _: () = r.set(&fence_key, ahead.to_string()).await.unwrap();
        backend.release(&k, &owner).await.unwrap();
        let next = acquire(&backend, &k, &owner, Duration::from_secs(5)).await;
        assert_eq!(next.0, ahead + 1);
        backend.release(&k, &owner).await.unwrap();
    })
    .await;
}

/// A release publishes only when a waiter marked the lock (the waiter's re-check, `WATCH`):
/// an unwatched release sends nothing, a watched one announces itself. Marking keeps the
/// lock's expiry, and a marked lock still parses, extends and re-grants as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_publish_only_when_watched() {
    use distlock_redis::__redlock as support;
    use futures_util::StreamExt;
    bounded(async {
        let h = RedisHarness::new();
        let backend = h.backend().await.unwrap();
        let mut r = raw(&h.url).await;
        let k = key("watched");
        let names = support::names(&h.prefix, &k);
        let mut pubsub = redis::Client::open(h.url.as_str())
            .unwrap()
            .get_async_pubsub()
            .await
            .unwrap();
        pubsub.subscribe(names.channel()).await.unwrap();
        let mut messages = pubsub.into_on_message();
        // Our own message, published after the operation under test, comes next only if
        // that operation published nothing.
        macro_rules! next_after {
            ($sentinel:expr) => {{
                let _: i64 = r.publish(names.channel(), $sentinel).await.unwrap();
                let msg = messages.next().await.expect("the subscription ended");
                msg.get_payload::<String>().unwrap()
            }};
        }

        let owner = Owner::new("unwatched");
        acquire(&backend, &k, &owner, Duration::from_secs(30)).await;
        assert_eq!(
            backend.release(&k, &owner).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert_eq!(next_after!("sentinel-1"), "sentinel-1");

        let owner = Owner::new("watched holder");
        let token = acquire(&backend, &k, &owner, Duration::from_secs(30)).await;
        let mut r2 = raw(&h.url).await;
        let pttl: i64 = support::WATCH
            .key(&names.lock)
            .invoke_async(&mut r2)
            .await
            .unwrap();
        assert!(pttl > 29_000 && pttl <= 30_000, "{pttl}");
        let value: Vec<u8> = r2.get(&names.lock).await.unwrap();
        assert_eq!(
            value.get(32),
            Some(&b'+'),
            "{}",
            String::from_utf8_lossy(&value)
        );
        let kept: i64 = r2.pttl(&names.lock).await.unwrap();
        assert!(kept > 29_000 && kept <= pttl, "{kept}");
        // Marked twice is marked once.
        let _: i64 = support::WATCH
            .key(&names.lock)
            .invoke_async(&mut r2)
            .await
            .unwrap();
        let again: Vec<u8> = r2.get(&names.lock).await.unwrap();
        assert_eq!(again, value);
        let info = backend.inspect(&k).await.unwrap().expect("held");
        assert_eq!(
            (info.token, info.holder.as_str()),
            (token, "watched holder")
        );
        assert_eq!(
            acquire(&backend, &k, &owner, Duration::from_secs(30)).await,
            token
        );
        assert!(matches!(
            backend.extend(&k, &owner, Duration::from_secs(60)).await.unwrap(),
            ExtendOutcome::Extended(g) if g.token == token
        ));
        let extended: Vec<u8> = r2.get(&names.lock).await.unwrap();
        assert_eq!(
            extended, value,
            "the mark outlives a renewal and a re-grant"
        );
        assert_eq!(
            backend.release(&k, &owner).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert_eq!(
            next_after!("sentinel-2"),
            "1",
            "a watched release announces itself"
        );

        // Watching a free key marks nothing and creates nothing.
        let gone: i64 = support::WATCH
            .key(&names.lock)
            .invoke_async(&mut r2)
            .await
            .unwrap();
        assert_eq!(gone, -2);
        let exists: bool = r2.exists(&names.lock).await.unwrap();
        assert!(!exists);
    })
    .await;
}

/// Hostile key names each get exactly their own lock and fence key, sharing one hash tag,
/// and operations on one never touch another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_get_their_own_names() {
    bounded(async {
        let h = RedisHarness::new();
        let backend = h.backend().await.unwrap();
        let mut r = raw(&h.url).await;
        let base = "job";
        let hostile = [
            base.to_owned(),
            format!("{base}}}:fence"),
            format!("{base}:fence"),
            format!("{{{base}}}"),
            format!("{base}}}"),
            "}".to_owned(),
            "{".to_owned(),
            "{}".to_owned(),
            "%7D".to_owned(),
            "%".to_owned(),
            "*".to_owned(),
            "?".to_owned(),
            "[a-z]".to_owned(),
            "\\".to_owned(),
            "'\"".to_owned(),
            "JOB".to_owned(),
            "job ".to_owned(),
            "ключ🔒".to_owned(),
            "x".repeat(255),
        ];
        let owners: Vec<Owner> = hostile.iter().map(Owner::new).collect();
        let mut tokens = Vec::new();
        for (k, o) in hostile.iter().zip(&owners) {
            tokens.push(acquire(&backend, &key(k), o, Duration::from_secs(30)).await);
        }
        let stored: Vec<String> = r.keys(format!("{}*", h.prefix)).await.unwrap();
        assert_eq!(stored.len(), hostile.len() * 2, "{stored:?}");
        for name in &stored {
            let rest = name.strip_prefix(&h.prefix).unwrap();
            assert!(rest.starts_with('{'), "{name}");
            let close = rest.find('}').unwrap();
            assert!(close > 1, "empty hash tag in {name}");
            let tail = &rest[close + 1..];
            assert!(tail.is_empty() || tail == ":fence", "{name}");
        }
        // Each key's holder is its own; a wrong owner frees nothing; releases are separate.
        for (i, (k, o)) in hostile.iter().zip(&owners).enumerate() {
            let info = backend.inspect(&key(k)).await.unwrap().unwrap();
            assert_eq!(info.holder, o.label());
            assert_eq!(info.token, tokens[i]);
            let stranger = &owners[(i + 1) % owners.len()];
            assert_eq!(
                backend.release(&key(k), stranger).await.unwrap(),
                ReleaseOutcome::NotHeld
            );
        }
        for (i, (k, o)) in hostile.iter().zip(&owners).enumerate() {
            assert_eq!(
                backend.release(&key(k), o).await.unwrap(),
                ReleaseOutcome::Released
            );
            for later in &hostile[i + 1..] {
                assert!(
                    backend.inspect(&key(later)).await.unwrap().is_some(),
                    "releasing {k:?} freed {later:?}"
                );
            }
        }
    })
    .await;
}

/// Backends with different prefixes never see each other's locks; a prefix with braces is
/// a configuration error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_separate_namespaces() {
    bounded(async {
        let h = RedisHarness::new();
        let a = h.backend().await.unwrap();
        let b = RedisBackend::builder(&h.url)
            .prefix(format!("{}other:", h.prefix))
            .build()
            .await
            .unwrap();
        let k = key("shared-name");
        let (oa, ob) = (Owner::new("a"), Owner::new("b"));
        acquire(&a, &k, &oa, Duration::from_secs(5)).await;
        acquire(&b, &k, &ob, Duration::from_secs(5)).await;
        a.release(&k, &oa).await.unwrap();
        b.release(&k, &ob).await.unwrap();
        let e = RedisBackend::builder(&h.url)
            .prefix("bad{tag}:")
            .build()
            .await
            .unwrap_err();
        assert!(matches!(e, LockError::Config { .. }), "{e}");
    })
    .await;
}

/// A server with a password: the right one works (with and without a user name), a wrong
/// or missing one is a clear, non-retryable error that never shows the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_are_checked() {
    bounded(async {
        let port = free_port().unwrap();
        let _server = start_server(port, &["--requirepass", "s3cret-pw"])
            .await
            .unwrap();
        for url in [
            format!("redis://:s3cret-pw@127.0.0.1:{port}/"),
            format!("redis://default:s3cret-pw@127.0.0.1:{port}/0"),
        ] {
            let b = distlock_redis::connect(&url).await.unwrap();
            let o = Owner::new("t");
            acquire(&b, &key("k"), &o, Duration::from_secs(1)).await;
            b.release(&key("k"), &o).await.unwrap();
        }
        for (url, says) in [
            (
                format!("redis://:wrong-pw@127.0.0.1:{port}/"),
                "the server refused the URL's password",
            ),
            (
                format!("redis://default:wrong-pw@127.0.0.1:{port}/"),
                "the server refused the URL's password",
            ),
            (
                format!("redis://127.0.0.1:{port}/"),
                "the server requires a password (NOAUTH): give it in the URL",
            ),
        ] {
            let e = distlock_redis::connect(&url).await.unwrap_err();
            assert!(matches!(e, LockError::Backend { .. }), "{url}: {e:?}");
            assert!(!e.is_retryable());
            let text = lockcore::ErrorChain(&e).to_string();
            assert!(text.contains(says), "{url}: {text}");
            // One line, not one `NOAUTH` per script loaded at start.
            assert!(!text.contains("Pipeline"), "{url}: {text}");
            let shown = format!("{e} {e:?}");
            assert!(
                !shown.contains("wrong-pw") && !shown.contains("s3cret"),
                "{shown}"
            );
        }
    })
    .await;
}

/// Malformed URLs are `Config` errors, an address nobody listens on is `Unavailable`, TLS
/// to a plain server fails cleanly; nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_are_checked() {
    bounded(async {
        for url in [
            "",
            "127.0.0.1:6379",
            "not a url",
            "http://127.0.0.1:6379/",
            "redis://",
            "redis://127.0.0.1:6379/notadb",
            "redis://127.0.0.1:99999/",
            "rediss://127.0.0.1:6379/#sometimes",
        ] {
            let e = distlock_redis::connect(url).await.unwrap_err();
            assert!(matches!(e, LockError::Config { .. }), "{url:?}: {e:?}");
        }
        let closed = free_port().unwrap();
        let started = Instant::now();
        let e = RedisBackend::builder(format!("redis://127.0.0.1:{closed}/"))
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap_err();
        assert!(is_unavailable(&e), "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(3));

        let port = free_port().unwrap();
        let _server = start_server(port, &[]).await.unwrap();
        let e = RedisBackend::builder(format!("rediss://127.0.0.1:{port}/"))
            .connect_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(e, LockError::Unavailable { .. } | LockError::Backend { .. }),
            "{e:?}"
        );
    })
    .await;
}

fn connected_clients(list: &str) -> usize {
    list.lines().filter(|l| !l.trim().is_empty()).count()
}

/// A thousand tasks waiting on one key hold at most two connections to the server
/// (commands + the shared pub/sub), and each release wakes one of them: all are served.
/// Once no one waits, the channel is unsubscribed (after a short linger).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_waiters_share_two_connections() {
    bounded(async {
        let store = RedisFaultStore::start(&[]).await.unwrap();
        let mut r = raw(&store.url()).await;
        let holder = RedisBackend::builder(store.url()).build().await.unwrap();
        let waiters = LockClient::new(RedisBackend::builder(store.url()).build().await.unwrap());
        let k = key("popular");
        let owner = Owner::new("holder");
        acquire(&holder, &k, &owner, Duration::from_secs(30)).await;
        let tasks: Vec<_> = (0..1000)
            .map(|_| {
                let locks = waiters.clone();
                tokio::spawn(async move {
                    let g = locks
                        .lock("popular")
                        .ttl(Duration::from_secs(5))
                        .wait(Duration::from_secs(40))
                        .acquire()
                        .await?;
                    g.release().await.map(|_| ())
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut r)
            .await
            .unwrap();
        // Ours: this checker, the holder's command connection, and the waiters' backend.
        let waiter_conns = connected_clients(&list) - 2;
        assert!(
            waiter_conns <= 2,
            "the waiting backend holds {waiter_conns} connections:\n{list}"
        );
        let subs: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("distlock:{popular}:released")
            .query_async(&mut r)
            .await
            .unwrap();
        assert_eq!(subs[0].1, 1, "one subscription for all waiters");
        let started = Instant::now();
        assert_eq!(
            holder.release(&k, &owner).await.unwrap(),
            ReleaseOutcome::Released
        );
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        println!("1000 waiters served in {:?}", started.elapsed());
        // The channel lingers a little after its last waiter, then is unsubscribed.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let subs: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg("distlock:{popular}:released")
                .query_async(&mut r)
                .await
                .unwrap();
            if subs[0].1 == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the idle channel stayed subscribed"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
}

/// When the shared pub/sub connection is killed, waiters are woken to look again and the
/// connection is re-established: a release after that still wakes a waiter promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_reconnects_after_being_killed() {
    bounded(async {
        let store = RedisFaultStore::start(&[]).await.unwrap();
        let mut r = raw(&store.url()).await;
        let holder = RedisBackend::builder(store.url()).build().await.unwrap();
        let waiters = LockClient::new(RedisBackend::builder(store.url()).build().await.unwrap());
        let k = key("k");
        let owner = Owner::new("holder");
        acquire(&holder, &k, &owner, Duration::from_secs(30)).await;
        let waiter = tokio::spawn(async move {
            let g = waiters
                .lock("k")
                .ttl(Duration::from_secs(5))
                .wait(Duration::from_secs(20))
                .acquire()
                .await?;
            g.release().await.map(|_| ())
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut r)
            .await
            .unwrap();
        assert_eq!(killed, 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        holder.release(&k, &owner).await.unwrap();
        tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .expect("the waiter slept through the release after its pub/sub connection died")
            .unwrap()
            .unwrap();
        assert!(released.elapsed() < Duration::from_secs(3));
    })
    .await;
}

/// An existing connection can be handed to the builder and is used for commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_connection_is_reused() {
    bounded(async {
        let h = RedisHarness::new();
        let manager = redis::Client::open(h.url.as_str())
            .unwrap()
            .get_connection_manager()
            .await
            .unwrap();
        let backend = RedisBackend::builder(&h.url)
            .prefix(&h.prefix)
            .connection(manager)
            .build()
            .await
            .unwrap();
        let locks = LockClient::new(backend);
        let g = locks.lock("reuse").try_acquire().await.unwrap().unwrap();
        assert!(locks.lock("reuse").try_acquire().await.unwrap().is_none());
        g.release().await.unwrap();
    })
    .await;
}

/// `rediss://` works end to end against a TLS-only redis-server whose self-signed
/// certificate is given as the root; without it the untrusted certificate is refused with
/// an error, not a panic, and `#insecure` is a configuration error (not compiled in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connections_work() {
    bounded(async {
        let certs = common::TestCerts::make();
        let (dir, ca, cert, key_file) = (&certs.dir, &certs.ca, &certs.cert, &certs.key);
        let port = free_port().unwrap();
        let (cert_s, key_s) = (
            cert.to_string_lossy().into_owned(),
            key_file.to_string_lossy().into_owned(),
        );
        let server = start_server_ready_on(
            0,
            port,
            &[
                "--tls-port",
                &port.to_string(),
                "--tls-cert-file",
                &cert_s,
                "--tls-key-file",
                &key_s,
                "--tls-ca-cert-file",
                &ca.to_string_lossy(),
                "--tls-auth-clients",
                "no",
            ],
        )
        .await;
        let _server = match server {
            Ok(s) => s,
            Err(e) => panic!("redis-server with TLS on {port} did not start: {e}"),
        };
        let b = RedisBackend::builder(format!("rediss://127.0.0.1:{port}/"))
            .tls_root_certificate(std::fs::read(ca).unwrap())
            .connect_timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        let o = Owner::new("tls");
        let k = key("over-tls");
        acquire(&b, &k, &o, Duration::from_secs(5)).await;
        assert_eq!(b.release(&k, &o).await.unwrap(), ReleaseOutcome::Released);
        let e = RedisBackend::builder(format!("rediss://127.0.0.1:{port}/"))
            .connect_timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(e, LockError::Unavailable { .. } | LockError::Backend { .. }),
            "{e:?}"
        );
        let e = distlock_redis::connect(&format!("rediss://127.0.0.1:{port}/#insecure"))
            .await
            .unwrap_err();
        assert!(matches!(e, LockError::Config { .. }), "{e:?}");
        let _ = dir;
    })
    .await;
}

/// Connecting is a handful of round trips, not one per script: through a link that holds
/// every answer 250 ms, it takes about four answers (the handshake, the check and script
/// loads in one pipeline), where a load per script took thirteen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_loads_the_scripts_in_one_round_trip() {
    use conformance_tests::FaultLink;
    bounded(async {
        let url = common::shared_url();
        let upstream = url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .parse()
            .unwrap();
        let proxy = conformance_tests::TcpProxy::start(upstream).await.unwrap();
        let delay = Duration::from_millis(250);
        proxy.delay_answers(delay).await;
        let started = Instant::now();
        let backend = RedisBackend::builder(format!("redis://{}/", proxy.addr()))
            .connect_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        let took = started.elapsed();
        assert!(
            took < delay * 8,
            "connecting took {took:?}, {delay:?} per answer"
        );
        // The scripts are loaded: the first acquisition is one answer, not a NOSCRIPT and a
        // load and a retry.
        let started = Instant::now();
        let k = key("first-after-connect");
        let owner = Owner::new("o");
        acquire(&backend, &k, &owner, Duration::from_secs(5)).await;
        let took = started.elapsed();
        assert!(took < delay * 2, "the first acquisition took {took:?}");
        backend.release(&k, &owner).await.unwrap();
    })
    .await;
}

/// Every variant of every script (one server's, and a cluster's) compiles on a real server:
/// a syntax error in a `.lua` file fails here, not at a user's first connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_variant_loads() {
    bounded(async {
        let mut conn = raw(&common::shared_url()).await;
        for script in distlock_redis::__redlock::scripts::all() {
            for cluster in [false, true] {
                let variant = script.for_cluster(cluster);
                let hash: String = variant
                    .load_cmd()
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{e}: {}", variant.source()));
                assert_eq!(hash, variant.get_hash());
            }
        }
    })
    .await;
}
