//! Database passwords given in the URL — userinfo or `?password=` — authenticate, and never
//! appear in an error, against the real PostgreSQL and MariaDB test servers and an
//! unreachable port. An option the database does not know (`sslpassword`) is refused by
//! name, its value not shown.

mod common;

use common::servers::shared_url;
use conformance_tests::process::free_port;
use distlock_sql::SqlOptions;
use lockcore::LockError;
use std::time::Duration;

/// `scheme://distlock@host:port/db` of a shared test server (its password is `distlock`).
fn without_password(var: &str) -> (String, String) {
    let url = shared_url(var);
    let (scheme, rest) = url.split_once("://").unwrap();
    let rest = rest.split_once('@').map_or(rest, |(_, r)| r);
    (format!("{scheme}://distlock@{rest}"), rest.to_owned())
}

fn options() -> SqlOptions {
    SqlOptions::new().acquire_timeout(Duration::from_secs(3))
}

async fn check(var: &str, schemes: &[&str]) {
    let (base, rest) = without_password(var);
    // The right password as an option connects.
    let backend = distlock_sql::connect_with(&format!("{base}?password=distlock"), options())
        .await
        .expect("?password= authenticates");
    drop(backend);
    let dead = format!("127.0.0.1:{}", free_port().unwrap());
    let db = rest.split_once('/').map_or("", |(_, d)| d);
    for scheme in schemes {
        for url in [
            format!("{scheme}://distlock@{rest}?password=hunter2-s3cret"),
            format!("{scheme}://distlock:hunter2-s3cret@{rest}"),
            format!("{scheme}://distlock@{dead}/{db}?password=hunter2-s3cret"),
            format!("{scheme}://distlock@{rest}?sslpassword=hunter2-s3cret"),
        ] {
            let err = match distlock_sql::connect_with(&url, options()).await {
                Err(e) => e,
                Ok(_) => panic!("{url} connected"),
            };
            let text = format!("{err} {err:?}");
            assert!(!text.contains("hunter2"), "{url}: {text}");
            if url.contains("sslpassword") {
                assert!(matches!(err, LockError::Config { .. }), "{text}");
                assert!(
                    text.contains("sslpassword") && text.contains("known:"),
                    "{text}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passwords_never_show() {
    check("DISTLOCK_TEST_POSTGRES_URL", &["postgres", "postgresql"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_passwords_never_show() {
    check("DISTLOCK_TEST_MYSQL_URL", &["mysql", "mariadb"]).await;
}

/// SQLite has no password: an option carrying one is refused and not shown.
#[tokio::test]
async fn sqlite_refuses_a_password_option_without_showing_it() {
    let err = match distlock_sql::connect("sqlite::memory:?password=hunter2-s3cret").await {
        Err(e) => e,
        Ok(_) => panic!("connected"),
    };
    let text = format!("{err} {err:?}");
    assert!(
        matches!(err, LockError::Config { .. }) && !text.contains("hunter2"),
        "{text}"
    );
}
