use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{FencingToken, LockClient, LockGuard};

use crate::scenarios::{while_delayed, Keys};
use crate::{check, Failure, Harness, Outcome};

/// With slow answers, the lease the client computes (`valid_until`) ends no later than the
/// store's expiry: the request's start plus the TTL the store applied, and what `inspect`
/// shows as remaining.
pub async fn valid_until_within_store_expiry(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let key = keys.key("lease");
    let ttl = h.ttl();
    let slow = store.client().await?;
    let other = store.client().await?;
    let _ = slow.client.inspect(&key).await?;
    let _ = other.client.inspect(&key).await?;
    // Under half the TTL scale, so a driver's request timeout lets the answers through; a
    // lease computed from the answer rather than the request is late by at least this.
    let delay = ttl / 4;
    slow.link.delay_answers(delay).await;
    let started = Instant::now();
    let g = slow
        .client
        .lock(&key)
        .ttl(ttl * 10)
        .watchdog(false)
        .acquire()
        .await;
    let g = match g {
        Ok(g) => g,
        Err(e) => {
            slow.link.delay_answers(Duration::ZERO).await;
            return Err(while_delayed(e, delay));
        }
    };
    let outcome = check_lease(&g, &other.client, &key, started, ttl, "acquire").await;
    let outcome = match outcome {
        Ok(()) => {
            let started = Instant::now();
            match g.extend().await {
                Ok(()) => check_lease(&g, &other.client, &key, started, ttl, "extend").await,
                Err(e) => Err(while_delayed(e, delay)),
            }
        }
        failed => failed,
    };
    slow.link.delay_answers(Duration::ZERO).await;
    g.release().await?;
    outcome
}

/// The lease of `g`, whose last request (an `what`) started at `started`, ends no later
/// than the store's expiry of it as `observer` sees it.
async fn check_lease(
    g: &LockGuard,
    observer: &LockClient,
    key: &str,
    started: Instant,
    ttl: Duration,
    what: &str,
) -> Outcome {
    let lease = g.lease();
    let valid_until = g.valid_until();
    check!(
        valid_until <= started + lease.ttl(),
        "after a slow {what}, the lease ends {:?} after the request's start plus the {:?} TTL the store applied",
        valid_until.saturating_duration_since(started + lease.ttl()),
        lease.ttl()
    );
    let remaining = remaining(observer, key, g.token()).await?;
    // Some stores count their remaining TTL in whole milliseconds or seconds (etcd).
    let tolerance = ttl / 2 + Duration::from_millis(20);
    check!(
        valid_until <= remaining + tolerance,
        "after a slow {what}, the lease ends {:?} after the store's expiry (inspect)",
        valid_until.saturating_duration_since(remaining)
    );
    Ok(())
}

/// The store's expiry of the lease with `token`, as late as it can be by `inspect`: the
/// remaining TTL added to the instant the answer arrived.
async fn remaining(
    observer: &LockClient,
    key: &str,
    token: FencingToken,
) -> Result<Instant, Failure> {
    let leases = observer.inspect_all(key).await?;
    let answered = Instant::now();
    let Some(lease) = leases.into_iter().find(|l| l.token == token) else {
        return Err(Failure(format!(
            "inspect does not show the lease with token {token}"
        )));
    };
    let Some(remaining) = lease.remaining_ttl else {
        return Err(Failure("inspect shows no remaining TTL".into()));
    };
    Ok(answered + remaining)
}
