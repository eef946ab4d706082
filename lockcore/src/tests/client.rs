//! The client: lines, slots, reentrancy, retries.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::memory::MemoryBackend;
use crate::tests::faulty::Faulty;
use crate::*;

/// Tasks that loop taking a lock and giving it back at once must not starve the
/// waiters: the releasing task's next request joins the line behind them. (On one
/// thread, the releasing task runs on until its next request is sent: a request that
/// could barge always would.)
#[tokio::test]
async fn a_client_serves_its_waiters_in_order_and_a_new_request_queues_behind_them() {
    let client = LockClient::new(MemoryBackend::new());
    let held = client.lock("k").acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..4 {
        let (waiter, order) = (client.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = waiter.lock("k").acquire().await.unwrap();
            order.lock().unwrap().push(i);
            guard.release().await.unwrap();
        }));
        // Each is in line before the next one starts.
        tokio::time::timeout(Duration::from_secs(5), async {
            while client.in_line("k") < i + 1 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the waiter never joined the line");
    }
    // The holder gives the lock back and asks again at once: with the store free for
    // an instant and its request first, it would win every time if it could barge.
    held.release().await.unwrap();
    let again = client.lock("k").acquire().await.unwrap();
    order.lock().unwrap().push(4);
    again.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    assert_eq!(client.in_line("k"), 0);
}

/// A request that leaves the line (its deadline passed, or its future was dropped)
/// while at its head or behind it never holds up the ones after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_leave_the_line_pass_the_turn_on() {
    let client = LockClient::new(MemoryBackend::new());
    let held = client.lock("k").acquire().await.unwrap();
    let in_line = |n: usize| {
        let client = client.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(5), async {
                while client.in_line("k") != n {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("the line never held {n}"));
        }
    };
    let request = |wait: Option<Duration>| {
        let client = client.clone();
        tokio::spawn(async move {
            let mut request = client.lock("k");
            if let Some(wait) = wait {
                request = request.wait(wait);
            }
            request.acquire().await
        })
    };
    // The head gives up at its deadline; the second is dropped while behind it.
    let head = request(Some(Duration::from_millis(100)));
    in_line(1).await;
    let dropped = request(None);
    in_line(2).await;
    let last = request(Some(Duration::from_secs(5)));
    in_line(3).await;
    dropped.abort();
    assert!(matches!(
        head.await.unwrap(),
        Err(LockError::Timeout { .. })
    ));
    in_line(1).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = last.await.unwrap().expect("the last request gets the lock");
    assert!(released.elapsed() < Duration::from_secs(1));
    guard.release().await.unwrap();
    assert_eq!(client.in_line("k"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_is_abandoned_once() {
    let flaky = Faulty::new();
    let client = LockClient::new(flaky.clone());
    let held = client.lock("k").acquire().await.unwrap();
    assert!(client.lock("k").try_acquire().await.unwrap().is_none());
    let err = client
        .lock("k")
        .wait(Duration::from_millis(50))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }));
    let cancelled =
        tokio::time::timeout(Duration::from_millis(50), client.lock("k").acquire()).await;
    assert!(cancelled.is_err());
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock("k")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    client.shutdown().await;
    assert_eq!(
        flaky.abandoned(),
        3,
        "try, timeout and cancel each abandon once; a grant does not"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_are_retried_only_inside_a_wait_deadline() {
    let flaky = Faulty::new();
    flaky.acquire_failures.store(3, Ordering::SeqCst);
    let client = LockClient::new(flaky.clone());
    let err = client.lock("k").acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    let err = client.lock("k").try_acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    let g = client
        .lock("k")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    g.release().await.unwrap();
    flaky.acquire_failures.store(usize::MAX, Ordering::SeqCst);
    let started = Instant::now();
    let err = client
        .lock("k")
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::Unavailable { .. }),
        "the deadline hid the store's error: {err}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrancy_state_is_forgotten_after_release() {
    let client = LockClient::new(MemoryBackend::new());
    for i in 0..100 {
        let g = client
            .lock(format!("k{i}"))
            .try_acquire()
            .await
            .unwrap()
            .unwrap();
        if i % 2 == 0 {
            g.release().await.unwrap();
        } else {
            drop(g);
        }
    }
    let contended = client.lock("k0").try_acquire().await.unwrap().unwrap();
    assert!(client.lock("k0").try_acquire().await.unwrap().is_none());
    contended.release().await.unwrap();
    client.shutdown().await;
    assert_eq!(client.slot_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reentry_by_one_owner_shares_one_hold() {
    let store = MemoryBackend::new();
    let client = LockClient::new(store.clone());
    let owner = client.new_owner();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (client, owner) = (client.clone(), owner.clone());
            tokio::spawn(async move { client.lock("k").owner(owner).acquire().await.unwrap() })
        })
        .collect();
    let mut guards = Vec::new();
    for t in tasks {
        guards.push(t.await.unwrap());
    }
    assert!(guards.iter().all(|g| g.token() == guards[0].token()));
    let last = guards.pop().unwrap();
    for g in guards {
        assert!(matches!(
            g.release().await.unwrap(),
            ReleaseOutcome::StillHeld { .. }
        ));
    }
    assert_eq!(store.held_count(), 1);
    assert_eq!(last.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(store.held_count(), 0);
}

/// A request of the owner queued behind its release keeps the (key, owner) slot alive: the
/// hold it then gets is the one the owner's next request re-enters, not a second hold of
/// the same lock that a release of either would free under the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_queued_behind_a_release_keeps_the_slot() {
    let store = Faulty::new();
    let client = LockClient::new(store.clone());
    let owner = client.new_owner();
    let first = client
        .lock("k")
        .owner(owner.clone())
        .acquire()
        .await
        .unwrap();
    store.release_millis.store(300, Ordering::SeqCst);
    let releasing = tokio::spawn(first.release());
    while store.releases() == 0 {
        tokio::task::yield_now().await;
    }
    // The release is at the store (300 ms), holding the slot: this request queues on it.
    let queued = {
        let (client, owner) = (client.clone(), owner.clone());
        tokio::spawn(async move { client.lock("k").owner(owner).acquire().await })
    };
    assert_eq!(releasing.await.unwrap().unwrap(), ReleaseOutcome::Released);
    store.release_millis.store(0, Ordering::SeqCst);
    let second = queued.await.unwrap().unwrap();
    let third = client.lock("k").owner(owner).acquire().await.unwrap();
    assert_eq!(third.token(), second.token());
    assert_eq!(
        third.release().await.unwrap(),
        ReleaseOutcome::StillHeld { holds: 1 },
        "the owner's next request made a second hold of the lock"
    );
    assert_eq!(store.inner.held_count(), 1);
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reacquire_by_same_owner_after_a_drop_is_never_lost() {
    // The drop's background release and the new request of the same owner race: the
    // request either re-enters the hold the release has not reached yet, or queues
    // behind that release and gets a new hold. It must never be granted the old hold in
    // the store and then lose it to the release.
    for _ in 0..50 {
        let store = MemoryBackend::new();
        let client = LockClient::new(store.clone());
        let owner = client.new_owner();
        let first = client
            .lock("k")
            .owner(owner.clone())
            .acquire()
            .await
            .unwrap();
        let token = first.token();
        drop(first);
        let second = client.lock("k").owner(owner).acquire().await.unwrap();
        assert!(second.token() >= token);
        client.shutdown().await;
        assert_eq!(store.held_count(), 1, "the new hold was released");
        let info = client.inspect("k").await.unwrap().unwrap();
        assert_eq!(info.token, second.token());
        assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(store.held_count(), 0);
    }
}

/// The memory store's extend never renews a lease that already ran out, even when nobody
/// has taken the key since (the expired lease is still in the map until pruned).
#[tokio::test]
async fn memory_extend_after_expiry_is_not_held() {
    let store = crate::memory::MemoryBackend::new();
    let (key, owner) = (crate::LockKey::new("k").unwrap(), crate::Owner::new("o"));
    let ttl = Duration::from_millis(30);
    assert!(matches!(
        store.try_acquire(&key, &owner, ttl).await.unwrap(),
        crate::AcquireOutcome::Acquired(_)
    ));
    tokio::time::sleep(ttl * 2).await;
    assert!(matches!(
        store.extend(&key, &owner, ttl).await.unwrap(),
        crate::ExtendOutcome::NotHeld
    ));
    assert!(store.inspect(&key).await.unwrap().is_none());
}

/// A grant answered after its lease ran out is released again and never handed out: inside
/// a wait deadline the acquisition tries again and holds a live lease; `try_acquire` and an
/// acquisition without a deadline report the store as too slow for the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_arrives_after_its_lease_is_never_handed_out() {
    let store = Faulty::new();
    let client = LockClient::new(store.clone());
    let ttl = Duration::from_millis(150);

    store.late_grants.store(1, Ordering::SeqCst);
    let guard = client
        .lock("late")
        .ttl(ttl)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert_eq!(store.releases(), 1, "the late grant was not released");
    assert!(!guard.is_lost());
    assert!(guard.valid_until() > Instant::now());
    guard.release().await.unwrap();

    let mut before = 0;
    for wait in [false, true] {
        before = store.releases();
        store.late_grants.store(1, Ordering::SeqCst);
        let err = if wait {
            client.lock("late").ttl(ttl).acquire().await.map(Some)
        } else {
            client.lock("late").ttl(ttl).try_acquire().await
        };
        match err {
            Err(e @ LockError::Unavailable { .. }) => {
                let text = ErrorChain(&e).to_string();
                assert!(text.contains("too slow for this TTL"), "{text}");
                assert!(e.is_retryable());
            }
            other => panic!("a late grant answered {other:?}"),
        }
        assert_eq!(store.releases() - before, 1);
        assert!(store
            .inner
            .inspect(&LockKey::new("late").unwrap())
            .await
            .unwrap()
            .is_none());
    }
    assert!(client.shutdown().await);
    assert_eq!(
        store.releases() - before,
        1,
        "the undone grant was released twice"
    );
}

/// A wait deadline that passes while a retry after a store failure is in flight reports the
/// failure, not a `Timeout` that would send the caller looking for a holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_during_a_retry_reports_the_store_failure() {
    let store = Faulty::new();
    let client = LockClient::new(store.clone());
    // Every grant arrives 155 ms after its 150 ms lease: each attempt fails slowly, so the
    // deadline falls during one almost surely (the pauses between them are short).
    store.late_grants.store(usize::MAX, Ordering::SeqCst);
    let err = client
        .lock("slow")
        .ttl(Duration::from_millis(150))
        .wait(Duration::from_millis(700))
        .acquire()
        .await
        .unwrap_err();
    let text = ErrorChain(&err).to_string();
    assert!(
        matches!(err, LockError::Unavailable { .. }) && text.contains("too slow for this TTL"),
        "{text}"
    );
    store.late_grants.store(0, Ordering::SeqCst);

    // Contention after a failure: the deadline is a plain timeout again.
    let held = client.lock("busy").acquire().await.unwrap();
    let other = LockClient::new(store.clone());
    store.acquire_failures.store(1, Ordering::SeqCst);
    let err = other
        .lock("busy")
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    held.release().await.unwrap();
}

/// Waits (at most 5 s) until `n` claims reached the store's gate.
async fn at_gate(store: &Faulty, n: usize) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while store.at_gate.load(Ordering::SeqCst) < n {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the claim reached the store");
}

/// A deadline shorter than the store's answer does not cut the first attempt short: a
/// free key is granted (a wait of zero is one attempt), a held key refused with `Timeout`
/// once the refusal came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_deadline_waits_for_the_first_answer() {
    let store = Faulty::new();
    let client = LockClient::new(store.clone());
    let holder = LockClient::new(store.inner.clone());
    let _held = holder.lock("held").acquire().await.unwrap();
    store.gated.store(true, Ordering::SeqCst);
    // Longer than the 100 ms a later attempt gets past the deadline.
    let slow = Duration::from_millis(250);
    for (n, (key, wait)) in [
        ("free-0", Duration::ZERO),
        ("free-5", Duration::from_millis(5)),
        ("held", Duration::ZERO),
        ("held", Duration::from_millis(5)),
    ]
    .into_iter()
    .enumerate()
    {
        let started = Instant::now();
        let acquiring = tokio::spawn({
            let client = client.clone();
            async move { client.lock(key).wait(wait).acquire().await }
        });
        at_gate(&store, n + 1).await;
        tokio::time::sleep(slow).await;
        store.gate.notify_one();
        let answer = acquiring.await.unwrap();
        let took = started.elapsed();
        assert!(
            took >= slow,
            "{key} wait({wait:?}) answered after {took:?}, before its attempt was"
        );
        match answer {
            Ok(guard) if key.starts_with("free") => {
                guard.release().await.unwrap();
            }
            Err(LockError::Timeout { .. }) if key == "held" => {}
            other => panic!("{key} wait({wait:?}): {other:?}"),
        }
    }
}

/// "k" held for 100 ms without renewal through `store`'s inner store, and a client of the
/// gated `store` whose first claim is answered at once (it finds "k" held) and whose next
/// claims wait at the gate: (the holder's client, its guard, the gated client).
async fn held_briefly_then_gated(store: &Arc<Faulty>) -> (LockClient, LockGuard, LockClient) {
    let holder = LockClient::new(store.inner.clone());
    let held = holder
        .lock("k")
        .ttl(Duration::from_millis(100))
        .watchdog(false)
        .acquire()
        .await
        .unwrap();
    let client = LockClient::new(store.clone());
    store.gated.store(true, Ordering::SeqCst);
    store.gate.notify_one();
    (holder, held, client)
}

/// Past the first attempt the deadline bounds the wait: an attempt in flight when it passes
/// gets 100 ms more to answer, then the caller hears `Timeout` and the attempt is settled in
/// the background, which releases what it was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_bounds_a_later_attempt_in_flight() {
    let store = Faulty::new();
    let (holder, _held, client) = held_briefly_then_gated(&store).await;
    let started = Instant::now();
    let deadline = Duration::from_millis(600);
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        client.lock("k").wait(deadline).acquire(),
    )
    .await
    .expect("the deadline bounds an attempt in flight");
    let took = started.elapsed();
    assert!(
        matches!(answer, Err(LockError::Timeout { .. })),
        "{answer:?}"
    );
    assert_eq!(
        store.at_gate.load(Ordering::SeqCst),
        2,
        "the second attempt was in flight"
    );
    assert!(
        took >= deadline && took < Duration::from_secs(2),
        "{took:?}"
    );
    // Its grant comes now; the background releases it.
    store.gate.notify_one();
    assert!(client.shutdown().await);
    assert!(
        holder.inspect("k").await.unwrap().is_none(),
        "the late grant was left held"
    );
}

/// An attempt in flight when the deadline passes that answers within the 100 ms grace is
/// the answer: the caller gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_just_after_the_deadline_is_the_answer() {
    let store = Faulty::new();
    let (_holder, _held, client) = held_briefly_then_gated(&store).await;
    let deadline = Duration::from_millis(600);
    let started = Instant::now();
    let acquiring = tokio::spawn({
        let client = client.clone();
        async move { client.lock("k").wait(deadline).acquire().await }
    });
    at_gate(&store, 2).await;
    // 20 ms into the grace.
    tokio::time::sleep(
        (started + deadline + Duration::from_millis(20)).saturating_duration_since(Instant::now()),
    )
    .await;
    store.gate.notify_one();
    let guard = acquiring
        .await
        .unwrap()
        .expect("the grant that came within the grace");
    guard.release().await.unwrap();
}

/// A shutdown answers every request waiting for the key, the head of the client's line
/// and every request behind it, promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_every_request_in_line() {
    let store = MemoryBackend::new();
    let holder = LockClient::new(store.clone());
    let held = holder.lock("k").acquire().await.unwrap();
    let client = LockClient::new(store.clone());
    let waiting: Vec<_> = (0..50)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.lock("k").acquire().await })
        })
        .collect();
    // All of them in line (one waits for the store, the others for their turn).
    while client.in_line("k") < 50 {
        tokio::task::yield_now().await;
    }
    let started = Instant::now();
    client.shutdown().await;
    for w in waiting {
        let answer = tokio::time::timeout(Duration::from_secs(2), w)
            .await
            .expect("a request in line was not answered after the shutdown")
            .unwrap();
        assert!(matches!(answer, Err(LockError::Shutdown)), "{answer:?}");
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    held.release().await.unwrap();
}

/// A request may be made outside the runtime that runs it (`distlock::blocking` makes its
/// requests so); polled outside any runtime, it answers with an error, never a panic.
#[test]
fn a_request_finds_its_runtime_when_first_polled() {
    use std::future::Future;

    let client = LockClient::new(MemoryBackend::new());
    let plain = client.lock("k").acquire();
    let timed = client.lock("t").wait(Duration::from_secs(1)).acquire();
    let once = client.lock("o").try_acquire();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        plain.await.unwrap().release().await.unwrap();
        timed.await.unwrap().release().await.unwrap();
        once.await.unwrap().unwrap().release().await.unwrap();
    });

    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let outside = [
        Box::pin(client.lock("k").acquire())
            as std::pin::Pin<Box<dyn std::future::Future<Output = _>>>,
        Box::pin(client.lock("t").wait(Duration::from_secs(1)).acquire()),
    ];
    for mut request in outside {
        match request.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Err(LockError::Config { message })) => {
                assert!(message.contains("tokio runtime"), "{message}")
            }
            other => panic!("outside a runtime: {other:?}"),
        }
    }
    let mut once = Box::pin(client.lock("o").try_acquire());
    assert!(matches!(
        once.as_mut().poll(&mut cx),
        std::task::Poll::Ready(Err(LockError::Config { .. }))
    ));
}
