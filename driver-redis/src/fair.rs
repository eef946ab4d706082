//! The fair layout's operations (`fair=true`): acquire, release, abandon and wait, each one
//! script of [`fair_scripts`]. Renewals and the holders' listing are the plain layout's:
//! the lock key is the same.

use std::time::Duration;

use lockcore::driver::{AcquireOutcome, WaitHint};
use lockcore::{Claim, LockError, LockKey, Owner, ReleaseOutcome};
use redis::Value;

use crate::backend::RedisBackend;
use crate::capabilities::fence_ttl_millis;
use crate::fair_scripts;
use crate::reply::acquire_outcome;

impl RedisBackend {
    /// Grants the lock to the first place in the queue, or queues `owner`: a refusal
    /// carries the owner's ticket as the wait hint's revision.
    pub(crate) async fn fair_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl_ms: u64,
    ) -> Result<AcquireOutcome, LockError> {
        let names = self.names(key);
        let mut invocation = self.lua(&fair_scripts::ACQUIRE).key(&names.lock);
        invocation
            .key(names.queue())
            .key(names.places())
            .key(names.fence())
            .arg(owner.token().to_hex())
            .arg(ttl_ms)
            .arg(owner.label())
            .arg(fence_ttl_millis());
        let reply: Vec<Value> = self.bounded_script("acquire", &invocation).await?;
        acquire_outcome(
            &reply,
            key,
            &Claim::exclusive(),
            Duration::from_millis(ttl_ms),
        )
    }

    /// Releases `owner`'s lock (`None`: whoever holds it) and wakes the first place.
    pub(crate) async fn fair_release(
        &self,
        key: &LockKey,
        owner: Option<&Owner>,
    ) -> Result<ReleaseOutcome, LockError> {
        let names = self.names(key);
        let mut invocation = self.lua(&fair_scripts::RELEASE).key(&names.lock);
        invocation
            .key(names.queue())
            .key(names.places())
            .arg(owner.map(|o| o.token().to_hex()).unwrap_or_default());
        let what = if owner.is_some() {
            "release"
        } else {
            "force release"
        };
        let released: i64 = self.bounded_script(what, &invocation).await?;
        Ok(if released == 0 {
            ReleaseOutcome::NotHeld
        } else {
            ReleaseOutcome::Released
        })
    }

    /// Removes `owner`'s place in the queue, waking the next place if it was first.
    pub(crate) async fn fair_abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        let names = self.names(key);
        let mut invocation = self.lua(&fair_scripts::ABANDON).key(&names.lock);
        invocation
            .key(names.queue())
            .key(names.places())
            .arg(owner.token().to_hex());
        let _removed: i64 = self.bounded_script("abandon", &invocation).await?;
        Ok(())
    }

    /// Waits until the ticket of the refused attempt (the hint's revision) is announced,
    /// or the re-check's bound passes: the holder's lease or the first place runs out, or
    /// half of what the waiter's own place has left (its next attempt renews the place).
    pub(crate) async fn fair_wait(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let names = self.names(key);
        let channel = names.channel();
        // Every fair refusal carries a ticket; without one the re-check finds no place
        // and the next attempt queues again.
        let ticket = hint.revision().unwrap_or(-1);
        // Order matters, as in the plain wait: the ticket's interest first, then the
        // server subscription, then the re-check.
        let announced = self.waiters.wait_for_ticket(&channel, ticket);
        let _registration = self.waiters.register(key, &channel).await?;
        let mut watch = self.lua(&fair_scripts::WATCH).key(&names.lock);
        watch.key(names.queue()).key(names.places()).arg(ticket);
        let ms: i64 = self.bounded_script("watch", &watch).await?;
        if ms < 0 {
            return Ok(());
        }
        let wait = max_wait.min(Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
        let _ = tokio::time::timeout(wait, announced.announced()).await;
        Ok(())
    }
}
