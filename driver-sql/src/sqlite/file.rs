//! Where SQLite's statements run: the pool of one database file, every error naming the
//! file, writes retried while another connection keeps the database locked.

use std::future::Future;
use std::sync::Arc;

use lockcore::LockError;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use sqlx::Sqlite;

use super::Lite;
use crate::db::{Ask, Execute};
use crate::dialect::Dialect;
use crate::error::{failure, is_busy, Failure};
use crate::gc::{in_batches, Collect, GcError};
use crate::retry::{retry, BUSY_RETRY};
use crate::run::{Leased, Run};
use crate::statements::Call;

/// How errors name the database of `options`.
pub(super) fn database_name(options: &SqliteConnectOptions) -> String {
    format!("SQLite database {}", options.get_filename().display())
}

/// A SQLite database's pool.
#[derive(Debug)]
pub(crate) struct SqliteFile {
    pub(super) pool: SqlitePool,
    /// `SQLite database PATH`: every error names the file.
    name: Arc<str>,
}

impl SqliteFile {
    pub(super) fn new(pool: SqlitePool) -> Self {
        let name = database_name(&pool.connect_options()).into();
        SqliteFile { pool, name }
    }

    /// Runs `call` once on a connection of the pool.
    async fn once<A: Ask<Sqlite>>(&self, ask: A, call: Call<'_>) -> Result<A::Answer, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        ask.run(&mut conn, call).await
    }
}

impl Run for SqliteFile {
    type DB = Sqlite;

    /// A write is tried again while another connection (this process's or another's)
    /// keeps the database locked past the busy timeout.
    async fn run<'a, A: Ask<Sqlite>>(
        &'a self,
        ask: A,
        call: Call<'a>,
    ) -> Result<A::Answer, LockError> {
        let once = move || self.once(ask, call);
        let result = if A::WRITES {
            retry(&BUSY_RETRY, "sqlite database busy", once, is_busy).await
        } else {
            once().await
        };
        result.map_err(|e| self.error(e))
    }

    /// Each batch a write of its own, so other writers get their turn in between.
    async fn collect<'a>(&'a self, how: Collect, call: Call<'a>) -> Result<u64, GcError> {
        let batch = |()| async move {
            let done = self.run(Execute, call).await?;
            Ok::<_, LockError>(((), done.rows_affected()))
        };
        Ok(in_batches(how, (), batch).await?)
    }

    /// `e`, naming the database file.
    fn error(&self, e: sqlx::Error) -> LockError {
        failure(Lite::NAME, Failure::new(self.name.clone(), e))
    }

    fn shutdown(&self) -> impl Future<Output = ()> + Send + '_ {
        self.pool.close()
    }

    type Leased<'a> = PoolConnection<Sqlite>;

    /// The write lock from the first statement on: a deferred transaction that reads
    /// first would fail with "database is locked" when it then writes.
    const BEGIN: &'static str = "BEGIN IMMEDIATE";

    const TX_RETRY: lockcore::RetryPolicy = BUSY_RETRY;

    async fn lease(&self) -> Result<PoolConnection<Sqlite>, LockError> {
        self.pool.acquire().await.map_err(|e| self.error(e))
    }

    fn retryable(e: &sqlx::Error) -> bool {
        is_busy(e)
    }
}

impl Leased<Sqlite> for PoolConnection<Sqlite> {
    fn conn(&mut self) -> &mut sqlx::SqliteConnection {
        self
    }

    fn settle<T>(self, _: &Result<T, sqlx::Error>) {}
}
