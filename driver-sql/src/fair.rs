//! Waiters in arrival order ([`SqlOptions::fair`](crate::SqlOptions::fair)): a queue of
//! places beside the lock table. Each attempt is one transaction that locks the key's row
//! (as a claim does), drops the lapsed places ahead of the first live one, takes or renews
//! the owner's place (a lapsed one goes to the back), and grants a free key only to the
//! first live place. A place lasts the attempt's TTL; a refused waiter comes back within
//! half of it, so a live waiter keeps its place and a dead one blocks the queue for at most
//! its TTL. A waiter that gives up leaves at once ([`Store::leave_queue`]).

use std::time::{Duration, Instant};

use lockcore::driver::{AcquireOutcome, Grant};
use lockcore::{Claim, LockError, LockKey, Owner};
use sqlx::Connection;

use crate::db::Db;
use crate::decide::{decide, Decision, Refusal};
use crate::dialect::{DbOf, Dialect};
use crate::run::{Conn, Leased, Run};
use crate::shared::{contention, ints, shape, step, transaction, Values};
use crate::statements::{Bound, Call};
use crate::store::Store;
use crate::units::{token, ttl_micros};

impl<D: Dialect> Store<D> {
    /// Takes the exclusive lock on `key` if it is free and the owner's place is the first
    /// of its queue; otherwise keeps (or takes) the owner's place and refuses, naming the
    /// place's ticket in the wait hint (see
    /// [`WaitHint::ticket`](lockcore::driver::WaitHint::ticket)).
    pub(crate) async fn acquire_in_turn(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let values = Values::new(key, owner).claim(ttl, &Claim::exclusive());
        let (decision, ticket) = match self.call(&self.sql.queue.call, &values).await? {
            Some(row) => {
                let decision =
                    Decision::from_call(&row).ok_or_else(|| self.run.error(shape("turn")))?;
                // A refusal's token column: the owner's ticket, where the call names it.
                let ticket = row.get(1).filter(|_| self.sql.queue.call_names_ticket);
                (decision, ticket.copied())
            }
            None => transaction!(self, |conn| self.turn_in(conn, key, owner, ttl))?,
        };
        let ticket = ticket.filter(|t| *t >= 0);
        match decision {
            Decision::Mismatch(stored) => Err(LockError::capacity_mismatch(
                key,
                stored,
                &Claim::exclusive(),
            )),
            Decision::RenewRow(fence)
            | Decision::GrantExclusive(fence)
            | Decision::RenewLease(fence)
            | Decision::GrantLease(fence) => {
                Ok(AcquireOutcome::Acquired(Grant::new(token(fence), ttl)))
            }
            Decision::Refuse(refusal) => {
                // The waiter's place in the queue is kept.
                let contention = contention(&Refusal {
                    kept: true,
                    ..refusal
                });
                Ok(AcquireOutcome::Held(match ticket {
                    Some(ticket) => {
                        let hint = contention.hint.clone().with_ticket(ticket);
                        contention.with_hint(hint)
                    }
                    None => contention,
                }))
            }
        }
    }

    async fn turn_in(
        &self,
        conn: &mut Conn<DbOf<D>>,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<(Decision, Option<i64>), sqlx::Error> {
        let queue = &self.sql.queue;
        let claim = Claim::exclusive();
        let mut values = Values::new(key, owner).claim(ttl, &claim);
        let row = self.locked_row(conn, &values).await?;
        execute::<DbOf<D>>(conn, &queue.prune, &values).await?;
        let decision = decide(&row, &[], &claim);
        match decision {
            Decision::RenewRow(_) => {
                step::<DbOf<D>>(conn, &self.sql.claims.renew_row, &values).await?;
                execute::<DbOf<D>>(conn, &queue.leave, &values).await?;
                return Ok((decision, None));
            }
            Decision::GrantExclusive(_) | Decision::Refuse(_) => {}
            // Held by shared leases of a client that is not fair, or as another kind.
            _ => return Ok((decision, None)),
        }
        execute::<DbOf<D>>(conn, &queue.join, &values).await?;
        let head = ints::<DbOf<D>>(conn, &queue.head, &values).await?;
        let (first, head_left, ticket) = match head.first().map(Vec::as_slice) {
            Some(&[mine, left, ticket]) => (mine != 0, left, Some(ticket)),
            Some(_) => return Err(shape("queue head")),
            // No live place, not even the owner's own (a TTL shorter than this
            // transaction, on a clock that moves within it): nobody is ahead.
            None => (true, 0, None),
        };
        // Come back before the place lapses, whatever keeps the key.
        let renew_within = ttl_micros(ttl) / 2;
        let decision = match decision {
            Decision::GrantExclusive(token) if first => {
                values.token = token;
                step::<DbOf<D>>(conn, &self.sql.claims.grant_exclusive, &values).await?;
                execute::<DbOf<D>>(conn, &queue.leave, &values).await?;
                decision
            }
            // Free, but kept for the first place: wait for it to take the key (or leave,
            // which is announced, or lapse).
            // (The waiter's place in the queue is kept.)
            Decision::GrantExclusive(_) => Decision::Refuse(Refusal {
                remaining: Some(head_left.clamp(0, renew_within)),
                reserve: false,
                by_reservation: true,
                revision: row.fence,
                kept: true,
            }),
            Decision::Refuse(refusal) => Decision::Refuse(Refusal {
                remaining: Some(
                    refusal
                        .remaining
                        .map_or(renew_within, |r| r.min(renew_within)),
                ),
                reserve: false,
                kept: true,
                ..refusal
            }),
            other => other,
        };
        Ok((decision, ticket))
    }

    /// Where a waiter of `key` that knows its ticket stands: how long the key is held
    /// still (`None`: free) and the ticket of the first live place (`None`: nobody queues).
    /// `None` altogether where the dialect has no statement to tell.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) async fn turn(
        &self,
        key: &LockKey,
    ) -> Result<Option<(Option<i64>, Option<i64>)>, LockError> {
        let Some(row) = self.call(&self.sql.queue.turn, &Values::key(key)).await? else {
            return Ok(None);
        };
        match row.as_slice() {
            &[held, first] => Ok(Some((
                (held >= 0).then_some(held),
                (first >= 0).then_some(first),
            ))),
            _ => Err(self.run.error(shape("turn"))),
        }
    }

    /// Removes the owner's place from `key`'s queue (its wait ended without the key),
    /// announcing it: whether it had one.
    pub(crate) async fn leave_queue(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<bool, LockError> {
        let values = Values::new(key, owner);
        transaction!(self, |conn| step::<DbOf<D>>(
            conn,
            &self.sql.queue.abandon,
            &values
        ))
    }
}

/// Runs `bound` with `values` on `conn`, for its effect.
async fn execute<DB: Db>(
    conn: &mut Conn<DB>,
    bound: &Bound,
    values: &Values<'_>,
) -> Result<(), sqlx::Error> {
    let values = values.bind(bound.params);
    let call = Call {
        statement: &bound.sql,
        values: &values,
    };
    DB::execute(conn, call).await.map(drop)
}
