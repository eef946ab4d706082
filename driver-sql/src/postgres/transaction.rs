//! PostgreSQL takes a key inside the caller's transaction: its gate, an advisory lock the
//! transaction keeps to its end, then the key's fence moved on by the backend's own
//! connection (see `store/postgres/transaction.sql` and `gate.sql`).
//!
//! The fence is moved on outside the caller's transaction, so the transaction locks no
//! row of the lock table (a late release or the garbage collector never waits for it) and
//! reads nothing through its own snapshot: a REPEATABLE READ or SERIALIZABLE transaction
//! sees the key as it is now.

use lockcore::driver::WaitHint;
use std::time::Duration;

use lockcore::{LockError, LockKey, Owner};
use sqlx::postgres::PgConnection;
use sqlx::Postgres;

use super::{Pg, PostgresBackend};
use crate::dialect::Dialect;
use crate::error::{map_err, shape};
use crate::run::Run;
use crate::store::{named, Bound, Values};
use crate::transaction::{ints, Attempt, TakeInTransaction};
use crate::units::micros;

pub(super) const TRANSACTION: &str = include_str!("../store/postgres/transaction.sql");

/// The attempt's savepoint: a refused attempt rolls back to it, which gives the gate back
/// and drops the commit's announcement.
const SAVEPOINT: &str = "SAVEPOINT distlock_lock_in";
const TAKEN: &str = "RELEASE SAVEPOINT distlock_lock_in";
const REFUSED: &str = "ROLLBACK TO SAVEPOINT distlock_lock_in; RELEASE SAVEPOINT distlock_lock_in";

/// The statements of `transaction.sql` for one lock table.
#[derive(Debug)]
pub(crate) struct TransactionStatements {
    /// In the caller's transaction: takes the key's gate, `[1]`, or `[0]`.
    gate: Bound,
    /// On the backend's connections: the fence moved on, `[fence]`, or no row when held.
    take: Bound,
}

impl TransactionStatements {
    pub(super) fn new(t: &str) -> Self {
        let bound = |name| named(TRANSACTION, name, t).unwrap_or_else(Bound::empty);
        TransactionStatements {
            gate: bound("gate"),
            take: bound("take"),
        }
    }
}

impl TakeInTransaction for PostgresBackend {
    type Conn = PgConnection;

    /// The gate keeps claims out while the transaction looks: no reservation is needed.
    async fn attempt(
        &self,
        conn: &mut PgConnection,
        key: &LockKey,
        _: &Owner,
        _: Duration,
    ) -> Result<Attempt, LockError> {
        let err = |e| map_err(Pg::NAME, e);
        sqlx::raw_sql(SAVEPOINT)
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        let attempt = self.gate_and_take(conn, key).await;
        let end = if matches!(attempt, Ok(Attempt::Taken(_))) {
            TAKEN
        } else {
            REFUSED
        };
        sqlx::raw_sql(end).execute(&mut *conn).await.map_err(err)?;
        attempt
    }

    async fn give_up(&self, _: &LockKey, _: &Owner) -> Result<(), LockError> {
        Ok(())
    }

    async fn nap(&self, key: &LockKey, nap: Duration) -> Result<(), LockError> {
        self.0
            .wait_released(key, &WaitHint::none(), u64::MAX, nap)
            .await
    }
}

impl PostgresBackend {
    /// Inside the attempt's savepoint: the gate, then the fence.
    async fn gate_and_take(
        &self,
        conn: &mut PgConnection,
        key: &LockKey,
    ) -> Result<Attempt, LockError> {
        let values = Values::key(key);
        let gate = ints::<Postgres>(conn, &self.1.gate, &values)
            .await
            .map_err(|e| map_err(Pg::NAME, e))?;
        if gate.first().map(Vec::as_slice) != Some(&[1]) {
            // Another transaction holds the key, or a claim of it is being decided.
            return Ok(Attempt::Held(None));
        }
        let store = &self.0.store;
        match store.call(&self.1.take, &values).await?.as_deref() {
            Some(&[fence]) => Ok(Attempt::Taken(fence)),
            Some(_) => Err(store.run.error(shape("take"))),
            None => {
                let state = store.state(key).await?;
                Ok(Attempt::Held(
                    state.map(|(_, _, remaining, _)| micros(remaining)),
                ))
            }
        }
    }
}
