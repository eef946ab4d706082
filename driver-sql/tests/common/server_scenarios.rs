//! Scenarios the databases with a server (PostgreSQL, MySQL/MariaDB) share: URLs, killed
//! connections, a stopped or unreachable server, kept connections at shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use distlock_sql::SqlOptions;
use lockcore::driver::{AcquireOutcome, LockBackendExt};
use lockcore::{LockBackend, LockError, Owner, ReleaseOutcome};

use super::harness::ServerDb;

/// A table name with SQL in the URL is refused; both URL schemes reach the same server.
pub async fn table_names_with_sql_are_rejected<D: ServerDb>() {
    let url = D::url();
    let err = distlock_sql::connect(&format!("{url}?distlock_table=x;DROP%20TABLE%20y"))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    // Both schemes reach the same server.
    let table = format!("locks_{}", super::random_suffix());
    let a = distlock_sql::connect(&format!("{url}?distlock_table={table}"))
        .await
        .unwrap();
    let b = distlock_sql::connect(&format!(
        "{}?distlock_table={table}",
        url.replacen(
            &format!("{}://", D::NAME),
            &format!("{}://", D::OTHER_SCHEME),
            1
        )
    ))
    .await
    .unwrap();
    assert_eq!(a.name(), D::NAME);
    let k = super::key("scheme");
    let o = Owner::new("o");
    assert!(matches!(
        a.try_acquire(&k, &o, Duration::from_secs(5)).await.unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    assert!(b.inspect(&k).await.unwrap().is_some());
}

/// TLS options reach sqlx through the URL: the test server has no TLS, so asking for none
/// (the query `disable`) works and requiring it (`require`) fails.
pub async fn tls_options_pass_through_the_url<D: ServerDb>(disable: &str, require: &str) {
    let url = D::url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let plain = distlock_sql::connect(&format!("{url}{sep}{disable}")).await;
    assert!(plain.is_ok(), "{:?}", plain.err());
    let options = SqlOptions::new().acquire_timeout(Duration::from_secs(2));
    let tls = distlock_sql::connect_with(&format!("{url}{sep}{require}"), options).await;
    assert!(
        tls.is_err(),
        "TLS was required of a server without it, and the connection worked"
    );
}

/// The holder's connections are killed on the server by `kill` (once it holds the lock):
/// the lock stays held until released (the release is retried on a fresh connection) and
/// is then free.
pub async fn killed_connection_keeps_the_lock_correct<F, Fut>(
    holder: Arc<dyn LockBackend>,
    other: Arc<dyn LockBackend>,
    kill: F,
) where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let k = super::key("killed");
    let (o, p) = (Owner::new("holder"), Owner::new("other"));
    assert!(matches!(
        holder
            .try_acquire(&k, &o, Duration::from_secs(30))
            .await
            .unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    kill().await;
    assert!(matches!(
        other
            .try_acquire(&k, &p, Duration::from_secs(5))
            .await
            .unwrap(),
        AcquireOutcome::Held(_)
    ));
    // The first statement on a killed connection may fail; a retry gets a new one.
    let mut released = None;
    for _ in 0..5 {
        match holder.release(&k, &o).await {
            Ok(outcome) => {
                released = Some(outcome);
                break;
            }
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
    }
    assert_eq!(released, Some(ReleaseOutcome::Released));
    assert!(matches!(
        other
            .try_acquire(&k, &p, Duration::from_secs(5))
            .await
            .unwrap(),
        AcquireOutcome::Acquired(_)
    ));
}

/// The database stops: operations fail with `Unavailable` within the acquire timeout, and
/// work again after a restart.
pub async fn stopped_database_is_unavailable_then_recovers<D: ServerDb>() {
    let server = D::own_server().await;
    let options = SqlOptions::new().acquire_timeout(Duration::from_secs(1));
    let backend = D::connect(&server.url_via(server.addr()), options)
        .await
        .unwrap();
    let k = super::key("stop");
    let o = Owner::new("o");
    assert!(matches!(
        backend
            .try_acquire(&k, &o, Duration::from_secs(30))
            .await
            .unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    server.stop().await;
    let started = std::time::Instant::now();
    let err = backend
        .try_acquire(&k, &o, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    let err = backend.inspect(&k).await.unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    server.start().await;
    let mut answer = None;
    for _ in 0..20 {
        if let Ok(a) = backend.inspect(&k).await {
            answer = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // fsync is off in test servers, so what survived the restart is not asserted; the
    // backend answers again.
    assert!(answer.is_some(), "no answer after restart");
}

/// A restart of the database breaks every connection the backend keeps, cached or pooled:
/// the operations after it are sent again on new connections, and none of them fails.
pub async fn a_restart_breaks_no_operation_after_it<D: ServerDb>() {
    let server = D::own_server().await;
    let url = server.url_via(server.addr());
    let backend = D::connect(&url, SqlOptions::new()).await.unwrap();
    let o = Owner::new("o");
    let keys: Vec<_> = (0..8)
        .map(|i| super::key(&format!("restart-{i}")))
        .collect();
    let ttl = Duration::from_secs(30);
    // Every key at once (the backend keeps several connections, not one); each granted.
    let take_all = |when: &'static str| {
        let (backend, keys, o) = (&backend, &keys, &o);
        async move {
            let taken = keys.iter().map(|k| backend.try_acquire(k, o, ttl));
            for outcome in futures_util::future::join_all(taken).await {
                assert!(
                    matches!(outcome, Ok(AcquireOutcome::Acquired(_))),
                    "acquire {when}: {outcome:?}"
                );
            }
        }
    };
    take_all("before the restart").await;
    server.stop().await;
    server.start().await;
    // Until a backend with no kept connections is answered, the server is still starting.
    let fresh = D::connect(&url, SqlOptions::new()).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while fresh.inspect(&keys[0]).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the restarted server never answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // fsync is off in test servers, so what survived the restart is not asserted: only
    // that every operation is answered, on its first call.
    for k in &keys {
        if let Err(e) = backend.inspect(k).await {
            panic!("inspect after the restart: {}", lockcore::ErrorChain(&e));
        }
    }
    take_all("after the restart").await;
    for k in &keys {
        let extended = backend.extend(k, &o, ttl).await;
        assert!(extended.is_ok(), "extend after the restart: {extended:?}");
        let released = backend.release(k, &o).await;
        assert!(
            matches!(released, Ok(ReleaseOutcome::Released)),
            "release after the restart: {released:?}"
        );
    }
}

/// [`super::stopped_server_is_reported_at_once`] on a server of its own, with the default
/// options.
pub async fn stopped_database_is_reported_at_once<D: ServerDb>() {
    let server = D::own_server().await;
    let backend = D::connect(&server.url_via(server.addr()), SqlOptions::new())
        .await
        .unwrap();
    super::stopped_server_is_reported_at_once(backend, &server).await;
}

/// [`super::refused_connection_is_reported_at_once`] with the default options.
pub async fn refused_connection_is_reported_at_once<D: ServerDb>() {
    super::refused_connection_is_reported_at_once(|addr| async move {
        D::connect(&format!("{}://u:p@{addr}/db", D::NAME), SqlOptions::new()).await
    })
    .await;
}

/// [`super::silent_server_names_the_time_bound`] through the acquire timeout.
pub async fn silent_server_names_the_time_bound<D: ServerDb>() {
    super::silent_server_names_the_time_bound(|addr, bound| async move {
        D::connect(
            &format!("{}://u:p@{addr}/db", D::NAME),
            SqlOptions::new().acquire_timeout(bound),
        )
        .await
    })
    .await;
}

/// Shutdown hands kept connections back at once instead of waiting for them to idle out
/// (closing a pool waits for every connection it lent).
pub async fn shutdown_returns_kept_connections<D: ServerDb>() {
    let table = format!("locks_{}", super::random_suffix());
    let b = super::harness::backend::<D>(&table).await;
    super::cycles(&*b, 3).await;
    tokio::time::timeout(Duration::from_millis(800), b.shutdown())
        .await
        .expect("shutdown waited for kept connections");
}
