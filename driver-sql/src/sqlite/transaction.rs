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
use crate::store::{named, Bound, Values};
use crate::transaction::{ints, look, taken_meanwhile, Attempt, Look, TakeInTransaction};

const TRANSACTION: &str = include_str!("../store/sqlite/transaction.sql");

/// The statements of `transaction.sql` for one lock table.
#[derive(Debug)]
pub(crate) struct TransactionStatements {
    /// On the backend's connections: `[1, µs]` while the key is held, `[0, 0]` when free,
    /// no row when it has none.
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
        if let Look::Held(attempt) = look(store, &sql.look, key, owner, waited).await? {
            return Ok(attempt);
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
            [] => Err(taken_meanwhile(Lite::NAME, key)),
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
