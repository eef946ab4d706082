use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::{ClaimMode, FencingToken, LockClient, LockError};

use crate::scenarios::observed::Observed;
use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Reader clients in a stream that never leaves the key free (each holds a while; the next
/// hold starts before the previous ends).
const READERS: usize = 4;

/// What the reader stream saw.
#[derive(Default)]
struct Stream {
    /// Each grant: when its request started, and its token.
    grants: Vec<(Instant, FencingToken)>,
    /// The longest hold, from grant to answered release.
    longest_hold: Duration,
}

/// A writer waiting behind a stream of overlapping readers from several clients is not
/// starved: it gets the key within about the longest reader hold it found plus a hand-off,
/// and readers that started after it was waiting did not get in before it (their tokens
/// are above the writer's).
pub async fn writer_not_starved_by_readers(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("stream");
    let ttl = h.ttl();
    let hold = ttl * 2;
    let c = clients(&*h, READERS + 1).await?;
    let notified = c[0].capabilities().notifications;
    let stop = Arc::new(AtomicBool::new(false));
    let stream = Arc::new(Mutex::new(Stream::default()));
    let readers: Vec<_> = (0..READERS)
        .map(|i| {
            let (client, key) = (c[i].clone(), key.clone());
            let (stop, stream) = (stop.clone(), stream.clone());
            tokio::spawn(async move {
                // Staggered starts: at any moment most of the readers hold the key.
                tokio::time::sleep(hold * i as u32 / READERS as u32).await;
                while !stop.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    let g = client
                        .lock(&key)
                        .shared()
                        .ttl(ttl * 10)
                        .wait(ttl * 60)
                        .acquire()
                        .await?;
                    let (granted, token) = (Instant::now(), g.token());
                    tokio::time::sleep(hold).await;
                    g.release().await?;
                    let mut seen = stream.lock().unwrap_or_else(|e| e.into_inner());
                    seen.grants.push((started, token));
                    seen.longest_hold = seen.longest_hold.max(granted.elapsed());
                }
                Ok::<(), LockError>(())
            })
        })
        .collect();
    // Let the stream run: every reader has started and the key has not been free since.
    tokio::time::sleep(hold + hold / 2).await;
    let writer_ttl = ttl * 4;
    // A polling backend may nap up to half the writer's TTL after the last reader left.
    let handoff = if notified {
        ttl * 2
    } else {
        ttl * 2 + writer_ttl / 2
    };
    let limit = hold * 3 + handoff + ttl * 4;
    // The writer's client tells when its first attempt was refused.
    let observed = Arc::new(Observed::new(c[READERS].backend().clone()));
    let writer_client = LockClient::new(observed.clone());
    let asked = Instant::now();
    let writer = writer_client
        .lock(&key)
        .ttl(writer_ttl)
        .wait(limit)
        .acquire()
        .await;
    let waited = asked.elapsed();
    let result = match writer {
        Ok(w) => {
            let all = writer_client.inspect_all(&key).await;
            let token = w.token();
            w.release().await?;
            Ok((token, all?))
        }
        Err(e) => Err(e),
    };
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        r.await
            .map_err(|e| Failure(format!("reader task panicked: {e}")))??;
    }
    let (writer_token, held) = match result {
        Ok(granted) => granted,
        Err(LockError::Timeout { .. }) => {
            return Err(Failure(format!(
                "the writer was starved: readers kept the key for {waited:?}"
            )))
        }
        Err(e) => return Err(e.into()),
    };
    check!(
        held.len() == 1 && held[0].claim.mode() == ClaimMode::Exclusive,
        "while the writer held the key, inspect_all showed {held:?}"
    );
    let seen = stream.lock().unwrap_or_else(|e| e.into_inner());
    let bound = seen.longest_hold + handoff;
    check!(
        waited <= bound,
        "the writer waited {waited:?}, more than the longest reader hold {:?} plus a hand-off ({bound:?})",
        seen.longest_hold
    );
    // A reader whose request started after the writer's first attempt was refused, and
    // not sooner than half a TTL after the writer asked, reached the store after that
    // attempt (and whatever it recorded): it must have waited for the writer. The refusal's
    // answer is the event; on a loaded machine it can come long after the request.
    let Some(refused) = observed.first_refusal() else {
        // Granted at once: the stream had a gap, nothing to compare with.
        return Ok(());
    };
    let after = refused.max(asked + ttl / 2);
    let late: Vec<_> = seen
        .grants
        .iter()
        .filter(|(started, token)| *started > after && *token < writer_token)
        .map(|(started, token)| (started.saturating_duration_since(asked), *token))
        .collect();
    check!(
        late.is_empty(),
        "readers that started after the writer was refused ({:?} after it asked) got in before \
         it (writer's token {writer_token}; started after the writer asked, token): {late:?}",
        refused.saturating_duration_since(asked)
    );
    Ok(())
}
