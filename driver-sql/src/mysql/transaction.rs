//! MySQL/MariaDB take a key inside the caller's transaction: the key's row, locked by the
//! transaction to its end (`FOR UPDATE SKIP LOCKED`), its fence moved on in the transaction
//! (see `store/mysql/transaction.sql`).
//!
//! InnoDB gives a row lock back only when the transaction ends, so the transaction locks
//! the row only when the backend's own look says it is free; a holder that takes the key
//! between the look and the lock makes the attempt fail with an error that asks for a
//! rollback.

use std::time::Duration;

use lockcore::driver::WaitHint;
use lockcore::{LockError, LockKey, Owner};
use sqlx::mysql::MySqlConnection;
use sqlx::MySql;

use super::{My, MySqlBackend};
use crate::dialect::Dialect;
use crate::error::{map_err, shape};
use crate::store::{named, Bound, Values};
use crate::transaction::{execute, ints, look, taken_meanwhile, Attempt, Look, TakeInTransaction};

const TRANSACTION: &str = include_str!("../store/mysql/transaction.sql");

/// The statements of `transaction.sql` for one lock table.
#[derive(Debug)]
pub(crate) struct TransactionStatements {
    /// On the backend's connections: `[1, µs]` while the key is held, `[0, 0]` when free,
    /// no row when it has none.
    look: Bound,
    /// On the backend's connections: the key's row, free, if it has none.
    row: Bound,
    /// In the caller's transaction: locks the row, `[1]` free, `[0]` held, no row when
    /// locked.
    lock: Bound,
    /// In the caller's transaction: the fence moved on, in `LAST_INSERT_ID`.
    take: Bound,
}

impl TransactionStatements {
    pub(super) fn new(t: &str) -> Self {
        let bound = |name| named(TRANSACTION, name, t).unwrap_or_else(Bound::empty);
        TransactionStatements {
            look: bound("look"),
            row: bound("row"),
            lock: bound("lock"),
            take: bound("take"),
        }
    }
}

impl TakeInTransaction for MySqlBackend {
    type Conn = MySqlConnection;

    async fn attempt(
        &self,
        conn: &mut MySqlConnection,
        key: &LockKey,
        owner: &Owner,
        waited: Duration,
    ) -> Result<Attempt, LockError> {
        let store = &self.0.store;
        let sql = &self.1;
        let values = Values::new(key, owner);
        match look(store, &sql.look, key, owner, waited).await? {
            Look::Held(attempt) => return Ok(attempt),
            Look::Free => {}
            // A row to lock.
            Look::Missing => _ = store.changed(&sql.row, &values).await?,
        }
        let err = |e| map_err(My::NAME, e);
        let rows = ints::<MySql>(conn, &sql.lock, &values).await.map_err(err)?;
        match rows.as_slice() {
            [row] if row.as_slice() == [1] => {}
            [row] if row.as_slice() == [0] => return Err(taken_meanwhile(My::NAME, key)),
            // Locked: another transaction holds the key, or a claim of it is being decided.
            // (Or its row was collected since the look: the next look sees it missing.)
            [] => return Ok(Attempt::Held(None)),
            _ => return Err(err(shape("lock"))),
        }
        let done = execute::<MySql>(conn, &sql.take, &values)
            .await
            .map_err(err)?;
        let fence = i64::try_from(done.last_insert_id()).map_err(|_| err(shape("take")))?;
        Ok(Attempt::Taken(fence))
    }

    async fn give_up(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.0.abandon(key, owner).await
    }

    async fn nap(&self, key: &LockKey, nap: Duration) -> Result<(), LockError> {
        self.0
            .wait_released(key, &WaitHint::none(), u64::MAX, nap)
            .await
    }
}
