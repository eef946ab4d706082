//! How a backend uses its database: the lock table's name and the options of the pools the
//! driver opens.

pub(crate) mod url;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockcore::LockError;

/// The default lock table name.
pub const DEFAULT_TABLE: &str = "distlock_locks";

/// Longest accepted table name. PostgreSQL truncates identifiers at 63 bytes and the driver
/// derives names such as `<table>_release_lease` from it, so names stay below that.
pub const MAX_TABLE_NAME_LEN: usize = 48;

/// The pool size of the pools the driver opens itself, unless [`SqlOptions::max_connections`]
/// says otherwise.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;

/// How long a released or expired row must be past its grant before the garbage collector
/// may delete it (see [`crate`] docs, "Fencing"): a new row for the key then starts from a
/// clock reading at least this much later than the deleted row's token.
pub(crate) const GC_GRACE: Duration = Duration::from_secs(60);

/// A validated SQL identifier for the lock table: 1 to 48 ASCII letters, digits and
/// underscores, starting with a letter or underscore. It is the only text ever spliced into
/// the driver's SQL; keys, owners and labels are always bound parameters.
///
/// # Examples
///
/// ```
/// use distlock_sql::TableName;
///
/// assert!(TableName::new("app_locks").is_ok());
/// assert!(TableName::new("locks; DROP TABLE users").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName(Arc<str>);

impl TableName {
    /// Validates `name` as a table identifier.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] if the name is empty, longer than 48 bytes, or contains
    /// anything but ASCII letters, digits and `_` (or starts with a digit).
    pub fn new(name: &str) -> Result<Self, LockError> {
        let valid_start = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        let valid_rest = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_start || !valid_rest || name.len() > MAX_TABLE_NAME_LEN {
            return Err(LockError::config(format!(
                "invalid lock table name {name:?}: use 1 to {MAX_TABLE_NAME_LEN} ASCII letters, \
                 digits and underscores, starting with a letter or underscore"
            )));
        }
        Ok(TableName(name.into()))
    }

    /// The name as written into SQL.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TableName {
    fn default() -> Self {
        TableName(DEFAULT_TABLE.into())
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a backend uses its database: table name and, for pools the driver opens itself,
/// their size and timeouts.
///
/// # Examples
///
/// ```
/// # extern crate lockcore as distlock_core; // the workspace's name for it
/// use std::time::Duration;
/// use distlock_sql::SqlOptions;
///
/// let options = SqlOptions::new()
///     .table("billing_locks")?
///     .acquire_timeout(Duration::from_secs(2));
/// assert_eq!(options.table_name().as_str(), "billing_locks");
/// # Ok::<(), distlock_core::LockError>(())
/// ```
#[derive(Clone, Debug)]
pub struct SqlOptions {
    pub(crate) table: TableName,
    pub(crate) max_connections: u32,
    pub(crate) acquire_timeout: Duration,
    pub(crate) busy_timeout: Duration,
    pub(crate) migrate: bool,
    pub(crate) gc_grace: Duration,
    pub(crate) keep_connections: Option<u32>,
}

impl Default for SqlOptions {
    fn default() -> Self {
        SqlOptions {
            table: TableName::default(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            acquire_timeout: Duration::from_secs(5),
            busy_timeout: Duration::from_secs(5),
            migrate: true,
            gc_grace: GC_GRACE,
            keep_connections: None,
        }
    }
}

impl SqlOptions {
    /// The defaults: table `distlock_locks`, 8 connections, 5 s to get a connection, 5 s
    /// SQLite busy timeout, migration on.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses the table `name` (validated as an identifier).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a name [`TableName::new`] rejects.
    pub fn table(mut self, name: &str) -> Result<Self, LockError> {
        self.table = TableName::new(name)?;
        Ok(self)
    }

    /// Uses an already validated table name.
    pub fn table_name_value(mut self, name: TableName) -> Self {
        self.table = name;
        self
    }

    /// The table the backend uses.
    pub fn table_name(&self) -> &TableName {
        &self.table
    }

    /// The most connections a pool opened by the driver keeps (PostgreSQL's `LISTEN`
    /// session is a connection of its own, outside this pool, and so are its batch
    /// renewals' two at most).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long an operation waits for a pooled connection before failing with
    /// [`LockError::Unavailable`] (`… at HOST:PORT is unavailable: no connection within
    /// 5s`). A server that refuses connections (down, wrong port) is reported sooner: when
    /// the pool has not answered within 200 ms the backend checks the server's port, and a
    /// refusal fails the operation at once (`cannot connect`, the I/O error as its source).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// SQLite only: how long a statement waits for another process's write to finish.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// How old (by token) an expired row must be before the garbage collector deletes it.
    /// Shortening it weakens fencing after a clock step; for tests.
    #[doc(hidden)]
    pub fn gc_grace(mut self, grace: Duration) -> Self {
        self.gc_grace = grace;
        self
    }

    /// MySQL and PostgreSQL: how many idle connections the backend keeps out of its pool
    /// between operations, handing them straight to the next operation. sqlx pings every
    /// connection returned to a pool, a second round trip for each one-statement lock
    /// operation; a kept connection skips it (a connection goes back to the pool, and
    /// through the ping, when an operation on it failed or was cancelled, or after a second
    /// unused). Default: the whole pool (`max_connections`) for a pool the backend opened
    /// itself, none for a pool passed to `from_pool` (kept connections are unavailable to
    /// the application for up to a second after each operation).
    pub fn keep_connections(mut self, n: u32) -> Self {
        self.keep_connections = Some(n);
        self
    }

    /// The number of connections to keep out of a pool of `pool_size` (see
    /// [`keep_connections`](Self::keep_connections)); `owned` says whether the backend
    /// opened the pool itself.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn kept_connections(&self, pool_size: u32, owned: bool) -> usize {
        let n = self
            .keep_connections
            .unwrap_or(if owned { pool_size } else { 0 });
        usize::try_from(n.min(pool_size)).unwrap_or(0)
    }

    /// Whether the backend creates or checks its table when built (default on). Off, the
    /// table must exist already (see `docs/sql.md` for the DDL).
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_identifiers() {
        for good in ["locks", "_x", "A1_b2", &"a".repeat(48)] {
            assert!(TableName::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "locks; DROP TABLE users; --",
            "a\"b",
            "a`b",
            "é",
            &"a".repeat(49),
        ] {
            assert!(
                matches!(TableName::new(bad), Err(LockError::Config { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn kept_connections_default_to_owned_pools_only() {
        let o = SqlOptions::new();
        assert_eq!(o.kept_connections(8, true), 8);
        assert_eq!(o.kept_connections(8, false), 0);
        let o = SqlOptions::new().keep_connections(2);
        assert_eq!(
            (o.kept_connections(8, true), o.kept_connections(8, false)),
            (2, 2)
        );
        assert_eq!(
            SqlOptions::new()
                .keep_connections(20)
                .kept_connections(8, false),
            8
        );
    }
}
