//! SQLite takes a key inside the caller's transaction: the transaction writes the key's
//! row, which gives it the database's write lock until it ends (see
//! `store/sqlite/transaction.sql`).
//!
//! The write lock is the whole database's: while a transaction holds a key, every other
//! writer waits, a claim of any key included. An attempt does not wait for the write lock
//! itself (its statement runs with no busy timeout, the connection's own put back after);
//! the wait between attempts is `lock_in`'s.

use std::time::Duration;

use lockcore::driver::WaitHint;
use lockcore::{LockError, LockKey, Owner};
use sqlx::sqlite::SqliteConnection;
use sqlx::Sqlite;

use super::{Lite, SqliteBackend};
use crate::dialect::Dialect;
use crate::error::{is_busy, map_err, shape};
use crate::run::Run;
use crate::store::{named, Bound, Values};
use crate::transaction::{
    ints, Attempt, TakeInTransaction, TRANSACTION_MARK, TRANSACTION_PRECEDENCE,
};
use crate::units::micros;

const TRANSACTION: &str = include_str!("../store/sqlite/transaction.sql");

/// The statements of `transaction.sql` for one lock table.
#[derive(Debug)]
pub(crate) struct TransactionStatements {
    /// On the backend's connections: `[1, µs]` while the key is held, no row when free.
    look: Bound,
    /// In the caller's transaction: the fence moved on, `[fence]`, or no row when held.
    take: Bound,
}

impl TransactionStatements {
    pub(super) fn new(t: &str) -> Self {
        let bound = |name| named(TRANSACTION, name, t).unwrap_or_else(Bound::empty);
        TransactionStatements {
            look: bound("look"),
            take: bound("take"),
        }
    }
}

/// SQLite's extended code for a transaction whose snapshot is older than the database: it
/// can never write (`SQLITE_BUSY_SNAPSHOT`).
const BUSY_SNAPSHOT: &str = "517";

impl TakeInTransaction for SqliteBackend {
    type Conn = SqliteConnection;

    async fn attempt(
        &self,
        conn: &mut SqliteConnection,
        key: &LockKey,
        owner: &Owner,
        waited: Duration,
    ) -> Result<Attempt, LockError> {
        let store = &self.0.store;
        let sql = &self.1;
        let values = Values::new(key, owner);
        match store.call(&sql.look, &values).await?.as_deref() {
            Some(&[1, remaining]) => {
                // The key's next turn is the transaction's, so no lease is granted between
                // a look that finds it free and the lock.
                let waited = waited + TRANSACTION_PRECEDENCE;
                store.mark(key, owner, TRANSACTION_MARK, waited).await?;
                return Ok(Attempt::Held(Some(micros(remaining))));
            }
            Some(_) => return Err(store.run.error(shape("look"))),
            None => {}
        }
        let err = |e| map_err(Lite::NAME, e);
        let patience: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(&mut *conn)
            .await
            .map_err(err)?;
        sqlx::query("PRAGMA busy_timeout = 0")
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        let took = ints::<Sqlite>(conn, &sql.take, &values).await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "PRAGMA busy_timeout = {patience}"
        )))
        .execute(&mut *conn)
        .await
        .map_err(err)?;
        let rows = match took {
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(BUSY_SNAPSHOT) => {
                return Err(LockError::backend(
                    Lite::NAME,
                    format!(
                        "cannot take the lock {:?} in this transaction: it read the database \
                         before another connection wrote it, so it can no longer write; roll \
                         it back and take the lock before the transaction's first read",
                        key.as_str()
                    ),
                ))
            }
            // Another connection writes: a transaction holding a key, or a claim.
            Err(e) if is_busy(&e) => return Ok(Attempt::Held(None)),
            Err(e) => return Err(err(e)),
            Ok(rows) => rows,
        };
        match rows.as_slice() {
            [row] => match row.as_slice() {
                &[fence] => Ok(Attempt::Taken(fence)),
                _ => Err(err(shape("take"))),
            },
            [] => Err(LockError::backend(
                Lite::NAME,
                format!(
                    "the lock {:?} was taken by another holder while this transaction wrote \
                     its row, and the transaction now holds the database's write lock, which \
                     keeps that holder from renewing or releasing it: roll the transaction \
                     back and try again",
                    key.as_str()
                ),
            )),
            _ => Err(err(shape("take"))),
        }
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
