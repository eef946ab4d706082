//! Shared claims through the client: modes, re-entry, waiting, wake-ups, reservations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::memory::MemoryBackend;
use crate::tests::faulty::Faulty;
use crate::*;

const BOUND: Duration = Duration::from_secs(10);

fn clients(store: &Arc<MemoryBackend>, n: usize) -> Vec<LockClient> {
    (0..n).map(|_| LockClient::new(store.clone())).collect()
}

#[tokio::test]
async fn readers_share_and_a_writer_waits_for_all_of_them() {
    let store = MemoryBackend::new();
    let c = clients(&store, 3);
    let r1 = c[0].lock("k").shared().acquire().await.unwrap();
    let r2 = c[1].lock("k").shared().acquire().await.unwrap();
    assert_eq!(r1.claim().mode(), ClaimMode::Shared);
    assert!(r2.token() > r1.token());
    assert!(c[2].lock("k").try_acquire().await.unwrap().is_none());
    let all = c[2].inspect_all("k").await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(
        all.iter().map(|i| i.token).collect::<Vec<_>>(),
        [r1.token(), r2.token()]
    );
    let newest = c[2].inspect("k").await.unwrap().unwrap();
    assert_eq!(newest.token, r2.token());
    let last_reader = r2.token();
    let writer = {
        let c = c[2].clone();
        tokio::spawn(async move { c.lock("k").wait(BOUND).acquire().await })
    };
    tokio::time::timeout(BOUND, async {
        while c[2].in_line("k") == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the writer never started waiting");
    r1.release().await.unwrap();
    assert!(
        c[0].inspect_all("k").await.unwrap().len() == 1 && !writer.is_finished(),
        "the writer got in beside a reader"
    );
    r2.release().await.unwrap();
    let w = writer.await.unwrap().unwrap();
    assert!(w.token() > last_reader);
    assert!(c[0]
        .lock("k")
        .shared()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
}

/// Readers that arrive while a writer waits queue behind it, so a stream of overlapping
/// readers cannot starve the writer.
#[tokio::test]
async fn a_waiting_writer_is_not_starved_by_later_readers() {
    let store = MemoryBackend::new();
    let c = clients(&store, 3);
    let ttl = Duration::from_secs(5);
    let first = c[0].lock("k").shared().ttl(ttl).acquire().await.unwrap();
    let writer = {
        let c = c[1].clone();
        tokio::spawn(async move { c.lock("k").ttl(ttl).wait(BOUND).acquire().await })
    };
    tokio::time::timeout(BOUND, async {
        while c[2]
            .lock("k")
            .shared()
            .try_acquire()
            .await
            .unwrap()
            .is_some()
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("a later reader kept getting in while the writer waited");
    first.release().await.unwrap();
    let w = writer.await.unwrap().unwrap();
    assert_eq!(w.claim().mode(), ClaimMode::Exclusive);
}

/// A writer that gives up lets the readers it held back in at once (its reservation goes).
#[tokio::test]
async fn a_writer_that_gives_up_lets_the_readers_behind_it_in() {
    let store = MemoryBackend::new();
    let c = clients(&store, 3);
    let reader = c[0].lock("k").shared().acquire().await.unwrap();
    let err = c[1]
        .lock("k")
        .wait(Duration::from_millis(30))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    let started = Instant::now();
    let second = c[2].lock("k").shared().wait(BOUND).acquire().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    drop((reader, second));
}

#[tokio::test]
async fn a_semaphore_never_lends_more_than_its_permits_and_serves_everyone() {
    let store = MemoryBackend::new();
    let c = clients(&store, 4);
    let in_use = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (c, in_use, most) = (c[i % 4].clone(), in_use.clone(), most.clone());
        let permits = if i % 5 == 0 { 2 } else { 1 };
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let g = c
                    .semaphore("pool", 4)
                    .permits(permits)
                    .wait(BOUND)
                    .acquire()
                    .await
                    .unwrap();
                let now =
                    in_use.fetch_add(u64::from(permits), Ordering::SeqCst) + u64::from(permits);
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                in_use.fetch_sub(u64::from(permits), Ordering::SeqCst);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 4, "{most} permits out of 4");
    assert!(
        most >= 3,
        "the semaphore never lent more than {most} at once"
    );
}

#[tokio::test]
async fn a_capacity_that_differs_from_the_stored_one_is_refused_naming_both() {
    let store = MemoryBackend::new();
    let c = clients(&store, 2);
    let held = c[0].semaphore("k", 8).acquire().await.unwrap();
    for (what, asked) in [
        ("semaphore of 4", c[1].semaphore("k", 4).try_acquire().await),
        ("exclusive", c[1].lock("k").try_acquire().await),
        ("shared", c[1].lock("k").shared().try_acquire().await),
    ] {
        let err = asked.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, LockError::Config { .. }), "{what}: {text}");
        assert!(text.contains("semaphore of 8"), "{what}: {text}");
    }
    held.release().await.unwrap();
    // Free again: any capacity takes it.
    let four = c[1].semaphore("k", 4).try_acquire().await.unwrap();
    assert!(four.is_some());
}

#[tokio::test]
async fn re_entry_keeps_the_mode_and_a_different_mode_is_an_error() {
    let client = LockClient::new(MemoryBackend::new());
    let owner = client.new_owner();
    let r = client
        .lock("k")
        .shared()
        .owner(owner.clone())
        .acquire()
        .await
        .unwrap();
    let again = client
        .lock("k")
        .shared()
        .owner(owner.clone())
        .acquire()
        .await
        .unwrap();
    assert_eq!(r.token(), again.token());
    let err = client
        .lock("k")
        .owner(owner.clone())
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert!(err.to_string().contains("no upgrade"), "{err}");
    let err = client
        .semaphore("k", 3)
        .owner(owner)
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert_eq!(
        again.release().await.unwrap(),
        ReleaseOutcome::StillHeld { holds: 1 }
    );
    assert_eq!(r.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test]
async fn nonsense_claims_are_config_errors_before_any_request() {
    let client = LockClient::new(MemoryBackend::new());
    for err in [
        client.semaphore("k", 0).try_acquire().await.unwrap_err(),
        client
            .semaphore("k", 2)
            .permits(3)
            .try_acquire()
            .await
            .unwrap_err(),
        client
            .semaphore("k", 2)
            .permits(0)
            .try_acquire()
            .await
            .unwrap_err(),
        client.lock("k").permits(2).try_acquire().await.unwrap_err(),
        client
            .semaphore("k", 2)
            .shared()
            .try_acquire()
            .await
            .unwrap_err(),
    ] {
        assert!(matches!(err, LockError::Config { .. }), "{err}");
    }
    assert!(client.inspect_all("k").await.unwrap().is_empty());
}

/// A backend without shared claims answers with a clear error naming itself.
#[tokio::test]
async fn a_backend_without_shared_claims_says_so() {
    let client = LockClient::new(Faulty::new());
    assert!(!client.capabilities().shared);
    let err = client.lock("k").shared().try_acquire().await.unwrap_err();
    assert!(err.to_string().contains("does not support shared"), "{err}");
    let err = client.semaphore("k", 2).try_acquire().await.unwrap_err();
    assert!(
        err.to_string().contains("does not support semaphores"),
        "{err}"
    );
}

/// One writer's release lets every waiting reader in promptly, clients sharing one store
/// in one process included: each shared grant passes the wake-up on.
#[tokio::test]
async fn a_release_wakes_every_reader_that_fits_not_just_one() {
    let store = MemoryBackend::new();
    let c = clients(&store, 6);
    let ttl = Duration::from_secs(30);
    let writer = c[0].lock("k").ttl(ttl).acquire().await.unwrap();
    let mut readers = Vec::new();
    for c in &c[1..] {
        let c = c.clone();
        readers.push(tokio::spawn(async move {
            c.lock("k").shared().ttl(ttl).wait(BOUND).acquire().await
        }));
    }
    // Every reader was refused and waits (it is in its client's line).
    tokio::time::timeout(BOUND, async {
        while c[1..].iter().any(|c| c.in_line("k") == 0) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the readers never started waiting");
    let released = Instant::now();
    writer.release().await.unwrap();
    let mut guards = Vec::new();
    for r in readers {
        guards.push(r.await.unwrap().unwrap());
    }
    // Without the chain, all but one would sleep until the writer's TTL ran out.
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "{:?}",
        released.elapsed()
    );
    assert_eq!(c[0].inspect_all("k").await.unwrap().len(), 5);
}

/// A refused `try_acquire` of a shared claim or of permits takes back the turn the store
/// kept for it (a reservation) before it answers, not only in the background: a permit freed
/// at once goes to the next request, not to a request that has already given up. (On this
/// one-thread runtime the background clean-up has not run when the next request is sent.)
#[tokio::test]
async fn a_refused_claim_leaves_no_reservation_behind() {
    let store = MemoryBackend::new();
    let c = clients(&store, 3);
    let held = c[0].semaphore("k", 1).acquire().await.unwrap();
    assert!(c[1]
        .semaphore("k", 1)
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    held.release().await.unwrap();
    let next = c[2].semaphore("k", 1).try_acquire().await.unwrap();
    assert!(
        next.is_some(),
        "the permit was kept for a request that had given up"
    );
}
