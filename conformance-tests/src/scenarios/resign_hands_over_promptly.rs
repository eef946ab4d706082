use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// A leader that resigns hands over to a waiting campaigner on another client long before
/// its lease would have run out, and the next leader publishes its own value.
pub async fn resign_hands_over_promptly(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("resign");
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let notified = c[0].capabilities().notifications;
    let first = c[0].election(&key).ttl(ttl * 30).campaign("first").await?;
    let next = {
        let (client, key) = (c[1].clone(), key.clone());
        tokio::spawn(async move {
            let leadership = client
                .election(&key)
                .ttl(ttl * 30)
                .wait(ttl * 25)
                .campaign("second")
                .await?;
            Ok::<_, lockcore::LockError>((leadership, Instant::now()))
        })
    };
    // Let the campaigner fail its first try and sleep on the backend's signal.
    tokio::time::sleep(ttl / 2).await;
    let resigned = Instant::now();
    let first_term = first.term();
    first.resign().await?;
    let (second, at) = next
        .await
        .map_err(|e| Failure(format!("campaigner panicked: {e}")))??;
    let gap = at.saturating_duration_since(resigned);
    let bound = if notified {
        ttl
    } else {
        ttl + Duration::from_millis(250)
    };
    check!(gap <= bound, "the hand-over took {gap:?} (bound {bound:?})");
    check!(
        second.term() > first_term,
        "the next term {} is not above {first_term}",
        second.term()
    );
    let leader = c[0].election(&key).leader().await?;
    check!(
        leader.as_ref().map(|l| l.value.as_str()) == Some("second"),
        "the election reports {leader:?}"
    );
    second.resign().await?;
    Ok(())
}
