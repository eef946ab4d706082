//! A lock table's statements, as each database spells them, and the values they bind.

use std::sync::Arc;

use sqlx::AssertSqlSafe;

/// The statements of one lock table in its database's dialect. The table name is the only
/// text spliced into them; keys, owners, labels and durations are bound.
#[derive(Debug)]
pub(crate) struct Statements {
    /// Takes a free or expired row, re-grants it to its owner (same token, expiry never
    /// shortened), or leaves it alone. Binds key, owner, label, TTL (µs).
    pub(crate) acquire: Arc<str>,
    /// The live row's label, fence and remaining microseconds. Binds the key.
    pub(crate) state: Arc<str>,
    /// Pushes the owner's expiry out, never in. Binds the dialect's
    /// [`EXTEND_PARAMS`](crate::dialect::Dialect::EXTEND_PARAMS).
    pub(crate) extend: Arc<str>,
    /// Marks the owner's live row expired. Binds key, owner.
    pub(crate) release: Arc<str>,
    /// Marks the live row expired, whoever holds it. Binds the key.
    pub(crate) force_release: Arc<str>,
    /// Deletes rows expired and granted longer than the grace ago. Binds the grace (µs).
    pub(crate) gc: Arc<str>,
}

impl Statements {
    /// Every statement, for preparing on each new connection.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn all(&self) -> Vec<Arc<str>> {
        [
            &self.acquire,
            &self.state,
            &self.extend,
            &self.release,
            &self.force_release,
            &self.gc,
        ]
        .into_iter()
        .cloned()
        .collect()
    }
}

/// A statement as sqlx takes it (the driver's statements splice only a validated table name).
pub(crate) fn sql(s: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(s.clone())
}

/// What an operation binds to a statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Param {
    /// The key's bytes.
    Key,
    /// The owner's secret token.
    Owner,
    /// The TTL in microseconds.
    Ttl,
}

/// One value bound to a statement.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Value<'a> {
    Bytes(&'a [u8]),
    Text(&'a str),
    Int(i64),
}

/// A statement and the values it binds, in order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call<'a> {
    pub(crate) statement: &'a Arc<str>,
    pub(crate) values: &'a [Value<'a>],
}
