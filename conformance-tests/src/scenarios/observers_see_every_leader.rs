use std::sync::Arc;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// An observer on another client reports the leaders of an election in term order: each
/// leader (held until the observer has seen it) exactly once, none skipped, and never an
/// older leader after a newer one; a resignation shows as a vacancy or as the next leader.
pub async fn observers_see_every_leader(h: Arc<dyn Harness>) -> Outcome {
    const LEADERS: usize = 5;
    let keys = Keys::new();
    let key = keys.key("observed");
    let ttl = h.ttl() * 30;
    let c = clients(&*h, 3).await?;
    let mut watch = c[0].election(&key).observe()?;
    let initial = watch.changed().await?;
    check!(
        initial.is_none(),
        "a leader before any campaign: {initial:?}"
    );
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let observer = tokio::spawn(async move {
        loop {
            let change = watch.changed().await;
            let failed = change.is_err();
            if seen_tx.send(change).is_err() || failed {
                break;
            }
        }
    });
    let mut reported = Vec::new();
    for i in 0..LEADERS {
        let value = format!("leader-{i}");
        let leadership = c[1 + i % 2]
            .election(&key)
            .ttl(ttl)
            .wait(ttl)
            .campaign(&value)
            .await?;
        // Wait for the observer to report this leader; whatever it reports before must be
        // a vacancy (the previous resignation), never another leader.
        loop {
            let change = tokio::time::timeout(ttl, seen.recv())
                .await
                .map_err(|_| Failure(format!("the observer never reported {value}")))?
                .ok_or_else(|| Failure("the observer stopped".into()))??;
            match change {
                None => continue,
                Some(leader) => {
                    check!(
                        leader.term == leadership.term() && leader.value == value,
                        "waiting for {value} (term {}), the observer reported {leader:?}",
                        leadership.term()
                    );
                    reported.push(leader.term);
                    break;
                }
            }
        }
        leadership.resign().await?;
    }
    observer.abort();
    check!(
        reported.windows(2).all(|w| w[0] < w[1]),
        "reported terms did not rise: {reported:?}"
    );
    Ok(())
}
