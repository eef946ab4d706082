//! Why not sqlx's own: sqlx neither keeps connections between operations nor retries statements.
//!
//! Where a backend's statements run: on connections kept between operations, retried after
//! a conflict (PostgreSQL, MySQL), or on a pool, retried while the file is busy (SQLite).

use std::future::Future;

use lockcore::{LockError, RetryPolicy};
use sqlx::Database;

use crate::db::{Ask, Db};
use crate::gc::{Collect, GcError};
use crate::store::Call;

/// A connection of the database `DB`.
pub(crate) type Conn<DB> = <DB as Database>::Connection;

/// How a backend runs its single-statement operations: each is the statement's one round
/// trip (plus the runner's retries of a statement the database did not apply).
pub(crate) trait Run: Send + Sync + 'static {
    /// The database the statements run on.
    type DB: Db;

    /// Runs `call`, answering as `ask` says (a statement that writes, unless `ask` reads).
    fn run<'a, A: Ask<Self::DB>>(
        &'a self,
        ask: A,
        call: Call<'a>,
    ) -> impl Future<Output = Result<A::Answer, LockError>> + Send + 'a;

    /// Runs `call`, a renewal, as [`run`](Self::run) does, but ahead of the writes waiting
    /// for their turn where writes take turns (SQLite): a renewal has a quarter of the TTL.
    fn renew<'a, A: Ask<Self::DB>>(
        &'a self,
        ask: A,
        call: Call<'a>,
    ) -> impl Future<Output = Result<A::Answer, LockError>> + Send + 'a {
        self.run(ask, call)
    }

    /// Runs the garbage-collection statement `call` as `how` says; the rows deleted.
    fn collect<'a>(
        &'a self,
        how: Collect,
        call: Call<'a>,
    ) -> impl Future<Output = Result<u64, GcError>> + Send + 'a;

    /// An error reading a statement's answer, as the backend reports its errors.
    fn error(&self, e: sqlx::Error) -> LockError;

    /// Hands back every connection and closes the pool.
    fn shutdown(&self) -> impl Future<Output = ()> + Send + '_;

    /// A connection for one transaction.
    type Leased<'a>: Leased<Self::DB>
    where
        Self: 'a;

    /// The statement opening a transaction of the store's (freeing a key; SQLite: `BEGIN
    /// IMMEDIATE`, so the transaction holds the write lock from its first statement on).
    const BEGIN: &'static str;

    /// How a transaction the database rolled back (conflict, busy file) is tried again.
    const TX_RETRY: RetryPolicy;

    /// A connection for a transaction, from the cache or the pool.
    fn lease(&self) -> impl Future<Output = Result<Self::Leased<'_>, LockError>> + Send + '_;

    /// Starts opening a connection in the background, once, if there is none yet (nothing
    /// to open for a file).
    fn warm(&self) {}

    /// Whether a transaction that failed with `e` applied nothing and may run again.
    fn retryable(e: &sqlx::Error) -> bool;

    /// Why the database this runner reaches is no longer the one other processes reach,
    /// if it is not (a SQLite file deleted or replaced since it was opened): its holds are
    /// then answered as not held.
    fn moved(&self) -> Option<String> {
        None
    }
}

/// A connection held for one transaction. [`settle`](Self::settle) it with the outcome;
/// dropped unsettled (cancelled midway), it goes back through the pool's check.
pub(crate) trait Leased<DB: Database>: Send {
    /// The connection to run the transaction on.
    fn conn(&mut self) -> &mut DB::Connection;

    /// Hands the connection back after the transaction ended with `result`.
    fn settle<T>(self, result: &Result<T, sqlx::Error>);
}
