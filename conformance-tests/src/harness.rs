//! What a backend provides to run the suite: clients of one store, a TTL scale, and fault
//! hooks.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::{LockClient, LockError, LockKey};

/// A store under test, as the scenarios see it.
///
/// Every scenario builds its own harness (through the factory given to [`suite!`]) and
/// works under a fresh random key prefix, so scenarios can share one server and run in
/// parallel.
///
/// [`suite!`]: crate::suite
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A new client of the shared store, independent of every other client (its own
    /// connections, its own reentrancy state), as a client in another process would be.
    async fn client(&self) -> Result<LockClient, LockError>;

    /// The TTL unit the scenarios scale from. At least the backend's minimum TTL, and long
    /// enough that a round trip is a small fraction of it: a backend with a 2-second
    /// minimum (etcd) passes with `2s`, only slower.
    fn ttl(&self) -> Duration;

    /// A store of its own for one fault scenario, never shared with scenarios running in
    /// parallel, with hooks to stop and restart it and to disturb each client's link.
    ///
    /// `Ok(None)` means the harness implements no fault hooks: declare `faults: false` to
    /// [`suite!`](crate::suite) and the fault scenarios are listed as ignored. Every
    /// in-tree harness implements them.
    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        Ok(None)
    }
}

/// A store started for one fault scenario.
#[async_trait]
pub trait FaultStore: Send + Sync {
    /// A new client whose connections go through a [`FaultLink`] of its own.
    async fn client(&self) -> Result<FaultClient, LockError>;

    /// Stops the store: its process is gone and new connections are refused.
    ///
    /// # Errors
    ///
    /// When the store could not be stopped; the scenario fails with the error.
    async fn stop(&self) -> Result<(), LockError>;

    /// Starts the store again at the same address and returns once it serves requests.
    /// What survives a restart is the store's business (usually nothing).
    ///
    /// # Errors
    ///
    /// When the store did not come back; the scenario fails with the error.
    async fn start(&self) -> Result<(), LockError>;

    /// Restarts the store the way `how` says, and returns once it serves requests again:
    /// `Ok(false)` when the store cannot be restarted that way (an etcd member keeps its
    /// data; a store without persistence loses it), and the scenarios skip that restart.
    ///
    /// Unlike [`stop`](Self::stop) and [`start`](Self::start), whose effect on the data is
    /// the store's business, this says what survives: with [`Restart::KeepData`] every lock
    /// held before is held after (a clean shutdown and start, a durable store's crash); with
    /// [`Restart::LoseData`] nothing is (a store without persistence, a restore from an
    /// empty backup).
    ///
    /// # Errors
    ///
    /// When the store did not stop or did not come back.
    async fn restart(&self, how: Restart) -> Result<bool, LockError> {
        let _ = how;
        Ok(false)
    }

    /// Changes `key`'s lock record behind the driver's back, the way an operator or
    /// another program would with the store's own tools (`redis-cli DEL`, an SQL
    /// `DELETE`, `etcdctl del`): not through the driver, and leaving everything else of
    /// the driver's (leases, sessions, fence counters) as it is.
    ///
    /// The default answers a `Config` error naming the missing hook, so a scenario that
    /// needs it fails with that message rather than passing unchecked. Every in-tree fault
    /// store implements it.
    ///
    /// # Errors
    ///
    /// When the store refused the change, or the hook is not implemented.
    async fn tamper(&self, key: &LockKey, how: Tamper) -> Result<(), LockError> {
        let _ = key;
        Err(LockError::config(format!(
            "this fault store cannot tamper with a lock record ({how:?}): implement \
             FaultStore::tamper with the store's own tools"
        )))
    }

    /// Sets the time zone of the store's sessions to `minutes` east of UTC (negative:
    /// west), for sessions opened from now on: what a statement that reads the local time
    /// sees (MySQL's `NOW()`, PostgreSQL's `localtimestamp` and casts to `timestamp`),
    /// while the store's true clock stays where it is. A driver that writes an expiry by
    /// one clock and judges it by the other shows it as a lock that expires hours early or
    /// late. `0` sets UTC back.
    ///
    /// `Ok(false)` when the store's sessions have no time zone to set (Redis, etcd, SQLite,
    /// a store in this process): the scenarios then check the zone-free part only. The
    /// in-tree fault stores of MySQL/MariaDB and PostgreSQL implement it.
    ///
    /// # Errors
    ///
    /// When the store refused the setting.
    async fn set_time_zone(&self, minutes: i32) -> Result<bool, LockError> {
        let _ = minutes;
        Ok(false)
    }

    /// How long a new connection to this store may take to open on a loaded machine, on
    /// top of any delay its link adds: TCP, TLS, authentication, the session's setup.
    ///
    /// [`hold_survives_slow_reconnect`](crate::scenarios::hold_survives_slow_reconnect)
    /// gives a connection that a renewal stopped waiting for a third of its TTL, less
    /// 50 ms, to open before the next attempt gives up too; it lengthens that TTL (3 ×
    /// [`Harness::ttl`]) to leave at least this long. The default, zero, adds nothing: say
    /// more for a store whose handshake is expensive (a password hashed thousands of times)
    /// or whose scenarios each start a server of their own, which slows every handshake
    /// while the suite runs in parallel on a small machine.
    fn connect_allowance(&self) -> Duration {
        Duration::ZERO
    }
}

/// A change made to a lock's record behind the driver's back: see [`FaultStore::tamper`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Tamper {
    /// Deletes the record that says who holds the key (every lease of it, for a key held
    /// by shared claims) — only that: a lease, session or fence counter the driver keeps
    /// beside it stays, so a driver that trusts a live lease alone, or keeps its fence in
    /// the record, shows it.
    Delete,
    /// Makes the record name another holder, one the driver never issued (another program
    /// taking the key outside the lock protocol): the holder's own lease or session stays
    /// alive and the fence state stays as it is. Where the record can be edited in place
    /// (Redis values, SQL rows, in-process stores) its token and expiry are kept and only
    /// the owner changes; where a store knows a record's holder by its creation (etcd's
    /// create revision and lease), the key is deleted and created again by the stranger,
    /// with a lease of its own that lasts at most as long as the holder's had left.
    Reassign,
    /// Writes the record again with the content it has (`SET … KEEPTTL` of the same value,
    /// an `UPDATE` setting the same columns, an etcd `put` of the same value on the same
    /// lease): nothing about the lock changes, but modification revisions and row versions
    /// do, so a driver that takes its token or its ownership check from those shows it.
    Rewrite,
}

/// A client of a [`FaultStore`] and the link it talks through.
pub struct FaultClient {
    /// The client.
    pub client: LockClient,
    /// Its link to the store.
    pub link: Arc<dyn FaultLink>,
}

/// One client's link to the store, which a scenario can disturb.
#[async_trait]
pub trait FaultLink: Send + Sync {
    /// Holds every message in both directions until [`resume`](Self::resume): the client
    /// looks paused (a GC pause, a frozen VM) or partitioned to the store.
    async fn pause(&self);

    /// Delivers what was held and lets traffic flow again.
    async fn resume(&self);

    /// Delays every answer from the store by `delay` (zero to stop): the store applies a
    /// request at once, the client hears of it late.
    async fn delay_answers(&self, delay: Duration);

    /// From now on, holds each new connection back `delay` before it reaches the store
    /// (zero to stop), as TLS and authentication to a distant store on a loaded machine
    /// would: the client's connections already open are not slowed.
    ///
    /// `false` when the link carries no connections (a store inside the process, the
    /// default): the scenarios that need it then say so and check nothing more. Every
    /// in-tree link to a networked store implements it ([`TcpProxy`](crate::TcpProxy)
    /// does).
    async fn slow_connects(&self, delay: Duration) -> bool {
        let _ = delay;
        false
    }

    /// Closes every connection the link carries, both ends, as a network fault or an idle
    /// timeout of a proxy or the server would: the client must open new ones (new
    /// connections are let through).
    ///
    /// `false` when the link carries no connections (the default), as for
    /// [`slow_connects`](Self::slow_connects).
    async fn cut(&self) -> bool {
        false
    }
}

/// What survives a [`FaultStore::restart`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Restart {
    /// Everything the store held: locks, fence counters, sessions' records.
    KeepData,
    /// Nothing: the store comes back empty.
    LoseData,
}
