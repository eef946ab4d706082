//! Sessions that take longer to open than a renewal may wait (TLS to a distant server,
//! authentication on a loaded machine): the suite's proxy holding every new connection back
//! before it reaches the server (`FaultLink::slow_connects`), and what the backends must do
//! about it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance_tests::{FaultLink, TcpProxy};
use lockcore::driver::LockBackendExt;
use lockcore::LockClient;

use super::harness::{options, ServerDb};

/// A proxy to the shared test server whose new connections reach it only `delay` after
/// they were opened, and `url` rewritten to go through it.
async fn slow_open(url: &str, delay: Duration) -> (TcpProxy, String) {
    let proxy = TcpProxy::start(upstream(url)).await.unwrap();
    assert!(proxy.slow_connects(delay).await);
    let (scheme_and_user, rest) = url.split_once('@').expect("the test URL has credentials");
    let path = rest.find('/').map_or("", |at| &rest[at..]);
    let via = format!("{scheme_and_user}@{}{path}", proxy.addr());
    (proxy, via)
}

/// The server's address in `url` (`…@host:port/…`).
fn upstream(url: &str) -> SocketAddr {
    let rest = url.split_once('@').expect("the test URL has credentials").1;
    let host_port = rest.split('/').next().unwrap_or(rest);
    host_port
        .parse()
        .expect("the test URL names 127.0.0.1:port")
}

/// A hold is kept by its watchdog although every new session takes longer to open than a
/// renewal may wait (a quarter of the TTL):
///
/// * from the start: the first renewal finds a session open (the backend opened it when
///   the hold was taken), so no renewal fails at all;
/// * after every connection was cut: a renewal that gives up waiting leaves its session
///   to open, and a later attempt uses it; the hold is not lost, and its lease goes on
///   moving.
///
/// Opened inside the renewal, each session was dropped with the renewal that gave up on it,
/// and every hold was lost (PostgreSQL's batch renewals open their own pool at the first
/// renewal).
pub async fn a_hold_outlives_sessions_slower_to_open_than_a_renewal_may_wait<D: ServerDb>() {
    // Long enough that opening a session (the delay, plus authentication: about 100 ms in a
    // debug build) ends well before the first renewal (a third of the TTL) and before a
    // renewal's second attempt (a quarter plus a twelfth).
    let ttl = Duration::from_secs(6);
    // Over the quarter of the TTL a renewal may wait: a session opened inside the renewal
    // never opens.
    let delay = lockcore::driver::renewal_allowance(ttl) + Duration::from_millis(50);
    let url = D::url();
    let (proxy, via) = slow_open(&url, delay).await;
    let table = format!("locks_{}", super::random_suffix());
    let backend = D::connect(&via, options(&table)).await.unwrap();
    let locks = LockClient::new(backend);
    let key = super::key("slow-open");
    let guard = locks.lock(key.as_str()).ttl(ttl).acquire().await.unwrap();
    let taken = guard.valid_until();

    // The first renewal, not failing.
    let failing = tokio::time::timeout(ttl / 2, guard.renewal_failing()).await;
    assert!(
        failing.is_err(),
        "a renewal failed although the database answered (sessions open in {delay:?}, a \
         renewal may wait {:?}): {:?}",
        lockcore::driver::renewal_allowance(ttl),
        *guard.renewal_health().borrow()
    );
    assert!(
        guard.valid_until() > taken,
        "no renewal went through in half a TTL"
    );

    // Every connection cut: the renewals must open new sessions, each slower than a
    // renewal may wait.
    assert!(proxy.cut().await);
    let cut = Instant::now();
    let lost = tokio::time::timeout(ttl * 3 / 2, guard.lost()).await;
    assert!(
        lost.is_err(),
        "the hold was lost {:?} after every connection was cut, although new sessions open \
         in {delay:?}: {:?}",
        cut.elapsed(),
        *guard.renewal_health().borrow()
    );
    assert!(
        guard.valid_until() > cut + ttl,
        "the lease did not move after the cut"
    );
    let other = super::key("slow-open-other");
    assert!(
        locks
            .lock(other.as_str())
            .ttl(ttl)
            .try_acquire()
            .await
            .unwrap()
            .is_some(),
        "the backend did not recover for other operations"
    );
    guard.release().await.unwrap();
}

/// A session opened for an operation that stopped waiting goes to an operation waiting
/// meanwhile, not only to the pool: the pool does not hand a connection that lands while
/// it opens another one to the caller of that one, so the second operation would wait for
/// a session of its own, and a renewal's second attempt give up as the first did.
pub async fn a_session_opened_for_an_operation_that_gave_up_goes_to_the_next<D: ServerDb>() {
    let delay = Duration::from_secs(2);
    let url = D::url();
    let (proxy, via) = slow_open(&url, delay).await;
    let table = format!("locks_{}", super::random_suffix());
    let backend = D::connect(&via, options(&table)).await.unwrap();
    let key = super::key("spare-session");
    backend.inspect(&key).await.unwrap();

    assert!(proxy.cut().await);
    let first = Instant::now();
    let gave_up = tokio::time::timeout(Duration::from_millis(300), backend.inspect(&key)).await;
    assert!(
        gave_up.is_err(),
        "a statement answered although sessions open in {delay:?}: {gave_up:?}"
    );
    // The first operation's session lands 200 ms (plus its handshake) after the second
    // operation starts; one the second opened itself would take the whole delay.
    tokio::time::sleep_until((first + delay - Duration::from_millis(200)).into()).await;
    let second = Instant::now();
    backend.inspect(&key).await.unwrap();
    let waited = second.elapsed();
    assert!(
        waited < delay * 3 / 4,
        "the second operation waited {waited:?}: it opened a session of its own (sessions \
         open in {delay:?}) instead of taking the one opened for the operation that gave up \
         {:?} before it started",
        second - first
    );
}
