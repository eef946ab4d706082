//! What each database supplies to the shared lock plumbing: where its statements run, how
//! its statements report their outcome, how the server holds a batch renewal to its time
//! limit, and how its garbage collector deletes. The SQL text itself is the dialect's
//! [`Statements`](crate::store::Statements).

use std::fmt;
use std::time::Duration;

use sqlx::Database;

use crate::gc::Collect;
use crate::run::Run;

/// The sqlx database of a dialect.
pub(crate) type DbOf<D> = <<D as Dialect>::Run as Run>::DB;

/// A query result of the dialect's database.
pub(crate) type Done<D> = <DbOf<D> as Database>::QueryResult;

/// One database's lock table, as the shared plumbing ([`Store`](crate::backend::lock::Store)) drives it.
pub(crate) trait Dialect: fmt::Debug + Send + Sync + Sized + 'static {
    /// Where the statements run (and so on which sqlx database).
    type Run: Run + fmt::Debug;

    /// The backend's name, in errors and logs.
    const NAME: &'static str;
    /// How the garbage collector deletes.
    const GC: Collect;
    /// How the acquiring statement answers: `None`, with `RETURNING fence` (a row when the
    /// statement took or re-granted the lock; none when it was held by someone else, whose
    /// TTL is then read with the state statement); or in the statement's result (MySQL's
    /// `LAST_INSERT_ID(expr)`), read by this function.
    const UPSERT: Option<fn(&Done<Self>) -> Upsert> = None;
    /// How the server holds a batch renewal to its time limit.
    const BATCH_LIMIT: BatchLimit = BatchLimit::None;
}

/// What an acquiring statement reported in its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) enum Upsert {
    /// Taken or re-granted, with this fence.
    Granted(i64),
    /// Held by someone else for this many microseconds still.
    Held(i64),
    /// Refused for a reason the claim call decides: the key is held by shared
    /// leases, or free but reserved (MySQL: by anyone; the claim then grants the
    /// reservation's owner).
    Claim,
}

/// How a dialect holds a batch renewal's statements to a time limit on the server.
#[derive(Clone, Copy, Debug)]
pub(crate) enum BatchLimit {
    /// It does not (SQLite: the statement runs in the client's own process).
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    None,
    /// Each statement starts with this text, made from the limit (MariaDB's `SET
    /// STATEMENT … FOR`): no round trip of its own.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Prefix(fn(Duration) -> String),
    /// The statements run in a transaction opened by this text, made from the limit
    /// (PostgreSQL's `BEGIN; SET LOCAL statement_timeout = …`), unless the batch
    /// connections' sessions carry a limit no longer than it
    /// ([`Batches`](crate::backend::lock::Batches)). The transaction costs two round trips.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Transaction(fn(Duration) -> String),
}
