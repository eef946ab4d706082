//! What a claim transaction decides from the key's row and its live leases, once for every
//! database: the rule of [`Claim::fits`], same-owner re-grants, capacity mismatches and
//! reservations. Pure, so it is tested without a database.
//!
//! PostgreSQL's functions and MySQL's procedures decide by these rules inside the database,
//! and extend them with the inline lease (a free key's one lease written into its row; a second claim moves it to the leases table): they decide every
//! claim on those databases, so this transaction path (SQLite's, for the claims its one
//! statement leaves out) never meets one. A row read here with an inline lease would
//! look held by an exclusive holder: refused, never granted past it.

use lockcore::driver::READ_WRITE_CAPACITY;
use lockcore::Claim;

/// The key's row in the lock table as the claim transaction read it, under its row lock,
/// judged by the database's clock. Its columns, in this order, are what every dialect's
/// row statements answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RowSeen {
    /// The row is held (an exclusive holder, or live shared leases).
    pub(crate) live: bool,
    /// Its owner is the claiming owner (an exclusive holder).
    pub(crate) mine: bool,
    /// Its owner is the shared marker: the key is (or was last) held by leases.
    pub(crate) shared: bool,
    /// The key's last token.
    pub(crate) fence: i64,
    /// The capacity stored with the key.
    pub(crate) capacity: u64,
    /// A reservation lives.
    pub(crate) res_live: bool,
    /// The reservation is the claiming owner's.
    pub(crate) res_mine: bool,
    pub(crate) res_weight: u64,
    /// Microseconds until the row expires (the latest lease, for a shared key).
    pub(crate) remaining: i64,
    /// Microseconds until the reservation expires.
    pub(crate) res_remaining: i64,
    /// The database's clock in microseconds: the tokens' floor.
    pub(crate) now_us: i64,
}

impl RowSeen {
    /// The row statements' answer, `None` for a row of another shape.
    pub(crate) fn read(cols: &[i64]) -> Option<Self> {
        let &[live, mine, shared, fence, capacity, res_live, res_mine, res_weight, remaining, res_remaining, now_us] =
            cols
        else {
            return None;
        };
        Some(RowSeen {
            live: live != 0,
            mine: mine != 0,
            shared: shared != 0,
            fence,
            capacity: u64::try_from(capacity).ok()?,
            res_live: res_live != 0,
            res_mine: res_mine != 0,
            res_weight: u64::try_from(res_weight).unwrap_or(0),
            remaining,
            res_remaining,
            now_us,
        })
    }

    /// The key holds a live exclusive lock (perhaps the claiming owner's).
    fn exclusive(&self) -> bool {
        self.live && !self.shared
    }

    /// The key holds live shared leases.
    fn leased(&self) -> bool {
        self.live && self.shared
    }
}

/// One live lease of the key, as the leases statement answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeaseSeen {
    pub(crate) mine: bool,
    pub(crate) weight: u64,
    pub(crate) fence: i64,
    pub(crate) remaining: i64,
}

impl LeaseSeen {
    pub(crate) fn read(cols: &[i64]) -> Option<Self> {
        let &[mine, weight, fence, remaining] = cols else {
            return None;
        };
        Some(LeaseSeen {
            mine: mine != 0,
            weight: u64::try_from(weight).ok()?,
            fence,
            remaining,
        })
    }
}

/// What the claim transaction does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The key is held as another kind (capacity stored, in the error).
    Mismatch(u64),
    /// The owner holds the key exclusively: same token, expiry pushed out.
    RenewRow(i64),
    /// The owner holds a lease on the key: same token, expiry pushed out.
    RenewLease(i64),
    /// Granted the whole key with this token. A one-call claim answers the same for a
    /// lease it wrote into the key's row (PostgreSQL, MySQL/MariaDB: a free key's one lease,
    /// inline) or renewed there: its owner holds it as it holds an
    /// exclusive lock, and releases and renews it by the exclusive statements.
    GrantExclusive(i64),
    /// Granted a lease with this token.
    GrantLease(i64),
    /// Refused.
    Refuse(Refusal),
}

/// A refused claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// Microseconds until the soonest lease that blocks the claim expires (the
    /// reservation's, when only a reservation blocks it).
    pub(crate) remaining: Option<i64>,
    /// Record (or refresh) the owner's reservation.
    pub(crate) reserve: bool,
    /// Only another owner's reservation stands in the way (the leases would let it in).
    pub(crate) by_reservation: bool,
    /// The key's fence as seen: a release of a lease bumps it, so a waiter can tell that
    /// something was released before it subscribed.
    pub(crate) revision: i64,
    /// The store keeps a reservation for the claiming owner once this refusal is written:
    /// recorded or refreshed by it. (A reservation of the owner's that a refusal leaves
    /// alone is a long wait's mark, behind an exclusive holder, which the client knows of
    /// itself; the exclusive statement answers those refusals.)
    pub(crate) kept: bool,
}

/// What a one-call claim ([`Calls::claim`](crate::statements::Calls::claim)) answers in its
/// first column: the [`Decision`] it made and wrote.
pub(crate) mod kind {
    /// The key is held as another kind; the fence column carries the stored capacity.
    pub(crate) const MISMATCH: i64 = 0;
    pub(crate) const RENEW_ROW: i64 = 1;
    pub(crate) const RENEW_LEASE: i64 = 2;
    pub(crate) const GRANT_EXCLUSIVE: i64 = 3;
    pub(crate) const GRANT_LEASE: i64 = 4;
    /// Refused: remaining µs (-1 for none), by reservation (0/1, or [`KEPT`]) and the
    /// revision follow.
    pub(crate) const REFUSE: i64 = 5;
    /// A refusal's by-reservation column when the call recorded or refreshed the
    /// claimant's reservation.
    pub(crate) const KEPT: i64 = 2;
}

impl Decision {
    /// A one-call claim's answer `[kind, fence, remaining, by_reservation, revision]`;
    /// `None` for a row of another shape. `reserve` is not part of the answer (the call
    /// wrote the reservation itself) and reads `false`.
    pub(crate) fn from_call(cols: &[i64]) -> Option<Self> {
        let &[k, fence, remaining, by_reservation, revision] = cols else {
            return None;
        };
        Some(match k {
            kind::MISMATCH => Decision::Mismatch(u64::try_from(fence).ok()?),
            kind::RENEW_ROW => Decision::RenewRow(fence),
            kind::RENEW_LEASE => Decision::RenewLease(fence),
            kind::GRANT_EXCLUSIVE => Decision::GrantExclusive(fence),
            kind::GRANT_LEASE => Decision::GrantLease(fence),
            kind::REFUSE => Decision::Refuse(Refusal {
                remaining: (remaining >= 0).then_some(remaining),
                reserve: false,
                by_reservation: by_reservation == 1,
                revision,
                kept: by_reservation == kind::KEPT,
            }),
            _ => return None,
        })
    }
}

/// Decides `claim` by its owner on a key whose row is `row` and whose live leases are
/// `leases` (read only when the row is held shared).
pub(crate) fn decide(row: &RowSeen, leases: &[LeaseSeen], claim: &Claim) -> Decision {
    if (row.live || row.res_live) && row.capacity != claim.capacity() {
        return Decision::Mismatch(row.capacity);
    }
    if row.exclusive() && row.mine {
        return Decision::RenewRow(row.fence);
    }
    if row.leased() {
        if let Some(own) = leases.iter().find(|l| l.mine) {
            return Decision::RenewLease(own.fence);
        }
    }
    let others = || leases.iter().filter(|l| !l.mine);
    let used = if row.exclusive() {
        READ_WRITE_CAPACITY
    } else if row.leased() {
        others().fold(0u64, |sum, l| sum.saturating_add(l.weight))
    } else {
        0
    };
    let res_other = row.res_live && !row.res_mine;
    let reserved = if res_other { row.res_weight } else { 0 };
    if claim.fits(used, reserved) {
        let token = row.fence.saturating_add(1).max(row.now_us);
        return if claim.is_exclusive() {
            Decision::GrantExclusive(token)
        } else {
            Decision::GrantLease(token)
        };
    }
    let by_reservation = claim.fits(used, 0);
    let remaining = if row.exclusive() {
        Some(row.remaining)
    } else if !by_reservation {
        others().map(|l| l.remaining).min()
    } else {
        res_other.then_some(row.res_remaining)
    };
    // Two exclusive locks need no reservation: a writer reserves only behind leases.
    let reserve = !res_other && (!claim.is_exclusive() || row.leased());
    Decision::Refuse(Refusal {
        remaining,
        reserve,
        by_reservation,
        revision: row.fence,
        kept: reserve,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000_000;

    fn free() -> RowSeen {
        RowSeen {
            fence: 10,
            capacity: READ_WRITE_CAPACITY,
            now_us: NOW,
            ..RowSeen::default()
        }
    }

    fn leased(capacity: u64) -> RowSeen {
        RowSeen {
            live: true,
            shared: true,
            fence: NOW + 5,
            capacity,
            remaining: 9_000,
            ..free()
        }
    }

    fn lease(mine: bool, weight: u64, remaining: i64) -> LeaseSeen {
        LeaseSeen {
            mine,
            weight,
            fence: NOW + 1,
            remaining,
        }
    }

    fn refusal(d: Decision) -> Refusal {
        match d {
            Decision::Refuse(r) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn readers_share_and_a_writer_waits_for_them() {
        let row = leased(READ_WRITE_CAPACITY);
        let readers = [lease(false, 1, 3_000), lease(false, 1, 7_000)];
        assert_eq!(
            decide(&row, &readers, &Claim::shared()),
            Decision::GrantLease(NOW + 6)
        );
        let r = refusal(decide(&row, &readers, &Claim::exclusive()));
        assert_eq!(r.remaining, Some(3_000), "the soonest blocking lease");
        assert!(r.reserve && !r.by_reservation);
        assert_eq!(r.revision, NOW + 5);
    }

    #[test]
    fn a_free_key_takes_any_capacity_and_the_token_floor_is_the_clock() {
        let row = free();
        let sem = Claim::permits(2, 3).unwrap();
        assert_eq!(decide(&row, &[], &sem), Decision::GrantLease(NOW));
        assert_eq!(
            decide(&row, &[], &Claim::exclusive()),
            Decision::GrantExclusive(NOW)
        );
        let ahead = RowSeen {
            fence: NOW + 100,
            ..free()
        };
        assert_eq!(
            decide(&ahead, &[], &Claim::shared()),
            Decision::GrantLease(NOW + 101)
        );
    }

    #[test]
    fn capacities_must_agree_while_the_key_lives() {
        let sem = Claim::permits(1, 4).unwrap();
        assert_eq!(
            decide(&leased(8), &[lease(false, 1, 1)], &sem),
            Decision::Mismatch(8)
        );
        assert_eq!(
            decide(&leased(8), &[lease(false, 1, 1)], &Claim::exclusive()),
            Decision::Mismatch(8)
        );
        let held = RowSeen {
            live: true,
            remaining: 5,
            ..free()
        };
        assert_eq!(
            decide(&held, &[], &sem),
            Decision::Mismatch(READ_WRITE_CAPACITY)
        );
        let reserved = RowSeen {
            res_live: true,
            res_weight: 4,
            capacity: 4,
            ..free()
        };
        assert_eq!(
            decide(&reserved, &[], &Claim::shared()),
            Decision::Mismatch(4)
        );
        // Expired: anything goes.
        assert!(matches!(
            decide(
                &RowSeen {
                    capacity: 8,
                    ..free()
                },
                &[],
                &sem
            ),
            Decision::GrantLease(_)
        ));
    }

    #[test]
    fn the_same_owner_gets_its_token_again_whatever_it_asks() {
        let row = leased(READ_WRITE_CAPACITY);
        let mut own = lease(true, 1, 50);
        own.fence = 42;
        assert_eq!(
            decide(&row, &[own], &Claim::exclusive()),
            Decision::RenewLease(42)
        );
        let mine = RowSeen {
            live: true,
            mine: true,
            ..free()
        };
        assert_eq!(decide(&mine, &[], &Claim::shared()), Decision::RenewRow(10));
    }

    #[test]
    fn semaphores_never_exceed_their_capacity() {
        let row = leased(3);
        let two = Claim::permits(2, 3).unwrap();
        let one = Claim::permits(1, 3).unwrap();
        let held = [lease(false, 2, 100)];
        let r = refusal(decide(&row, &held, &two));
        assert!(r.reserve && !r.by_reservation);
        assert_eq!(r.remaining, Some(100));
        assert!(matches!(decide(&row, &held, &one), Decision::GrantLease(_)));
    }

    #[test]
    fn reservations_hold_lighter_claims_back_but_not_their_owner() {
        let row = RowSeen {
            res_live: true,
            res_weight: READ_WRITE_CAPACITY,
            res_remaining: 700,
            ..leased(READ_WRITE_CAPACITY)
        };
        let readers = [lease(false, 1, 300)];
        let r = refusal(decide(&row, &readers, &Claim::shared()));
        assert!(r.by_reservation && !r.reserve && !r.kept);
        assert_eq!(r.remaining, Some(700));
        // The writer that reserved: still waits for the reader, refreshes its reservation.
        let own = RowSeen {
            res_mine: true,
            ..row
        };
        let r = refusal(decide(&own, &readers, &Claim::exclusive()));
        assert!(r.reserve && !r.by_reservation && r.kept);
        // Readers gone: the reservation's owner is granted, another writer is not.
        let gone = RowSeen { live: false, ..own };
        assert!(matches!(
            decide(&gone, &[], &Claim::exclusive()),
            Decision::GrantExclusive(_)
        ));
        let other = RowSeen { live: false, ..row };
        let r = refusal(decide(&other, &[], &Claim::exclusive()));
        assert!(r.by_reservation && !r.reserve);
    }

    #[test]
    fn two_writers_need_no_reservation() {
        let row = RowSeen {
            live: true,
            remaining: 900,
            ..free()
        };
        let r = refusal(decide(&row, &[], &Claim::exclusive()));
        assert!(!r.reserve && !r.kept);
        assert_eq!(r.remaining, Some(900));
        // A reader behind a writer reserves.
        assert!(refusal(decide(&row, &[], &Claim::shared())).reserve);
    }

    #[test]
    fn rows_of_another_shape_are_refused() {
        assert_eq!(RowSeen::read(&[1, 2, 3]), None);
        assert_eq!(LeaseSeen::read(&[1, -1, 3, 4]), None);
        let row = RowSeen::read(&[1, 0, 1, 5, 3, 0, 0, 0, 10, -5, 7]).unwrap();
        assert!(row.leased() && row.capacity == 3 && row.now_us == 7);
    }

    #[test]
    fn a_call_answers_every_decision() {
        use kind::*;
        assert_eq!(
            Decision::from_call(&[MISMATCH, 8, -1, 0, 3]),
            Some(Decision::Mismatch(8))
        );
        assert_eq!(Decision::from_call(&[MISMATCH, -8, -1, 0, 3]), None);
        assert_eq!(
            Decision::from_call(&[RENEW_ROW, 5, 0, 0, 5]),
            Some(Decision::RenewRow(5))
        );
        assert_eq!(
            Decision::from_call(&[RENEW_LEASE, 6, 0, 0, 6]),
            Some(Decision::RenewLease(6))
        );
        assert_eq!(
            Decision::from_call(&[GRANT_EXCLUSIVE, 7, 0, 0, 6]),
            Some(Decision::GrantExclusive(7))
        );
        assert_eq!(
            Decision::from_call(&[GRANT_LEASE, 9, 0, 0, 8]),
            Some(Decision::GrantLease(9))
        );
        let refused = |remaining, by_reservation| {
            Some(Decision::Refuse(Refusal {
                remaining,
                reserve: false,
                by_reservation,
                revision: 4,
                kept: false,
            }))
        };
        assert_eq!(
            Decision::from_call(&[REFUSE, 0, 900, 0, 4]),
            refused(Some(900), false)
        );
        assert_eq!(
            Decision::from_call(&[REFUSE, 0, -1, 1, 4]),
            refused(None, true)
        );
        assert_eq!(
            Decision::from_call(&[REFUSE, 0, 0, 0, 4]),
            refused(Some(0), false)
        );
        let Some(Decision::Refuse(kept)) = Decision::from_call(&[REFUSE, 0, 5, KEPT, 4]) else {
            panic!("a refusal that keeps a reservation");
        };
        assert!(kept.kept && !kept.by_reservation, "{kept:?}");
        assert_eq!(Decision::from_call(&[6, 0, 0, 0, 4]), None);
        assert_eq!(Decision::from_call(&[GRANT_LEASE, 9, 0, 0]), None);
    }
}
