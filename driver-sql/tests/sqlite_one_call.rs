//! SQLite's one-statement paths: a shared claim, whatever it decides, the release and the
//! renewal of a lease are each ONE statement (counted in sqlx's log of the statements it
//! runs), and every decision of a claim answers as the contract says. A test binary of its own, because it installs the process's global
//! `tracing` subscriber (see `common::LogCapture`).
#![cfg(feature = "sqlite")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::LogCapture;
use distlock_sql::sqlite::SqliteBackend;
use distlock_sql::SqlOptions;
use lockcore::driver::{AcquireOutcome, Contention, ExtendOutcome, LockBackendExt};
use lockcore::{Claim, FencingToken, LockBackend, LockError, Owner, ReleaseOutcome};

const TTL: Duration = Duration::from_secs(30);

/// The statements sqlx logged since the last call (one `sqlx::query` line each), but for
/// the set-up of a connection the pool opened meanwhile (its `PRAGMA`s).
fn statements(capture: &LogCapture) -> Vec<String> {
    capture
        .take()
        .lines()
        .filter(|l| l.contains("sqlx::query") && !l.contains("summary=\"PRAGMA"))
        .map(str::to_owned)
        .collect()
}

/// Runs `op`: its answer and the statements it ran.
async fn counted<T>(
    capture: &LogCapture,
    op: impl std::future::Future<Output = T>,
) -> (T, Vec<String>) {
    statements(capture);
    let answer = op.await;
    (answer, statements(capture))
}

/// Runs `op` and checks that it ran exactly one statement, on the leases table.
async fn one_statement<T>(
    capture: &LogCapture,
    what: &str,
    op: impl std::future::Future<Output = T>,
) -> T {
    let (answer, ran) = counted(capture, op).await;
    assert!(
        ran.len() == 1 && ran[0].contains("_leases"),
        "{what}: expected one statement on the leases table, ran {}:\n{}",
        ran.len(),
        ran.join("\n")
    );
    answer
}

/// Runs `op`, an exclusive claim, and checks that it tried the exclusive statement before
/// the claim (more than one statement).
async fn exclusive_first<T>(
    capture: &LogCapture,
    what: &str,
    op: impl std::future::Future<Output = T>,
) -> T {
    let (answer, ran) = counted(capture, op).await;
    assert!(
        ran.len() > 1,
        "{what}: expected the exclusive statement first, ran {ran:?}"
    );
    answer
}

fn granted(o: Result<AcquireOutcome, LockError>) -> FencingToken {
    match o.unwrap() {
        AcquireOutcome::Acquired(g) => g.token,
        AcquireOutcome::Held(c) => panic!("expected a grant, got contention {c:?}"),
    }
}

fn refused(o: Result<AcquireOutcome, LockError>) -> Contention {
    match o.unwrap() {
        AcquireOutcome::Held(c) => c,
        AcquireOutcome::Acquired(g) => panic!("expected contention, got a grant {g:?}"),
    }
}

/// Each decision of a claim, and the releases and renewals of leases: each one statement,
/// every answer the contract's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_releases_and_renewals_of_leases_take_one_statement() {
    let capture = LogCapture::global();
    let dir = std::env::temp_dir().join(format!("distlock-one-call-{}", common::random_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite:{}", dir.join("locks.db").display());
    let b: Arc<dyn LockBackend> = SqliteBackend::connect(&url, SqlOptions::new())
        .await
        .unwrap();
    // The first release starts the garbage collector in the background: let it run
    // before counting.
    let warm = common::key("warm");
    let o = Owner::new("warm");
    granted(b.try_claim(&warm, &o, TTL, Claim::shared()).await);
    b.release(&warm, &o).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Readers: granted on a fresh key and beside another reader, renewed, released.
    let k = common::key("rw");
    let (r1, r2, w) = (Owner::new("r1"), Owner::new("r2"), Owner::new("w"));
    let t1 = one_statement(&capture, "first reader", async {
        granted(b.try_claim(&k, &r1, TTL, Claim::shared()).await)
    })
    .await;
    let t2 = one_statement(&capture, "second reader", async {
        granted(b.try_claim(&k, &r2, TTL, Claim::shared()).await)
    })
    .await;
    assert!(t2 > t1, "every grant takes the next token");
    let extended = one_statement(&capture, "renewal", b.extend(&k, &r1, TTL * 2)).await;
    match extended.unwrap() {
        ExtendOutcome::Extended(g) => assert_eq!(g.token, t1, "a renewal keeps the token"),
        other => panic!("expected a renewal, got {other:?}"),
    }
    let all = b.holders(&k).await.unwrap();
    assert!(all[0].remaining_ttl.unwrap() > TTL, "{all:?}");
    // The same owner asks again: its token.
    let again = one_statement(&capture, "same reader again", async {
        granted(b.try_claim(&k, &r2, TTL, Claim::shared()).await)
    })
    .await;
    assert_eq!(again, t2);
    // A writer behind readers: refused, with a reservation that holds new readers back.
    let c = exclusive_first(&capture, "writer behind readers", async {
        refused(b.try_claim(&k, &w, TTL, Claim::exclusive()).await)
    })
    .await;
    assert!(
        !c.hint.is_behind_reservation(),
        "waits for a release: {c:?}"
    );
    let r3 = Owner::new("r3");
    let c = one_statement(&capture, "reader behind the reservation", async {
        refused(b.try_claim(&k, &r3, TTL, Claim::shared()).await)
    })
    .await;
    assert!(
        c.hint.is_behind_reservation(),
        "held back by the reservation: {c:?}"
    );
    // A semaphore's claim on a read-write key: the capacity mismatch.
    let err = b
        .try_claim(&k, &r3, TTL, Claim::permits(1, 4).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    let released = one_statement(&capture, "release", b.release(&k, &r1)).await;
    assert_eq!(released.unwrap(), ReleaseOutcome::Released);
    let released = one_statement(&capture, "release", b.release(&k, &r2)).await;
    assert_eq!(released.unwrap(), ReleaseOutcome::Released);
    // Released twice, renewed after the release: not held.
    assert_eq!(b.release(&k, &r1).await.unwrap(), ReleaseOutcome::NotHeld);
    assert_eq!(
        b.extend(&k, &r1, TTL).await.unwrap(),
        ExtendOutcome::NotHeld
    );
    // The readers gone, the writer that reserved takes the key, after every reader's token.
    let tw = granted(b.try_claim(&k, &w, TTL, Claim::exclusive()).await);
    assert!(tw > t2);
    let c = refused(b.try_claim(&k, &r3, TTL, Claim::shared()).await);
    assert!(c.remaining_ttl.is_some_and(|r| r > TTL / 2), "{c:?}");
    assert_eq!(b.release(&k, &w).await.unwrap(), ReleaseOutcome::Released);
    // After an exclusive holder: a reader in one statement again.
    let t3 = one_statement(&capture, "reader after a writer", async {
        granted(b.try_claim(&k, &r3, TTL, Claim::shared()).await)
    })
    .await;
    assert!(t3 > tw);
    b.release(&k, &r3).await.unwrap();

    // A semaphore of two: two permits in one statement each, the third refused and
    // reserved, then granted in one statement once a permit comes back.
    let s = common::key("sem");
    let two = Claim::permits(1, 2).unwrap();
    let (p1, p2, p3) = (Owner::new("p1"), Owner::new("p2"), Owner::new("p3"));
    for p in [&p1, &p2] {
        one_statement(&capture, "permit", async {
            granted(b.try_claim(&s, p, TTL, two).await)
        })
        .await;
    }
    let c = refused(b.try_claim(&s, &p3, TTL, two).await);
    assert!(!c.hint.is_behind_reservation(), "{c:?}");
    b.release(&s, &p1).await.unwrap();
    // Another owner does not fit beside p2 and p3's reservation.
    let late = Owner::new("late");
    let c = refused(b.try_claim(&s, &late, TTL, two).await);
    assert!(c.hint.is_behind_reservation(), "{c:?}");
    one_statement(&capture, "the reservation's owner", async {
        granted(b.try_claim(&s, &p3, TTL, two).await)
    })
    .await;
    // Its reservation is spent: a permit released lets the late owner in at once.
    b.release(&s, &p2).await.unwrap();
    one_statement(&capture, "permit after the reservation", async {
        granted(b.try_claim(&s, &late, TTL, two).await)
    })
    .await;
    assert_eq!(b.holders(&s).await.unwrap().len(), 2);
    assert_eq!(b.force_release(&s).await.unwrap(), ReleaseOutcome::Released);
    assert!(b.holders(&s).await.unwrap().is_empty());
    assert!(b.inspect(&s).await.unwrap().is_none());
    b.shutdown().await;
    std::fs::remove_dir_all(&dir).ok();
}
