//! Renewal: the session's heartbeats keep every node alive, so a renewal sends no write.
//! It proves each hold is still ours (the node is there, with the czxid it was granted
//! with: a node deleted behind our back, or re-created by another, is noticed) with one
//! multi-read per batch, then moves each hold's own TTL on.

use std::sync::Arc;
use std::time::Instant;

use lockcore::driver::{ExtendOutcome, Grant, Renewal, RENEWAL_BATCH};
use lockcore::{FencingToken, LockError};
use zookeeper_client::{Error as ZkError, MultiReadResult, SessionState};

use crate::capabilities::NAME;
use crate::error::to_lock_error;
use crate::places::{Inner, Place, PlaceKey};
use crate::session::same_session;

/// Renews each hold of `renewals`: `NotHeld` for one whose node or session is gone or
/// whose TTL ran out; an error for the whole batch while the servers cannot be reached.
pub(crate) async fn renew(
    inner: &Arc<Inner>,
    renewals: &[Renewal<'_>],
) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
    let start = Instant::now();
    let mut outcomes: Vec<Option<Result<ExtendOutcome, LockError>>> =
        renewals.iter().map(|_| None).collect();
    let client = inner.session.current().await;
    if let Some(client) = &client {
        if client.state() == SessionState::Disconnected {
            // The servers may still keep the session (and the nodes): nothing can be
            // proved either way until the client reconnects.
            return Err(LockError::unavailable(
                NAME,
                "disconnected from ZooKeeper; the session may still live",
            )
            .at(inner.session.cfg().place()));
        }
    }
    let mut checks: Vec<(usize, PlaceKey, Place)> = Vec::new();
    for (i, r) in renewals.iter().enumerate() {
        let pk = inner.place_key(r.key, r.owner);
        match (inner.place(&pk), &client) {
            (Some(p), Some(c))
                if same_session(c, p.session) && p.held_until.is_some_and(|t| t > start) =>
            {
                checks.push((i, pk, p));
            }
            _ => outcomes[i] = Some(Ok(ExtendOutcome::NotHeld)),
        }
    }
    if let Some(client) = client {
        for chunk in checks.chunks(RENEWAL_BATCH) {
            let mut reader = client.new_multi_reader();
            for (_, _, place) in chunk {
                reader
                    .add_get_data(&place.path)
                    .map_err(|e| to_lock_error(e, &place.path, &inner.session.cfg().place()))?;
            }
            let root = &inner.session.cfg().root;
            let results = inner
                .session
                .run("checking holds", root, reader.commit())
                .await?;
            for ((i, pk, place), result) in chunk.iter().zip(results) {
                outcomes[*i] =
                    Some(match result {
                        MultiReadResult::Data { stat, .. }
                            if stat.czxid >= 0 && stat.czxid as u64 == place.token =>
                        {
                            let ttl = renewals[*i].ttl;
                            match inner.hold(pk, place, start, ttl, client.session_timeout()) {
                                Some(ttl) => Ok(ExtendOutcome::Extended(Grant::new(
                                    FencingToken(place.token),
                                    ttl,
                                ))),
                                None => Ok(ExtendOutcome::NotHeld),
                            }
                        }
                        MultiReadResult::Error { err } if err != ZkError::NoNode => Err(
                            to_lock_error(err, &place.path, &inner.session.cfg().place()),
                        ),
                        _ => {
                            inner.forget(pk, &place.path);
                            Ok(ExtendOutcome::NotHeld)
                        }
                    });
            }
        }
    }
    Ok(outcomes
        .into_iter()
        .map(|o| o.unwrap_or(Ok(ExtendOutcome::NotHeld)))
        .collect())
}
