//! Deliberately broken backends: each breaks one promise of the contract, so the suite's
//! self-test can show which scenarios catch it. A scenario no broken backend can fail is a
//! scenario to strengthen.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lockcore::memory::MemoryBackend;
use lockcore::{
    AcquireOutcome, Capabilities, ExtendOutcome, FencingToken, Grant, LockBackend, LockError,
    LockInfo, LockKey, Owner, ReleaseOutcome, WaitHint,
};

/// Which promise a [`Broken`] backend breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Breakage {
    /// Grants the lock to every caller, taking it from the holder.
    GrantsEveryone,
    /// Release frees the lock whoever asks.
    ReleaseIgnoresOwner,
    /// Every holder gets token 1.
    TokensDoNotIncrease,
    /// Locks stay held long after their TTL (the TTL is ignored).
    NeverExpires,
    /// Declares release notifications but never sends one: waiters sleep until timeouts.
    NotificationsNeverFire,
    /// Applies an acquisition, then loses its answer (the caller sees an error).
    AcquireAnswerLost,
    /// Extend reports success whoever holds the key (a live lease is taken as proof).
    ExtendIgnoresOwner,
    /// Inspect shows the owner token as the holder's label.
    InspectShowsOwnerToken,
    /// Release answers `Released` but leaves the lock in place (until its TTL).
    ReleaseDoesNothing,
    /// Extend of a key nobody holds creates it for the caller (a renewal resurrects a lock).
    ExtendCreates,
}

impl Breakage {
    /// Every breakage.
    pub const ALL: [Breakage; 10] = [
        Breakage::GrantsEveryone,
        Breakage::ReleaseIgnoresOwner,
        Breakage::TokensDoNotIncrease,
        Breakage::NeverExpires,
        Breakage::NotificationsNeverFire,
        Breakage::AcquireAnswerLost,
        Breakage::ExtendIgnoresOwner,
        Breakage::InspectShowsOwnerToken,
        Breakage::ReleaseDoesNothing,
        Breakage::ExtendCreates,
    ];
}

/// A [`MemoryBackend`] with one [`Breakage`].
#[derive(Debug)]
pub struct Broken {
    inner: Arc<MemoryBackend>,
    breakage: Breakage,
    owners: Mutex<HashMap<LockKey, String>>,
}

impl Broken {
    /// Wraps `inner` (share one inner store between several `Broken` to get several clients).
    pub fn new(inner: Arc<MemoryBackend>, breakage: Breakage) -> Self {
        Broken {
            inner,
            breakage,
            owners: Mutex::default(),
        }
    }
}

const FOREVER: Duration = Duration::from_secs(3600);

#[async_trait]
impl LockBackend for Broken {
    fn name(&self) -> &'static str {
        "broken-memory"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        match self.breakage {
            Breakage::GrantsEveryone => {
                if let AcquireOutcome::Held(_) = self.inner.try_acquire(key, owner, ttl).await? {
                    self.inner.force_release(key).await?;
                }
                self.inner.try_acquire(key, owner, ttl).await
            }
            Breakage::TokensDoNotIncrease => {
                Ok(match self.inner.try_acquire(key, owner, ttl).await? {
                    AcquireOutcome::Acquired(g) => {
                        AcquireOutcome::Acquired(Grant::new(FencingToken(1), g.ttl))
                    }
                    held => held,
                })
            }
            Breakage::NeverExpires => {
                Ok(match self.inner.try_acquire(key, owner, FOREVER).await? {
                    AcquireOutcome::Acquired(g) => {
                        AcquireOutcome::Acquired(Grant::new(g.token, ttl))
                    }
                    held => held,
                })
            }
            Breakage::AcquireAnswerLost => {
                self.inner.try_acquire(key, owner, ttl).await?;
                Err(LockError::unavailable(
                    "broken-memory",
                    "the answer was lost",
                ))
            }
            Breakage::InspectShowsOwnerToken => {
                let outcome = self.inner.try_acquire(key, owner, ttl).await?;
                if let AcquireOutcome::Acquired(_) = outcome {
                    let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
                    owners.insert(key.clone(), owner.token().to_hex());
                }
                Ok(outcome)
            }
            _ => self.inner.try_acquire(key, owner, ttl).await,
        }
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        match self.breakage {
            Breakage::ReleaseIgnoresOwner => self.inner.force_release(key).await,
            Breakage::ReleaseDoesNothing => Ok(match self.inner.inspect(key).await? {
                Some(_) => ReleaseOutcome::Released,
                None => ReleaseOutcome::NotHeld,
            }),
            _ => self.inner.release(key, owner).await,
        }
    }

    async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        match self.breakage {
            Breakage::TokensDoNotIncrease => Ok(match self.inner.extend(key, owner, ttl).await? {
                ExtendOutcome::Extended(g) => {
                    ExtendOutcome::Extended(Grant::new(FencingToken(1), g.ttl))
                }
                lost => lost,
            }),
            Breakage::NeverExpires => Ok(match self.inner.extend(key, owner, FOREVER).await? {
                ExtendOutcome::Extended(g) => ExtendOutcome::Extended(Grant::new(g.token, ttl)),
                lost => lost,
            }),
            Breakage::ExtendIgnoresOwner => Ok(match self.inner.inspect(key).await? {
                Some(info) => ExtendOutcome::Extended(Grant::new(info.token, ttl)),
                None => ExtendOutcome::NotHeld,
            }),
            Breakage::ExtendCreates => match self.inner.extend(key, owner, ttl).await? {
                ExtendOutcome::NotHeld => match self.inner.try_acquire(key, owner, ttl).await? {
                    AcquireOutcome::Acquired(g) => Ok(ExtendOutcome::Extended(g)),
                    AcquireOutcome::Held(_) => Ok(ExtendOutcome::NotHeld),
                },
                extended => Ok(extended),
            },
            _ => self.inner.extend(key, owner, ttl).await,
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let info = self.inner.inspect(key).await?;
        Ok(match (self.breakage, info) {
            (Breakage::TokensDoNotIncrease, Some(i)) => {
                Some(LockInfo::new(i.holder, FencingToken(1), i.remaining_ttl))
            }
            (Breakage::InspectShowsOwnerToken, Some(i)) => {
                let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
                let holder = owners.get(key).cloned().unwrap_or(i.holder);
                Some(LockInfo::new(holder, i.token, i.remaining_ttl))
            }
            (_, info) => info,
        })
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        match self.breakage {
            Breakage::NotificationsNeverFire => {
                tokio::time::sleep(max_wait).await;
                Ok(())
            }
            _ => self.inner.wait_released(key, hint, max_wait).await,
        }
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.inner.force_release(key).await
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.inner.abandon(key, owner).await
    }
}
