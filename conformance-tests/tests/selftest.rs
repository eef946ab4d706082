//! The suite can fail: each deliberately broken backend is caught by the scenarios named
//! here, and the healthy reference backend passes them all through the same runner. The
//! broken backends declare shared claims and semaphores (as the memory backend does), so
//! the whole catalogue runs against each.

use std::sync::Arc;
use std::time::Duration;

use conformance_tests::broken::{Breakage, Broken};
use conformance_tests::layer::InProcessStore;
use conformance_tests::{catalogue, FaultStore, Harness};
use lockcore::memory::MemoryBackend;
use lockcore::{LockBackend, LockClient, LockError};

/// One broken store shared by every client of a run, as a real store is: what one client's
/// requests left in it (e.g. the owner tokens a broken inspect reveals) the others see.
struct BrokenHarness {
    backend: Arc<dyn LockBackend>,
    breakage: Option<Breakage>,
}

fn wrap(store: Arc<MemoryBackend>, breakage: Option<Breakage>) -> Arc<dyn LockBackend> {
    match breakage {
        Some(b) => Arc::new(Broken::new(store, b)),
        None => store,
    }
}

#[async_trait::async_trait]
impl Harness for BrokenHarness {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(self.backend.clone()))
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(200)
    }

    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        let breakage = self.breakage;
        Ok(Some(Box::new(InProcessStore::new(move || {
            wrap(MemoryBackend::new(), breakage)
        }))))
    }
}

/// Runs the whole catalogue at once against `breakage` and returns the scenarios that failed.
fn caught_by(breakage: Option<Breakage>) -> Vec<&'static str> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let harness: Arc<dyn Harness> = Arc::new(BrokenHarness {
            backend: wrap(MemoryBackend::new(), breakage),
            breakage,
        });
        let runs: Vec<_> = catalogue()
            .into_iter()
            .map(|s| {
                let h = harness.clone();
                tokio::spawn(async move {
                    let outcome = tokio::time::timeout(Duration::from_secs(20), (s.run)(h)).await;
                    (
                        s.name,
                        matches!(outcome, Ok(Ok(()))),
                        format!("{outcome:?}"),
                    )
                })
            })
            .collect();
        let mut caught = Vec::new();
        for r in runs {
            let (name, passed, detail) = r.await.unwrap();
            if !passed {
                println!("{breakage:?} caught by {name}: {detail}");
                caught.push(name);
            }
        }
        caught.sort();
        caught
    })
}

fn assert_caught(breakage: Breakage, expected: &[&str]) {
    let caught = caught_by(Some(breakage));
    println!(
        "{breakage:?} is caught by {} scenarios: {caught:?}",
        caught.len()
    );
    for name in expected {
        assert!(
            caught.contains(name),
            "{breakage:?} was not caught by {name}; caught by {caught:?}"
        );
    }
}

#[test]
fn healthy_backend_passes_everything() {
    assert_eq!(caught_by(None), Vec::<&str>::new());
}

#[test]
fn grants_everyone() {
    assert_caught(
        Breakage::GrantsEveryone,
        &[
            "election_one_leader_at_a_time",
            "hostile_keys_isolated",
            "late_release_keeps_new_holder",
            "mutual_exclusion",
            "readers_exclude_writer",
            "reentrant_counts",
            "release_by_stranger_is_not_held",
            "resign_hands_over_promptly",
            "semaphore_never_exceeds_capacity",
            "try_acquire_reports_holder",
            "wait_deadline_times_out",
            "watchdog_keeps_lock",
            "writer_excludes_readers",
        ],
    );
}

#[test]
fn release_ignores_owner() {
    assert_caught(
        Breakage::ReleaseIgnoresOwner,
        &[
            "late_release_keeps_new_holder",
            "release_by_stranger_is_not_held",
        ],
    );
}

#[test]
fn tokens_do_not_increase() {
    assert_caught(
        Breakage::TokensDoNotIncrease,
        &[
            "deposed_leader_term_rejected",
            "election_one_leader_at_a_time",
            "expiry_frees_lock",
            "fencing_tokens_increase",
            "mutual_exclusion",
            "observers_see_every_leader",
            "paused_holder_write_rejected",
            "readers_share",
            "resign_hands_over_promptly",
            "stale_token_rejected",
            "tokens_increase_across_modes",
        ],
    );
}

#[test]
fn never_expires() {
    assert_caught(
        Breakage::NeverExpires,
        &[
            "dead_holder_permits_return",
            "deposed_leader_term_rejected",
            "expiry_frees_lock",
            "extend_keeps_and_fails_after_loss",
            "fencing_tokens_increase",
            "late_release_keeps_new_holder",
            "paused_holder_write_rejected",
            "paused_reader_does_not_block_writer",
            "stale_token_rejected",
            "tokens_increase_across_modes",
            "try_acquire_reports_holder",
        ],
    );
}

#[test]
fn notifications_never_fire() {
    assert_caught(
        Breakage::NotificationsNeverFire,
        &[
            "cancelled_acquire_leaves_nothing",
            "contended_handoff_keeps_waking",
            "readers_exclude_writer",
            "release_wakes_enough_waiters",
            "resign_hands_over_promptly",
            "waiter_acquires_after_release",
            "writer_excludes_readers",
        ],
    );
}

#[test]
fn acquire_answer_lost() {
    assert_caught(
        Breakage::AcquireAnswerLost,
        &[
            "dropped_guard_released",
            "many_keys",
            "mutual_exclusion",
            "try_acquire_reports_holder",
        ],
    );
}

#[test]
fn extend_ignores_owner() {
    assert_caught(
        Breakage::ExtendIgnoresOwner,
        &[
            "extend_keeps_and_fails_after_loss",
            "lost_fires_when_renewal_impossible",
        ],
    );
}

#[test]
fn inspect_shows_owner_token() {
    assert_caught(
        Breakage::InspectShowsOwnerToken,
        &[
            "inspect_hides_owner_token",
            "observers_see_every_leader",
            "readers_share",
        ],
    );
}

/// lockcore's side of a lost answer: the attempt answered (with an error), so it is no
/// longer in flight, and a release by owner undoes what the store applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockcore_compensates_an_acquire_whose_answer_was_lost() {
    let store = MemoryBackend::new();
    let client = LockClient::new(Arc::new(Broken::new(
        store.clone(),
        Breakage::AcquireAnswerLost,
    )));
    let err = client
        .lock("k")
        .ttl(Duration::from_secs(600))
        .try_acquire()
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    client.shutdown().await;
    assert_eq!(
        store.held_count(),
        0,
        "the applied grant was left to its 600 s TTL"
    );
}

#[test]
fn release_does_nothing() {
    assert_caught(
        Breakage::ReleaseDoesNothing,
        &[
            "dropped_guard_released",
            "many_keys",
            "readers_share",
            "reentrant_counts",
            "shared_reentry_keeps_mode",
            "wait_deadline_times_out",
        ],
    );
}

#[test]
fn extend_creates() {
    assert_caught(
        Breakage::ExtendCreates,
        &["extend_keeps_and_fails_after_loss"],
    );
}

#[test]
fn semaphore_admits_one_more() {
    assert_caught(
        Breakage::SemaphoreAdmitsOneMore,
        &[
            "dead_holder_permits_return",
            "semaphore_never_exceeds_capacity",
        ],
    );
}

#[test]
fn readers_ignore_writer() {
    assert_caught(Breakage::ReadersIgnoreWriter, &["writer_excludes_readers"]);
}

#[test]
fn reservations_never_kept() {
    assert_caught(
        Breakage::ReservationsNeverKept,
        &["writer_not_starved_by_readers"],
    );
}

#[test]
fn capacity_mismatch_granted() {
    assert_caught(
        Breakage::CapacityMismatchGranted,
        &["capacity_mismatch_refused"],
    );
}

#[test]
fn shared_grant_wakes_nobody() {
    assert_caught(
        Breakage::SharedGrantWakesNobody,
        &["release_wakes_enough_waiters", "writer_excludes_readers"],
    );
}
