//! What a request hands to the background when it ends with something left to undo: an
//! attempt still in flight (its outcome is awaited and whatever it acquired released), an
//! attempt that may have been applied (released by owner), a place the store may keep
//! (abandoned).

use std::sync::atomic::Ordering;
use std::time::Instant;

use tracing::Instrument;

use super::{maybe_applied, Request};
use crate::guard::release_with_retry;
use crate::{AcquireOutcome, ErrorChain};

impl Drop for Request {
    fn drop(&mut self) {
        if self.marked {
            // Its mark, if still in the store, is left to lapse or to the clean-up below.
            self.client.marked.fetch_sub(1, Ordering::Relaxed);
        }
        drop(self.turn.take());
        if self.joined {
            self.client.lines.leave(&self.req.key);
        }
        let attempt = self.attempt.take();
        if attempt.is_none() && !self.maybe_applied && !self.queued {
            // The common case: an answer was delivered and nothing is left to undo.
            drop(self.gate.take());
            if let Some(slot) = &self.slot {
                self.client
                    .slots
                    .done_with(&self.req.key, &self.req.owner, slot);
            }
            return;
        }
        let (client, slot, gate) = (self.client.clone(), self.slot.clone(), self.gate.take());
        let (key, owner) = (self.req.key.clone(), self.req.owner.clone());
        let (mut release, mut abandon) = (self.maybe_applied, self.queued);
        let until = Instant::now() + self.req.ttl;
        let pending = self.client.meter.background_release(&self.req.key);
        let span = tracing::info_span!(
            "distlock.clean_up",
            key = %self.req.key,
            backend = self.client.backend.name(),
            in_flight = attempt.is_some(),
        );
        let finish = async move {
            let _pending = pending;
            if let Some(attempt) = attempt {
                // Not raced against anything: once sent, its outcome must be seen.
                match attempt.await {
                    Ok(AcquireOutcome::Acquired(_)) => (release, abandon) = (true, false),
                    Ok(AcquireOutcome::Held(_)) => (release, abandon) = (false, true),
                    Err(e) => release |= maybe_applied(&e),
                }
            }
            let backend = &*client.backend;
            if release {
                match release_with_retry(backend, &client.meter, &key, &owner, until).await {
                    Ok(outcome) => {
                        tracing::debug!(key = %key, ?outcome, "released what a request left behind")
                    }
                    Err(e) => {
                        tracing::warn!(key = %key, error = %ErrorChain(&e), "could not release what a request left behind; it expires after its TTL")
                    }
                }
            }
            if abandon {
                if let Err(e) = backend.abandon(&key, &owner).await {
                    tracing::debug!(key = %key, error = %ErrorChain(&e), "abandoning a wait failed");
                }
            }
            drop(gate);
            if let Some(slot) = slot {
                client.slots.done_with(&key, &owner, &slot);
            }
        };
        self.client
            .tasks
            .spawn_on(finish.instrument(span), &self.runtime);
    }
}
