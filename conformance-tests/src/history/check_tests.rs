//! Each check fires on a hand-written bad history and stays quiet on a good one.

use std::time::Duration;

use super::*;
use EventKind::*;

/// A history written by hand: events at milliseconds.
#[derive(Default)]
struct H(Vec<Event>);

impl H {
    fn at(mut self, ms: u64, kind: EventKind) -> Self {
        self.0.push(Event {
            at: Duration::from_millis(ms),
            kind,
        });
        self
    }

    /// A whole hold of worker `w`: invoke, acquire `token`, read `value - 1`, write `value`
    /// (both accepted), release — starting at `ms`, 10 ms per step.
    fn hold(self, ms: u64, w: WorkerId, token: u64, value: u64) -> Self {
        self.at(ms, Invoke { worker: w })
            .at(ms + 10, acquired(w, token))
            .at(
                ms + 20,
                Read {
                    worker: w,
                    token,
                    outcome: Ok(value - 1),
                },
            )
            .at(
                ms + 30,
                Write {
                    worker: w,
                    token,
                    value,
                    accepted: true,
                },
            )
            .at(ms + 40, ReleaseInvoked { worker: w })
            .at(
                ms + 50,
                Released {
                    worker: w,
                    outcome: "Released".into(),
                },
            )
    }

    /// A hold of worker `w` with `token` that does not touch the register.
    fn bare(self, ms: u64, w: WorkerId, token: u64) -> Self {
        self.at(ms, Invoke { worker: w })
            .at(ms + 10, acquired(w, token))
            .at(ms + 40, ReleaseInvoked { worker: w })
    }

    fn report(&self) -> Report {
        check(
            &self.0,
            &CheckConfig {
                liveness_bound: Duration::from_millis(1000),
                lost_late: Duration::from_millis(20),
            },
        )
    }

    fn failed(&self) -> Vec<Check> {
        self.report().failed_checks()
    }
}

/// Worker `w` holds the whole key with `token`.
fn acquired(w: WorkerId, token: u64) -> EventKind {
    Acquired {
        worker: w,
        token,
        claim: lockcore::Claim::exclusive(),
    }
}

fn spawned(w: WorkerId) -> EventKind {
    Spawned {
        worker: w,
        pid: 100 + w,
    }
}

#[test]
fn good_history_passes() {
    let h = H::default()
        .at(0, spawned(1))
        .at(0, spawned(2))
        .hold(10, 1, 5, 1)
        .hold(70, 2, 6, 2)
        .hold(130, 1, 9, 3)
        .at(200, End);
    let r = h.report();
    assert!(r.passed(), "{r}");
    assert_eq!(r.stats.grants, 3);
    assert_eq!(r.stats.writes_accepted, 3);
}

#[test]
fn repeated_token_fails_uniqueness() {
    let h = H::default()
        .hold(10, 1, 5, 1)
        .hold(70, 2, 5, 2)
        .at(200, End);
    assert!(h.failed().contains(&Check::UniqueTokens));
}

#[test]
fn lower_token_after_an_observed_grant_fails_order() {
    let h = H::default().bare(10, 1, 7).bare(70, 2, 6).at(200, End);
    assert_eq!(h.failed(), vec![Check::TokenOrder]);
}

#[test]
fn concurrent_requests_may_get_tokens_in_either_order() {
    // Both invoked before either was granted: no real-time order between the grants.
    let h = H::default()
        .at(0, Invoke { worker: 1 })
        .at(1, Invoke { worker: 2 })
        .at(5, acquired(2, 8))
        .at(6, ReleaseInvoked { worker: 2 })
        .at(10, acquired(1, 7))
        .at(20, ReleaseInvoked { worker: 1 })
        .at(30, End);
    assert!(h.report().passed(), "{}", h.report());
}

/// Worker 1 holds token 5 from 10 to 100; worker 2 acquires token 6 at 50.
fn overlapping() -> H {
    H::default()
        .at(0, Invoke { worker: 1 })
        .at(10, acquired(1, 5))
        .at(40, Invoke { worker: 2 })
        .at(50, acquired(2, 6))
        .at(60, ReleaseInvoked { worker: 2 })
        .at(100, ReleaseInvoked { worker: 1 })
}

#[test]
fn unexplained_overlap_fails_mutual_exclusion() {
    let h = overlapping().at(200, End);
    assert_eq!(h.failed(), vec![Check::MutualExclusion]);
}

#[test]
fn overlap_explained_by_a_pause_of_the_holder() {
    let h = overlapping()
        .at(20, Paused { worker: 1 })
        .at(90, Resumed { worker: 1 })
        .at(95, acquired(3, 7))
        .at(96, ReleaseInvoked { worker: 3 })
        .at(200, End);
    let r = h.report();
    assert!(r.passed(), "{r}");
    assert_eq!(r.stats.explained_overlaps.values().sum::<usize>(), 2);
}

#[test]
fn a_pause_after_the_overlap_began_explains_nothing() {
    let h = overlapping()
        .at(55, Paused { worker: 1 })
        .at(90, Resumed { worker: 1 })
        .at(95, acquired(3, 7))
        .at(96, ReleaseInvoked { worker: 3 })
        .at(200, End);
    assert_eq!(h.failed(), vec![Check::MutualExclusion]);
}

#[test]
fn a_pause_of_a_bystander_explains_nothing() {
    let h = overlapping()
        .at(20, Paused { worker: 3 })
        .at(30, Resumed { worker: 3 })
        .at(200, End);
    assert_eq!(h.failed(), vec![Check::MutualExclusion]);
}

#[test]
fn overlap_explained_by_a_store_restart() {
    let h = overlapping().at(20, StoreDown).at(45, StoreUp).at(200, End);
    let r = h.report();
    assert!(r.passed(), "{r}");
    assert_eq!(r.stats.restarts, 1);
}

#[test]
fn a_restart_before_both_requests_explains_nothing() {
    let h = H::default()
        .at(0, StoreDown)
        .at(5, StoreUp)
        .at(6, Invoke { worker: 1 })
        .at(10, acquired(1, 5))
        .at(40, Invoke { worker: 2 })
        .at(50, acquired(2, 6))
        .at(100, ReleaseInvoked { worker: 1 })
        .at(200, End);
    assert_eq!(h.failed(), vec![Check::MutualExclusion]);
}

#[test]
fn overlap_explained_by_lost() {
    // Fired at 45, before w2's grant at 50; reported at 70.
    let h = overlapping().at(70, lost(1, 25)).at(200, End);
    assert!(h.report().passed(), "{}", h.report());
    // Fired at 65: late, but within the 20 ms a timer may be late.
    let h = overlapping().at(70, lost(1, 5)).at(200, End);
    assert!(h.report().passed(), "{}", h.report());
}

#[test]
fn a_loss_noticed_long_after_the_overlap_explains_nothing() {
    // w1's lost() fired at 90, 40 ms after w2 got the key: the loss was found (a renewal
    // answered "not held"), not the reason w2 could take it.
    let h = overlapping().at(95, lost(1, 5)).at(200, End);
    assert_eq!(h.failed(), vec![Check::MutualExclusion]);
}

fn lost(worker: WorkerId, ago_ms: u64) -> EventKind {
    Lost {
        worker,
        ago: Duration::from_millis(ago_ms),
    }
}

#[test]
fn a_killed_holder_holds_no_more() {
    let h = H::default()
        .at(0, Invoke { worker: 1 })
        .at(10, acquired(1, 5))
        .at(20, Killed { worker: 1 })
        .at(21, spawned(3))
        .at(30, Invoke { worker: 2 })
        .at(400, acquired(2, 6))
        .at(410, ReleaseInvoked { worker: 2 })
        .at(500, End);
    let r = h.report();
    assert!(r.passed(), "{r}");
    assert_eq!(r.stats.heal_latencies.len(), 1);
}

#[test]
fn superseded_holder_write_accepted_fails_stale_write() {
    // Worker 1 (token 5) is paused mid-update; worker 2 asks after it, gets token 5 again
    // (broken) and uses the register; worker 1's write is then accepted.
    let h = H::default()
        .at(0, Invoke { worker: 1 })
        .at(10, acquired(1, 5))
        .at(
            20,
            Read {
                worker: 1,
                token: 5,
                outcome: Ok(0),
            },
        )
        .at(25, Paused { worker: 1 })
        .at(30, Invoke { worker: 2 })
        .at(40, acquired(2, 5))
        .at(
            50,
            Read {
                worker: 2,
                token: 5,
                outcome: Ok(0),
            },
        )
        .at(60, Resumed { worker: 1 })
        .at(
            70,
            Write {
                worker: 1,
                token: 5,
                value: 1,
                accepted: true,
            },
        )
        .at(80, ReleaseInvoked { worker: 1 })
        .at(90, ReleaseInvoked { worker: 2 })
        .at(200, End);
    let failed = h.failed();
    assert!(failed.contains(&Check::StaleWrite), "{failed:?}");
    assert!(
        !failed.contains(&Check::MutualExclusion),
        "the pause explains it"
    );
}

#[test]
fn superseded_holder_write_rejected_passes() {
    let h = H::default()
        .at(0, Invoke { worker: 1 })
        .at(10, acquired(1, 5))
        .at(
            20,
            Read {
                worker: 1,
                token: 5,
                outcome: Ok(0),
            },
        )
        .at(25, Paused { worker: 1 })
        .at(30, Invoke { worker: 2 })
        .at(40, acquired(2, 6))
        .at(
            50,
            Read {
                worker: 2,
                token: 6,
                outcome: Ok(0),
            },
        )
        .at(60, Resumed { worker: 1 })
        .at(
            70,
            Write {
                worker: 1,
                token: 5,
                value: 1,
                accepted: false,
            },
        )
        .at(
            75,
            Write {
                worker: 2,
                token: 6,
                value: 1,
                accepted: true,
            },
        )
        .at(80, ReleaseInvoked { worker: 1 })
        .at(90, ReleaseInvoked { worker: 2 })
        .at(100, acquired(3, 7))
        .at(200, End);
    let r = h.report();
    assert!(r.passed(), "{r}");
    assert_eq!(r.stats.writes_rejected, 1);
}

#[test]
fn a_write_accepted_with_a_lower_token_than_used_fails_stale_write() {
    // A register that let a lower token through after a higher one was used.
    let h = H::default()
        .at(0, Invoke { worker: 1 })
        .at(5, acquired(1, 5))
        .at(6, lost(1, 0))
        .hold(10, 2, 6, 1)
        .at(
            100,
            Write {
                worker: 1,
                token: 5,
                value: 2,
                accepted: true,
            },
        )
        .at(200, End);
    assert_eq!(h.failed(), vec![Check::StaleWrite]);
}

#[test]
fn a_write_not_on_the_last_value_fails_lost_update() {
    let h = H::default()
        .hold(10, 1, 5, 1)
        .hold(70, 2, 6, 1)
        .at(200, End);
    assert_eq!(h.failed(), vec![Check::LostUpdate]);
}

#[test]
fn no_grant_after_a_heal_fails_liveness() {
    let h = H::default()
        .hold(10, 1, 5, 1)
        .at(100, StoreDown)
        .at(200, StoreUp)
        .hold(1300, 1, 6, 2)
        .at(1500, End);
    let r = h.report();
    assert_eq!(r.failed_checks(), vec![Check::Liveness], "{r}");
    let quick = H::default()
        .hold(10, 1, 5, 1)
        .at(100, StoreDown)
        .at(200, StoreUp)
        .hold(300, 1, 6, 2)
        .at(1500, End);
    assert!(quick.report().passed(), "{}", quick.report());
}

#[test]
fn no_grant_at_all_fails_liveness() {
    let h = H::default()
        .at(0, Invoke { worker: 1 })
        .at(
            5,
            AcquireFailed {
                worker: 1,
                error: "connect: refused".into(),
            },
        )
        .at(100, End);
    assert_eq!(h.failed(), vec![Check::Liveness]);
    let text = h.report().to_string();
    assert!(
        text.contains("first failed acquire: w1 at 0.005 s: connect: refused"),
        "{text}"
    );
}

#[test]
fn events_after_the_end_do_not_count() {
    let h = H::default()
        .hold(10, 1, 5, 1)
        .at(100, End)
        .at(110, acquired(2, 1));
    assert!(h.report().passed(), "{}", h.report());
}

#[test]
fn report_names_the_failed_checks() {
    let h = H::default()
        .hold(10, 1, 5, 1)
        .hold(70, 2, 5, 1)
        .at(200, End);
    let text = h.report().to_string();
    assert!(text.contains("FAILED  tokens unique"), "{text}");
    assert!(text.contains("FAILED  no lost update"), "{text}");
    assert!(
        text.ends_with("FAILED: tokens unique, tokens increase in grant order, no lost update"),
        "{text}"
    );
}

/// Worker `w` holds `claim` of the key with `token`.
fn claimed(w: WorkerId, token: u64, claim: lockcore::Claim) -> EventKind {
    Acquired {
        worker: w,
        token,
        claim,
    }
}

fn permits(k: u32, n: u32) -> lockcore::Claim {
    lockcore::Claim::permits(k, n).unwrap()
}

impl H {
    /// Worker `w` holds `claim` with `token` from `ms + 10` to `ms + 40`, touching nothing.
    fn claim(self, ms: u64, w: WorkerId, token: u64, claim: lockcore::Claim) -> Self {
        self.at(ms, Invoke { worker: w })
            .at(ms + 10, claimed(w, token, claim))
            .at(ms + 40, ReleaseInvoked { worker: w })
    }
}

#[test]
fn overlapping_readers_pass() {
    let shared = lockcore::Claim::shared();
    let h = H::default()
        .claim(0, 1, 5, shared)
        .claim(20, 2, 6, shared)
        .claim(25, 3, 7, shared)
        .at(200, End);
    assert!(h.report().passed(), "{}", h.report());
}

#[test]
fn a_writer_overlapping_a_reader_fails_mutual_exclusion() {
    let (shared, whole) = (lockcore::Claim::shared(), lockcore::Claim::exclusive());
    for (first, second) in [(shared, whole), (whole, shared)] {
        let h = H::default()
            .claim(0, 1, 5, first)
            .claim(20, 2, 6, second)
            .at(200, End);
        let report = h.report();
        assert_eq!(
            report.failed_checks(),
            vec![Check::MutualExclusion],
            "{report}"
        );
        assert!(report.to_string().contains("(shared)"), "{report}");
    }
}

#[test]
fn a_semaphore_passes_with_its_permits_out_and_fails_past_them() {
    let two = H::default()
        .claim(0, 1, 5, permits(1, 3))
        .claim(5, 2, 6, permits(2, 3))
        .at(200, End);
    assert!(two.report().passed(), "{}", two.report());
    let over = H::default()
        .claim(0, 1, 5, permits(1, 3))
        .claim(5, 2, 6, permits(1, 3))
        .claim(10, 3, 7, permits(2, 3))
        .at(200, End);
    let report = over.report();
    assert_eq!(
        report.failed_checks(),
        vec![Check::MutualExclusion],
        "{report}"
    );
    let text = report.to_string();
    assert!(
        text.contains("w3 acquired token 7 (2 of 3 permits)"),
        "{text}"
    );
    assert!(text.contains("w1 held token 5 (1 of 3 permits)"), "{text}");
}

#[test]
fn a_permit_past_the_capacity_is_excused_by_a_pause_of_its_holder() {
    let h = H::default()
        .at(0, Invoke { worker: 1 })
        .at(10, claimed(1, 5, permits(1, 2)))
        .at(12, Paused { worker: 1 })
        .at(13, Invoke { worker: 2 })
        .at(15, claimed(2, 6, permits(1, 2)))
        .at(16, Invoke { worker: 3 })
        .at(20, claimed(3, 7, permits(1, 2)))
        .at(35, Resumed { worker: 1 })
        .at(36, ReleaseInvoked { worker: 1 })
        .at(37, ReleaseInvoked { worker: 2 })
        .at(38, ReleaseInvoked { worker: 3 })
        .claim(40, 2, 8, permits(1, 2))
        .at(200, End);
    assert!(h.report().passed(), "{}", h.report());
    // Without the pause, the third permit is one too many.
    let unpaused: Vec<Event> =
        h.0.iter()
            .filter(|e| !matches!(e.kind, Paused { .. } | Resumed { .. }))
            .cloned()
            .collect();
    assert_eq!(H(unpaused).failed(), vec![Check::MutualExclusion]);
}

#[test]
fn grants_of_two_capacities_overlapping_fail() {
    let h = H::default()
        .claim(0, 1, 5, permits(1, 4))
        .claim(10, 2, 6, permits(1, 8))
        .at(200, End);
    assert_eq!(h.failed(), vec![Check::MutualExclusion]);
}

/// A deposed writer (token 5, its lease lost) writes after a newer reader (token 6) read:
/// the fence must refuse the write, so an accepted one is a stale write.
fn deposed_writer_after_a_newer_read(accepted: bool) -> H {
    H::default()
        .at(0, Invoke { worker: 1 })
        .at(10, acquired(1, 5))
        .at(
            15,
            Read {
                worker: 1,
                token: 5,
                outcome: Ok(0),
            },
        )
        .at(21, Invoke { worker: 2 })
        .at(25, claimed(2, 6, lockcore::Claim::shared()))
        .at(
            26,
            Read {
                worker: 2,
                token: 6,
                outcome: Ok(0),
            },
        )
        .at(
            30,
            Lost {
                worker: 1,
                ago: Duration::from_millis(10),
            },
        )
        .at(
            40,
            Write {
                worker: 1,
                token: 5,
                value: 1,
                accepted,
            },
        )
        .at(50, ReleaseInvoked { worker: 1 })
        .at(60, ReleaseInvoked { worker: 2 })
        .at(200, End)
}

#[test]
fn a_write_older_than_a_readers_token_accepted_fails_stale_write() {
    let h = deposed_writer_after_a_newer_read(true);
    assert_eq!(h.failed(), vec![Check::StaleWrite]);
    let refused = deposed_writer_after_a_newer_read(false);
    assert!(refused.report().passed(), "{}", refused.report());
}

/// Worker 1 (token 5) is cut off from the store past its lease; worker 2 is granted the key
/// at 100 ms meanwhile. `lost_at`: when worker 1's `lost()` fired (reported at 140 ms), if
/// it did.
fn partitioned_holder(lost_at: Option<u64>) -> H {
    let h = H::default()
        .at(0, Invoke { worker: 1 })
        .at(10, acquired(1, 5))
        .at(15, Partitioned { worker: 1 })
        .at(20, Invoke { worker: 2 })
        .at(100, acquired(2, 6))
        .at(120, ReleaseInvoked { worker: 2 })
        .at(130, Healed { worker: 1 });
    let h = match lost_at {
        Some(at) => h.at(
            140,
            Lost {
                worker: 1,
                ago: Duration::from_millis(140 - at),
            },
        ),
        None => h,
    };
    h.at(145, ReleaseInvoked { worker: 1 })
        .claim(150, 3, 7, lockcore::Claim::exclusive())
        .at(300, End)
}

#[test]
fn a_partition_excuses_no_overlap_only_lost_does() {
    let silent = partitioned_holder(None).report();
    assert_eq!(
        silent.failed_checks(),
        vec![Check::MutualExclusion],
        "{silent}"
    );
    assert_eq!(silent.stats.partitions, 1);
    let lost_first = partitioned_holder(Some(80)).report();
    assert!(lost_first.passed(), "{lost_first}");
    // lost() fired well after the other grant (past `lost_late`, 20 ms here): what a
    // broken lock looks like.
    let lost_late = partitioned_holder(Some(135)).report();
    assert_eq!(
        lost_late.failed_checks(),
        vec![Check::MutualExclusion],
        "{lost_late}"
    );
}

#[test]
fn a_healed_partition_needs_a_grant_within_the_bound() {
    let h = H::default()
        .hold(0, 1, 5, 1)
        .at(60, Partitioned { worker: 2 })
        .at(100, Healed { worker: 2 })
        .at(2000, End);
    let report = h.report();
    assert_eq!(report.failed_checks(), vec![Check::Liveness], "{report}");
    assert!(
        report.to_string().contains("the partition of w2"),
        "{report}"
    );
}
