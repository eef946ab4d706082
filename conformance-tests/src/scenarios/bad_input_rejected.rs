use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::LockError;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// How long the minimum-TTL grant is retried while the store answers too late for it.
const LATE_GRANTS_FOR: Duration = Duration::from_secs(10);

/// Bad keys and TTLs are rejected with `InvalidKey` / `InvalidTtl` before any request is
/// sent; a TTL under the backend's minimum is rounded up and shown on the lease.
pub async fn bad_input_rejected(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let c = clients(&*h, 1).await?;
    let client = &c[0];
    let caps = client.capabilities();
    let started = Instant::now();
    let long = "k".repeat(256);
    for bad in [
        "",
        "nul\0byte",
        "line\nbreak",
        "tab\t",
        "\u{7f}",
        long.as_str(),
    ] {
        match client.lock(bad).try_acquire().await {
            Err(LockError::InvalidKey { .. }) => {}
            other => {
                return Err(Failure(format!(
                    "key {bad:?}: expected InvalidKey, got {other:?}"
                )))
            }
        }
        match client
            .lock(bad)
            .wait(Duration::from_secs(1))
            .acquire()
            .await
        {
            Err(LockError::InvalidKey { .. }) => {}
            other => {
                return Err(Failure(format!(
                    "key {bad:?}: expected InvalidKey, got {other:?}"
                )))
            }
        }
        check!(
            matches!(client.inspect(bad).await, Err(LockError::InvalidKey { .. })),
            "inspect accepted {bad:?}"
        );
    }
    let key = keys.key("ttl");
    for ttl in [
        Duration::ZERO,
        caps.max_ttl + Duration::from_secs(1),
        Duration::MAX,
    ] {
        match client.lock(&key).ttl(ttl).try_acquire().await {
            Err(LockError::InvalidTtl { .. }) => {}
            other => {
                return Err(Failure(format!(
                    "TTL {ttl:?}: expected InvalidTtl, got {other:?}"
                )))
            }
        }
    }
    // A set of keys naming one twice, holding a bad key, or empty.
    let (one, other) = (keys.key("set-one"), keys.key("set-other"));
    let sets: [(&str, Vec<String>); 3] = [
        (
            "a set naming a key twice",
            vec![one.clone(), other.clone(), one.clone()],
        ),
        (
            "a set with a bad key",
            vec![one.clone(), "nul\0byte".into()],
        ),
        ("an empty set", Vec::new()),
    ];
    for (what, set) in sets {
        match client
            .lock_all(set)
            .wait(Duration::from_secs(1))
            .acquire()
            .await
        {
            Err(LockError::Config { .. } | LockError::InvalidKey { .. }) => {}
            other => {
                return Err(Failure(format!(
                    "{what}: expected a configuration or key error, got {:?}",
                    other.map(|g| g.guards().len())
                )))
            }
        }
    }
    check!(
        client.inspect(&one).await?.is_none(),
        "a rejected set left one of its keys held"
    );
    // No round trip was made for any of these.
    check!(
        started.elapsed() < h.ttl(),
        "rejecting bad input took {:?}",
        started.elapsed()
    );
    check!(
        client.inspect(&key).await?.is_none(),
        "a rejected request left the key held"
    );
    // A store that answers after the minimum TTL (a millisecond on some) grants a lease
    // that is over on arrival, which the client refuses as retryable. On a loaded machine
    // most answers can take longer than a millisecond, so a handful of tries is not enough:
    // keep trying for a while (each late grant was released again, so the key is free).
    let trying = Instant::now();
    let g = loop {
        let asked = Instant::now();
        match client
            .lock(&key)
            .ttl(Duration::from_nanos(1))
            .try_acquire()
            .await
        {
            Err(e)
                if e.is_retryable()
                    && asked.elapsed() >= caps.min_ttl
                    && trying.elapsed() < LATE_GRANTS_FOR =>
            {
                tokio::task::yield_now().await;
            }
            other => break other?,
        }
    };
    let Some(g) = g else {
        return Err(Failure("a free key was reported held".into()));
    };
    check!(
        g.lease().ttl() >= caps.min_ttl,
        "a TTL below the minimum was not rounded up: {:?}",
        g.lease().ttl()
    );
    g.release().await?;
    Ok(())
}
