//! What `DISTLOCK_LOG=debug` shows on a first start against a fresh table: no failing
//! statement. A test binary of its own, because it installs the process's global
//! `tracing` subscriber (see `common::LogCapture`).

mod common;

use std::sync::Arc;

use common::servers::shared_url;
use distlock_sql::mysql::MySqlBackend;
use distlock_sql::postgres::PostgresBackend;
use distlock_sql::SqlOptions;
use lockcore::LockBackend;

/// PostgreSQL (`DISTLOCK_TEST_POSTGRES_URL`): no "relation … does not exist".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_first_start_logs_no_errors() {
    common::first_start_logs_no_errors(|table| async move {
        let options = SqlOptions::new().table(&table).unwrap();
        let url = shared_url("DISTLOCK_TEST_POSTGRES_URL");
        let backend: Arc<dyn LockBackend> = PostgresBackend::connect(&url, options).await.unwrap();
        backend
    })
    .await;
}

/// MySQL/MariaDB (`DISTLOCK_TEST_MYSQL_URL`): no "Table … doesn't exist".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_first_start_logs_no_errors() {
    common::first_start_logs_no_errors(|table| async move {
        let options = SqlOptions::new().table(&table).unwrap();
        let url = shared_url("DISTLOCK_TEST_MYSQL_URL");
        let backend: Arc<dyn LockBackend> = MySqlBackend::connect(&url, options).await.unwrap();
        backend
    })
    .await;
}
