use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// A watched hold is kept while every new connection takes longer to open than a renewal
/// may wait (a quarter of the TTL: TLS and authentication to a distant store, on a loaded
/// machine): no renewal fails while the client's connections live, and once every
/// connection is cut, a renewal that gives up leaves its connection opening for the next
/// attempt, so the hold is not lost and its lease keeps moving.
///
/// A driver that opens a connection inside the operation that needs it, and drops it
/// half-open with an operation that gave up, never reconnects and loses every hold; one
/// that opens a new connection for its first renewal fails that renewal.
pub async fn hold_survives_slow_reconnect(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    // A renewal may wait a quarter of the TTL and tries again a twelfth of it later, so a
    // connection opened in the background for the first attempt has the delay plus a third
    // of the TTL, less 50 ms, to be ready for the second: at least the store's connect
    // allowance. A third attempt would start after the hold was reported lost.
    let ttl = (h.ttl() * 3).max((store.connect_allowance() + Duration::from_millis(50)) * 3);
    let allowance = lockcore::driver::renewal_allowance(ttl);
    let delay = allowance + Duration::from_millis(50);
    let a = store.client().await?;
    let other = store.client().await?;
    if !a.link.slow_connects(delay).await {
        eprintln!(
            "hold_survives_slow_reconnect: this store's link carries no connections to slow \
             down or cut; nothing checked"
        );
        return Ok(());
    }
    let key = Keys::new().key("slow-reconnect");
    let guard = a.client.lock(&key).ttl(ttl).acquire().await?;
    let taken = guard.valid_until();

    // The connections open: every renewal goes through, none waits for a new connection.
    let failing = tokio::time::timeout(ttl / 2, guard.renewal_failing()).await;
    check!(
        failing.is_err(),
        "a renewal failed although the store answered (new connections open in {delay:?}, \
         a renewal may wait {allowance:?}): {:?}",
        *guard.renewal_health().borrow()
    );
    check!(
        guard.valid_until() > taken,
        "no renewal went through in half a TTL ({ttl:?})"
    );

    // Every connection cut: renewals need new ones, each slower to open than a renewal
    // may wait.
    check!(
        a.link.cut().await,
        "the link slows new connections down but cannot cut them"
    );
    let cut = Instant::now();
    let lost = tokio::time::timeout(ttl * 3 / 2, guard.lost()).await;
    check!(
        lost.is_err(),
        "the hold was lost {:?} after its connections were cut, although new ones open in \
         {delay:?} (a renewal may wait {allowance:?}, the TTL is {ttl:?}): {:?}",
        cut.elapsed(),
        *guard.renewal_health().borrow()
    );
    check!(
        guard.valid_until() > cut + ttl,
        "the lease did not move after the connections were cut"
    );
    check!(
        other
            .client
            .lock(&key)
            .ttl(ttl)
            .try_acquire()
            .await?
            .is_none(),
        "another client took the key while its holder renewed it"
    );
    a.link.slow_connects(Duration::ZERO).await;
    guard.release().await?;
    Ok(())
}
