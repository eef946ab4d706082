//! A transfer between two accounts under a lock taken inside the transaction that writes
//! them (docs/sql.md, "Locks inside a transaction"), on PostgreSQL:
//!
//! ```text
//! cargo run --example transfer --features postgres -- postgres://user@127.0.0.1/db [HOLD_SECS]
//! ```
//!
//! It creates the table `accounts` when missing (accounts 1 and 2, 100 each), takes the key
//! `accounts` inside its transaction, moves 10 from account 1 to account 2 with writes fenced
//! by the lock's token, keeps the transaction open `HOLD_SECS` (0 by default; run
//! `distlock --url URL status accounts` meanwhile to see the hold), and commits: the writes
//! and the end of the lock, together.

use std::time::Duration;

use distlock::sql::postgres::PostgresBackend;
use distlock::sql::{sqlx, SqlOptions};

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: transfer POSTGRES_URL [HOLD_SECS]")?;
    let hold = Duration::from_secs(args.next().map_or(Ok(0), |s| s.parse())?);
    let locks = PostgresBackend::connect(&url, SqlOptions::new()).await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS accounts \
           (id bigint PRIMARY KEY, balance bigint NOT NULL, fence bigint NOT NULL DEFAULT 0); \
         INSERT INTO accounts (id, balance) VALUES (1, 100), (2, 100) ON CONFLICT DO NOTHING",
    )
    .execute(locks.pool())
    .await?;

    let mut tx = locks.pool().begin().await?;
    let lock = locks
        .lock_in(&mut tx, "accounts", Duration::from_secs(5))
        .await?;
    println!(
        "the transaction holds \"accounts\", fencing token {}",
        lock.token()
    );
    let token = i64::try_from(lock.token().0)?;
    for (id, delta) in [(1_i64, -10_i64), (2, 10)] {
        let moved = sqlx::query(
            "UPDATE accounts SET balance = balance + $1, fence = $2 WHERE id = $3 AND fence <= $2",
        )
        .bind(delta)
        .bind(token)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() != 1 {
            // A holder with a later token wrote first: this transaction must not.
            return Err(format!("account {id} was written by a later holder").into());
        }
    }
    if !hold.is_zero() {
        println!("holding it for {hold:?}");
        tokio::time::sleep(hold).await;
    }
    tx.commit().await?;
    let balances: Vec<(i64,)> = sqlx::query_as("SELECT balance FROM accounts ORDER BY id")
        .fetch_all(locks.pool())
        .await?;
    println!(
        "committed: balances {:?}",
        balances.iter().map(|b| b.0).collect::<Vec<_>>()
    );
    Ok(())
}
