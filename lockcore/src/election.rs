//! Leader election on one key, built on the exclusive lock: a campaign is an acquisition
//! whose holder label is the value the leader publishes, the term is its fencing token, and
//! observers follow the holder with `inspect` and the backend's release signal.

use std::time::Duration;

use crate::error::Operation;
use crate::{
    FencingGuarantee, FencingToken, LockClient, LockError, LockGuard, LockInfo, LockKey, Owner,
    ReleaseOutcome, WaitHint, MAX_LABEL_LEN,
};

/// While nobody leads, how often an observer looks for a new leader at first and at most:
/// stores announce releases, not grants, so the appearance of a leader is polled.
const VACANT_POLL: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(250));

/// While a leader holds, the longest an observer sleeps on the release signal before it
/// looks again. A store's release signal wakes waiters of a *free* key: a leader that
/// resigns and is succeeded between the observer's look and its subscription leaves the
/// key held, by someone else, and no signal comes until that successor goes.
const HELD_RECHECK: Duration = Duration::from_secs(1);

/// A leader election on one key, from [`LockClient::election`].
///
/// The election *is* the exclusive lock on its key: the leader holds it (renewed by the
/// watchdog) with its published value as the holder label, and its **term** is the lock's
/// fencing token — strictly increasing per election, so a resource that remembers the
/// highest term it has seen rejects a deposed leader's late writes
/// ([`FencedResource`](crate::FencedResource)). `distlock status KEY` shows the leader.
/// Backends without fencing tokens ([`FencingGuarantee::None`]) cannot hold elections:
/// every term would be 0.
///
/// # Examples
///
/// ```
/// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
/// use distlock_core::{LockClient, memory::MemoryBackend};
///
/// let locks = LockClient::new(MemoryBackend::new());
/// let election = locks.election("scheduler");
/// let leadership = election.campaign("node-1:8080").await?;
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!(leader.value, "node-1:8080");
/// assert_eq!(leader.term, leadership.term());
/// leadership.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct Election {
    client: LockClient,
    key: String,
    ttl: Option<Duration>,
    wait: Option<Duration>,
}

/// The current leader of an election, as [`Election::leader`] and [`LeaderWatch`] report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The value the leader published with [`Election::campaign`].
    pub value: String,
    /// Its term: the fencing token of its lock.
    pub term: FencingToken,
    /// Time left on its lease when it was read, when the store tells it.
    pub remaining_ttl: Option<Duration>,
}

impl From<LockInfo> for Leader {
    fn from(info: LockInfo) -> Self {
        Leader {
            value: info.holder,
            term: info.token,
            remaining_ttl: info.remaining_ttl,
        }
    }
}

impl LockClient {
    /// The leader election on `key` (etcd's `concurrency.Election`, on any backend with
    /// fencing tokens): [`campaign`](Election::campaign) to lead,
    /// [`leader`](Election::leader) and [`observe`](Election::observe) to follow.
    pub fn election(&self, key: impl Into<String>) -> Election {
        Election {
            client: self.clone(),
            key: key.into(),
            ttl: None,
            wait: None,
        }
    }
}

impl Election {
    /// The leader's lease (default: the client's default TTL), renewed by the watchdog: a
    /// leader that dies is replaced at most this long after its last renewal.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long [`campaign`](Self::campaign) waits to lead before it fails with
    /// [`LockError::Timeout`] (default: forever).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The election's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Waits until this process leads, publishing `value` (an address, a node name: up to
    /// [`MAX_LABEL_LEN`] bytes of text without control characters) for
    /// [`leader`](Self::leader) and observers.
    ///
    /// # Errors
    ///
    /// * [`LockError::Config`]: the value is too long or has control characters, or the
    ///   backend has no fencing tokens (terms would all be 0).
    /// * As [`LockRequest::acquire`](crate::LockRequest::acquire): a bad key or TTL,
    ///   [`LockError::Timeout`] after the [`wait`](Self::wait) deadline, store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockRequest::acquire`](crate::LockRequest::acquire): a dropped
    /// campaign leaves nothing held.
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership, LockError> {
        let value = value.into();
        check_value(&value)?;
        if self.client.capabilities().fencing == FencingGuarantee::None {
            return Err(LockError::config(format!(
                "leader election needs fencing tokens (terms are tokens), and the {} backend \
                 declares none",
                self.client.backend().name()
            )));
        }
        let mut request = self.client.lock(self.key.clone()).owner(Owner::new(&value));
        if let Some(ttl) = self.ttl {
            request = request.ttl(ttl);
        }
        if let Some(wait) = self.wait {
            request = request.wait(wait);
        }
        let guard = request.acquire().await?;
        Ok(Leadership { guard, value })
    }

    /// The current leader, or `None` while nobody leads.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] for a bad key; store errors as the backend reports them.
    pub async fn leader(&self) -> Result<Option<Leader>, LockError> {
        Ok(self.client.inspect(&self.key).await?.map(Leader::from))
    }

    /// Follows the leader: see [`LeaderWatch`].
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] for a bad key.
    pub fn observe(&self) -> Result<LeaderWatch, LockError> {
        Ok(LeaderWatch {
            client: self.client.clone(),
            key: LockKey::new(&self.key)?,
            seen: None,
            last_term: None,
            started: false,
        })
    }
}

/// Values are holder labels, which backends store and show as they are: refuse what a
/// label would have to alter rather than publish something else.
fn check_value(value: &str) -> Result<(), LockError> {
    if value.len() > MAX_LABEL_LEN {
        return Err(LockError::config(format!(
            "an election value takes at most {MAX_LABEL_LEN} bytes, this one has {}",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(LockError::config(
            "an election value cannot contain control characters",
        ));
    }
    Ok(())
}

/// This process leads an election: from [`Election::campaign`].
///
/// Leadership lasts while the lock is held: the watchdog renews it, [`lost`](Self::lost)
/// fires when it cannot, and [`resign`](Self::resign) (or dropping this) hands it on. As for
/// any lock, `lost()` is advisory — timers fire late in the very stalls that depose a
/// leader; pass [`term`](Self::term) with every write the leader makes.
#[derive(Debug)]
#[must_use = "leadership ends when this is dropped"]
pub struct Leadership {
    guard: LockGuard,
    value: String,
}

impl Leadership {
    /// The term: strictly increasing per election, the fencing token to give resources.
    pub fn term(&self) -> FencingToken {
        self.guard.token()
    }

    /// The value this leader published.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The election's key.
    pub fn key(&self) -> &LockKey {
        self.guard.key()
    }

    /// The lock behind the leadership (lease, renewal health, explicit extend).
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The lock behind the leadership, to hold as any lock (releasing it resigns).
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Resolves when leadership is lost (see [`LockHandle::lost`](crate::LockHandle::lost)).
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// Whether leadership is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Resolves when renewals start failing: the early warning before
    /// [`lost`](Self::lost) (see [`LockHandle::renewal_failing`](crate::LockHandle::renewal_failing)).
    pub fn renewal_failing(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.guard.renewal_failing()
    }

    /// Steps down, so the next campaigner leads at once.
    ///
    /// # Errors
    ///
    /// [`LockError::NotHeld`] when leadership was already lost; store errors as
    /// [`LockGuard::release`] reports them.
    pub async fn resign(self) -> Result<(), LockError> {
        let key = self.guard.key().clone();
        match self.guard.release().await? {
            // Each campaign has an owner of its own: never re-entered, never still held.
            ReleaseOutcome::Released | ReleaseOutcome::StillHeld { .. } => Ok(()),
            ReleaseOutcome::NotHeld => Err(LockError::NotHeld { key }),
        }
    }
}

/// Follows an election's leader: from [`Election::observe`].
///
/// [`changed`](Self::changed) answers the current state first, then each change: a new
/// leader (a higher term), or `None` when leadership falls vacant. Terms only rise: a
/// leader whose term is not above the last one reported is never reported (a stale read
/// cannot go back in time), and no term it saw is skipped. While a leader holds, the watch
/// sleeps on the backend's release signal (pub/sub, NOTIFY, watch, polling where the store
/// has none), bounded by the leader's remaining lease and by one second: a succession that
/// completes between the watch's look and its subscription sends no signal the watch could
/// still hear, so it is seen at the next look, within a second. While nobody leads, it
/// looks for a new leader every few milliseconds, backing off to 250 ms (stores announce
/// releases, not grants).
#[derive(Debug)]
pub struct LeaderWatch {
    client: LockClient,
    key: LockKey,
    /// The state last reported.
    seen: Option<Leader>,
    /// The highest term reported.
    last_term: Option<FencingToken>,
    started: bool,
}

impl LeaderWatch {
    /// The state [`changed`](Self::changed) reported last.
    pub fn current(&self) -> Option<&Leader> {
        self.seen.as_ref()
    }

    /// The current leader at the first call, then waits for the next change and answers
    /// it.
    ///
    /// # Errors
    ///
    /// Store errors as the backend reports them; the watch stays usable after one.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call reports nothing and loses nothing, the next call
    /// compares with the last state reported.
    pub async fn changed(&mut self) -> Result<Option<Leader>, LockError> {
        let mut pause = VACANT_POLL.0;
        loop {
            let now = self
                .client
                .inspect(self.key.as_str())
                .await?
                .map(Leader::from);
            if !self.started {
                self.started = true;
                return Ok(self.report(now));
            }
            match (&now, &self.seen) {
                (Some(leader), _) if self.last_term.is_none_or(|t| leader.term > t) => {
                    return Ok(self.report(now));
                }
                (None, Some(_)) => return Ok(self.report(None)),
                _ => {}
            }
            match &now {
                Some(leader) => {
                    let bound = leader
                        .remaining_ttl
                        .unwrap_or(HELD_RECHECK)
                        .min(HELD_RECHECK);
                    let waited = self
                        .client
                        .backend()
                        .wait_released(&self.key, &WaitHint::default(), u64::MAX, bound)
                        .await;
                    waited.map_err(|e| e.during(Operation::Inspect, &self.key))?;
                }
                None => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(VACANT_POLL.1);
                }
            }
        }
    }

    fn report(&mut self, now: Option<Leader>) -> Option<Leader> {
        if let Some(leader) = &now {
            self.last_term = Some(leader.term);
        }
        self.seen.clone_from(&now);
        now
    }
}
