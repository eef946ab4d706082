//! What the statement runner needs of a sqlx database, written once for the three: binding
//! the driver's values and running its kinds of statement on one connection.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sqlx::database::Database;
use sqlx::decode::Decode;
use sqlx::encode::Encode;
use sqlx::query::Query;
use sqlx::{ColumnIndex, Executor, IntoArguments, Row, Type};

use crate::store::{sql, Call, Value};

/// A future that may borrow for `'a`, as sqlx's callbacks and the runner take them.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A row of integers (the claim statements answer flags and numbers only).
pub(crate) type Ints = Vec<i64>;

/// How a statement is run and what it answers: [`Execute`], [`Labelled`] or [`IntRows`].
pub(crate) trait Ask<DB: Database>: Copy + Send + Sync + 'static {
    type Answer: Send;

    /// Whether the statement changes the table (the acquiring, extending, releasing and
    /// collecting statements) rather than only reading it (the state statement).
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    const WRITES: bool = true;

    /// Runs `call` on `conn`.
    fn run<'c>(
        self,
        conn: &'c mut DB::Connection,
        call: Call<'_>,
    ) -> BoxFuture<'c, Result<Self::Answer, sqlx::Error>>;
}

/// The kinds of statement: for each a unit type that runs a call through its [`Db`] method
/// and answers what that method answers.
macro_rules! asks {
    ($($(#[$doc:meta])* $kind:ident: $method:ident -> $answer:ty, writes $writes:literal;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug)]
        pub(crate) struct $kind;

        impl<DB: Db> Ask<DB> for $kind {
            type Answer = $answer;

            const WRITES: bool = $writes;

            fn run<'c>(
                self,
                conn: &'c mut DB::Connection,
                call: Call<'_>,
            ) -> BoxFuture<'c, Result<Self::Answer, sqlx::Error>> {
                DB::$method(conn, call)
            }
        }
    )*};
}

asks! {
    /// The statement's result ([`Db::execute`]).
    Execute: execute -> DB::QueryResult, writes true;
    /// Every row, each a label followed by integers ([`Db::labelled`]).
    Labelled: labelled -> Vec<(String, Ints)>, writes false;
    /// Every row of integers, from a statement that writes ([`Db::ints`]): the claim calls.
    IntRows: ints -> Vec<Ints>, writes true;
}

/// A sqlx database the driver runs its statements on. Implemented for every database with
/// what the statements need (connections that execute, the bound and read types), so code
/// generic over it needs no further bounds.
pub(crate) trait Db: Database {
    /// Runs a statement for its result (rows affected, …).
    fn execute<'c>(
        conn: &'c mut Self::Connection,
        call: Call<'_>,
    ) -> BoxFuture<'c, Result<Self::QueryResult, sqlx::Error>>;

    /// Runs `statement`, which binds nothing, through the text protocol, unprepared: DDL that
    /// a database may refuse to prepare (MySQL's `CREATE PROCEDURE`).
    fn execute_text<'c>(
        conn: &'c mut Self::Connection,
        statement: &Arc<str>,
    ) -> BoxFuture<'c, Result<(), sqlx::Error>>;

    /// Runs a statement answering with rows of integers.
    fn ints<'c>(
        conn: &'c mut Self::Connection,
        call: Call<'_>,
    ) -> BoxFuture<'c, Result<Vec<Ints>, sqlx::Error>>;

    /// Runs a statement answering with rows of a label followed by integers.
    fn labelled<'c>(
        conn: &'c mut Self::Connection,
        call: Call<'_>,
    ) -> BoxFuture<'c, Result<Vec<(String, Ints)>, sqlx::Error>>;

    /// The rows a statement changed.
    fn rows_affected(done: &Self::QueryResult) -> u64;
}

/// `call`'s statement with its values bound.
fn bound<DB>(call: Call<'_>) -> Query<'static, DB, DB::Arguments>
where
    DB: Database,
    for<'t> &'t [u8]: Encode<'t, DB> + Type<DB>,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
{
    call.values.iter().fold(
        sqlx::query(sql(call.statement)),
        |query, value| match *value {
            Value::Bytes(bytes) => query.bind(bytes),
            Value::Text(text) => query.bind(text),
            Value::Int(n) => query.bind(n),
        },
    )
}

impl<DB> Db for DB
where
    DB: Database,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'t> &'t [u8]: Encode<'t, DB> + Type<DB>,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Decode<'t, DB> + Type<DB>,
    for<'t> String: Decode<'t, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
    DB::QueryResult: RowsAffected,
{
    fn execute<'c>(
        conn: &'c mut DB::Connection,
        call: Call<'_>,
    ) -> BoxFuture<'c, Result<DB::QueryResult, sqlx::Error>> {
        let query = bound::<DB>(call);
        Box::pin(query.execute(conn))
    }

    fn execute_text<'c>(
        conn: &'c mut DB::Connection,
        statement: &Arc<str>,
    ) -> BoxFuture<'c, Result<(), sqlx::Error>> {
        let statement = sqlx::raw_sql(sql(statement));
        Box::pin(async move {
            statement.execute(conn).await?;
            Ok(())
        })
    }

    fn ints<'c>(
        conn: &'c mut DB::Connection,
        call: Call<'_>,
    ) -> BoxFuture<'c, Result<Vec<Ints>, sqlx::Error>> {
        let query = bound::<DB>(call);
        Box::pin(async move {
            let rows = query.fetch_all(conn).await?;
            rows.iter().map(|row| ints_from(row, 0)).collect()
        })
    }

    fn labelled<'c>(
        conn: &'c mut DB::Connection,
        call: Call<'_>,
    ) -> BoxFuture<'c, Result<Vec<(String, Ints)>, sqlx::Error>> {
        let query = bound::<DB>(call);
        Box::pin(async move {
            let rows = query.fetch_all(conn).await?;
            rows.iter()
                .map(|row| Ok((row.try_get(0)?, ints_from(row, 1)?)))
                .collect()
        })
    }

    fn rows_affected(done: &DB::QueryResult) -> u64 {
        done.rows_affected()
    }
}

/// The integer columns of `row` from `first` on.
fn ints_from<R: Row>(row: &R, first: usize) -> Result<Ints, sqlx::Error>
where
    for<'t> i64: Decode<'t, R::Database> + Type<R::Database>,
    usize: ColumnIndex<R>,
{
    (first..row.len()).map(|i| row.try_get(i)).collect()
}

/// sqlx's query results, which each have their own `rows_affected`.
pub(crate) trait RowsAffected {
    fn rows_affected(&self) -> u64;
}

macro_rules! rows_affected {
    ($($feature:literal => $result:ty),+) => {$(
        #[cfg(feature = $feature)]
        impl RowsAffected for $result {
            fn rows_affected(&self) -> u64 {
                <$result>::rows_affected(self)
            }
        }
    )+};
}

rows_affected!(
    "postgres" => sqlx::postgres::PgQueryResult,
    "mysql" => sqlx::mysql::MySqlQueryResult,
    "sqlite" => sqlx::sqlite::SqliteQueryResult
);
