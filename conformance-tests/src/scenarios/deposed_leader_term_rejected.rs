use std::sync::Arc;
use std::time::Duration;

use lockcore::FencedResource;

use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// A leader paused past its lease (its link to the store frozen) is replaced; the new
/// leader's term is higher, the old leader is told it lost leadership, and a resource
/// fenced by terms rejects the old leader's late write.
pub async fn deposed_leader_term_rejected(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let key = keys.key("deposed");
    let ttl = h.ttl();
    let a = store.client().await?;
    let b = store.client().await?;
    let resource = FencedResource::new("nobody");
    let old = a.client.election(&key).ttl(ttl).campaign("a").await?;
    check!(
        resource.write(old.term(), |v| *v = "a").is_ok(),
        "the first leader's write was rejected"
    );
    a.link.pause().await;
    let new = b
        .client
        .election(&key)
        .ttl(ttl * 10)
        .wait(ttl * 20)
        .campaign("b")
        .await?;
    check!(
        new.term() > old.term(),
        "the new leader's term {} is not above the deposed one's {}",
        new.term(),
        old.term()
    );
    let leader = b.client.election(&key).leader().await?;
    check!(
        leader.as_ref().map(|l| (l.value.as_str(), l.term)) == Some(("b", new.term())),
        "the election reports {leader:?} as leader"
    );
    check!(
        resource.write(new.term(), |v| *v = "b").is_ok(),
        "the new leader's write was rejected"
    );
    let lost = tokio::time::timeout(ttl * 2 + Duration::from_secs(1), old.lost()).await;
    a.link.resume().await;
    check!(
        lost.is_ok(),
        "the deposed leader was not told it lost leadership"
    );
    check!(
        resource.write(old.term(), |v| *v = "a again").is_err(),
        "the deposed leader's late write was accepted"
    );
    check!(
        resource.read() == "b",
        "the resource holds {:?}",
        resource.read()
    );
    new.resign().await?;
    drop(old);
    Ok(())
}
