//! A request's way in: the (key, owner) gate, a re-entry answered under it, and the
//! request's turn in its client's line for the key, before it tries the store.

use std::ops::ControlFlow;
use std::sync::Arc;

use super::{Answer, Request};
use crate::guard::LockGuard;
use crate::slots::Slot;
use crate::{Fairness, LockError};

impl Request {
    /// Takes the (key, owner) gate, answers a re-entry, and takes this request's turn in
    /// the client's line for the key: `Continue(true)` if it had to wait for it.
    pub(super) async fn enter(&mut self, wait: bool) -> ControlFlow<Answer, bool> {
        if self.client.closed.is_cancelled() {
            return ControlFlow::Break(Err(LockError::Shutdown));
        }
        // A fresh owner holds nothing and no other request can use it: it has no gate to
        // take (its slot is made with its hold).
        if let Some(slot) = self.slot.clone() {
            if let Some(answer) = self.take_gate(slot).await {
                return ControlFlow::Break(answer);
            }
        }
        // Where the store does not order waiters, this client's requests for a key queue
        // in a line of their own: only its head waits for the store and tries; a new
        // request joins the line at the back instead of racing the head (as
        // `tokio::sync::Mutex` serves its waiters in order) — also while the head is still
        // on its first attempt, so that a burst of requests for one key sends one attempt,
        // not one each (10,000 waiters arriving together sent 6,473 attempts to
        // PostgreSQL, and etcd stopped answering). Across processes the heads still race.
        if wait && self.client.caps.fairness != Fairness::Fifo {
            // The turn is almost always free.
            if let Err(line) = self.take_free_turn() {
                if let Err(e) = self.wait_turn(line).await {
                    return ControlFlow::Break(Err(e));
                }
                return ControlFlow::Continue(true);
            }
        }
        ControlFlow::Continue(false)
    }

    /// Takes the gate of an owner's `slot`, and answers a re-entry under it: the answer,
    /// or `None` to go on.
    async fn take_gate(&mut self, slot: Arc<Slot>) -> Option<Answer> {
        let client = self.client.clone();
        let inner = &*client;
        // The gate is almost always free: take it without registering for the shutdown
        // signal.
        let gate = match slot.clone().try_lock_owned() {
            Ok(gate) => gate,
            // Boxed: every waiter's future would keep room for this rare wait.
            Err(_) => {
                let slot = slot.clone();
                let gate = Box::pin(async move {
                    tokio::select! {
                        biased;
                        _ = inner.closed.cancelled() => None,
                        gate = slot.lock_owned() => Some(gate),
                    }
                });
                match gate.await {
                    Some(gate) => gate,
                    None => return Some(Err(LockError::Shutdown)),
                }
            }
        };
        let state = self.gate.insert(gate);
        let hold = state.hold.clone()?;
        if hold.claim != self.req.claim {
            return Some(Err(LockError::config(format!(
                "this owner holds {:?} as {} and asked for {}: re-entry keeps the mode and weight (no upgrade or downgrade); release first, or use another owner",
                hold.key.as_str(), hold.claim, self.req.claim
            ))));
        }
        state.count += 1;
        tracing::debug!(key = %hold.key, holds = state.count, "lock re-entered");
        Some(Ok(Some(LockGuard::new(client.clone(), slot, hold))))
    }

    /// Joins this client's line for the key and takes its turn if nobody is ahead; else
    /// the line, to [`wait_turn`](Self::wait_turn) in.
    fn take_free_turn(&mut self) -> Result<(), Arc<tokio::sync::Mutex<()>>> {
        let line = self.client.lines.join(&self.req.key);
        self.joined = true;
        match line.clone().try_lock_owned() {
            Ok(turn) => {
                self.turn = Some(turn);
                Ok(())
            }
            Err(_) => Err(line),
        }
    }

    /// Waits for the turn of a line this request joined.
    async fn wait_turn(&mut self, line: Arc<tokio::sync::Mutex<()>>) -> Result<(), LockError> {
        // No shutdown signal here: the head of the line answers a shutdown and leaves,
        // and so each request after it in turn (a select over both would double the
        // room every waiter behind the head keeps).
        let turn = line.lock_owned().await;
        if self.client.closed.is_cancelled() {
            return Err(LockError::Shutdown);
        }
        self.turn = Some(turn);
        Ok(())
    }
}
