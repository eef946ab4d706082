//! The Lua scripts that make each lock operation atomic in Redis.
//!
//! Public (but hidden from the docs) for driver-redlock, which runs the same scripts on
//! each of its instances; not a stable API.
//!
//! A lock is a string key holding `<owner token hex><mark><fencing token> <holder label>`
//! with a PX expiry. The mark is one byte at offset 32: a space, or `+` once a waiter has
//! asked to be told of the release ([`WATCH`]); [`RELEASE`] publishes only then, so a lock
//! nobody waits for is released without a `PUBLISH`. Every key a script touches is passed
//! in `KEYS` (the lock key, its fence key and its shared-lease keys, which share a hash
//! tag); lock keys and labels are data in `KEYS`/`ARGV`, never spliced into the script text.
//!
//! The Lua is in `src/store/`, a file per script, its contract (`KEYS`, `ARGV`, reply) on its
//! static here. A script that publishes starts with a prelude naming the command it
//! publishes with: `publish.lua` on one server, `spublish.lua` in its variant for a Redis
//! Cluster (see [`Lua::for_cluster`]).
//!
//! Shared claims (read-write locks and semaphores, [`CLAIM`]) live beside the lock in a
//! sorted set and a hash (see "Layout" below), read through the helpers of
//! `store/shared.lua`. The exclusive scripts check for them only where the lock alone
//! cannot answer (acquire of a free lock: one `EXISTS`; release, extend and inspect by an
//! owner that does not hold the lock), and take those keys as optional trailing `KEYS`:
//! without them a script behaves exactly as a lock-only one. Scripts are sent by EVALSHA and
//! loaded on a `NOSCRIPT` answer (after a restart or `SCRIPT FLUSH`) by [`redis::Script`].
//!
//! A lock re-granted to its owner, or renewed, keeps the later of its expiry and the new
//! TTL's: `store/regrant.lua`, in front of every script that does either.
//!
//! # Layout (all under the lock's hash tag, see `names.rs`)
//!
//! * `P{K}` — the exclusive lock (a string, as above): weight and
//!   capacity [`READ_WRITE_CAPACITY`](lockcore::driver::READ_WRITE_CAPACITY).
//! * `P{K}:leases` — a sorted set: member = owner token (32 hex digits), score = the
//!   lease's expiry in the server's `TIME`, in microseconds.
//! * `P{K}:claims` — a hash: `l:<owner>` = `<weight> <token> <label>` per lease; `cap` =
//!   the key's capacity; `rsv` = the reservation `<owner> <weight> <expiry µs> <since µs>`
//!   (`since`: when its request arrived, the server's time less how long the request had
//!   waited, see [`ClaimRequest::waited`](lockcore::driver::ClaimRequest::waited); absent
//!   in reservations written before it existed, which count as the latest arrivals);
//!   `rev` = the server time (µs) of the last change that may let a waiter in (a lease or
//!   reservation removed), which a refusal hands out as its
//!   [`WaitHint`](lockcore::driver::WaitHint) revision; `w` = set once a waiter watches the
//!   leases, so that releases publish.
//!
//! Both keys expire (`PEXPIREAT`) when the last lease or reservation does, and are deleted
//! when nothing lives, so idle keys vanish. Expired leases and reservations are pruned at
//! the start of every script that changes the set, and never count.
//!
//! Numbers: Redis runs Lua 5.1, whose numbers are doubles. Microsecond timestamps (about
//! 1.7e15) are exact in a double, but `tostring` prints only 14 significant digits, so
//! tokens are formatted with `string.format('%.0f', …)` and returned as strings.
//!
//! Acquire reads `TIME` before writing, which needs effects replication of scripts: the
//! default from Redis 5 on (older servers refuse the write with an error, they never
//! misbehave silently). Redis 5 or later (or Valkey) is required.

use std::sync::LazyLock;
use std::time::Duration;

use lockcore::driver::{AcquireOutcome, ClaimRequest, Contention, Grant, SetOutcome, WaitHint};
use lockcore::{Claim, FencingToken, LockError, LockInfo, LockKey};
use redis::{Cmd, Script, ScriptInvocation, Value};

use crate::error;
use crate::names::Names;

/// A script with its source kept, so that connecting loads every script in one pipelined
/// round trip (`redis::Script` keeps only the hash); its hash is computed once.
#[derive(Debug)]
pub struct Lua {
    source: &'static str,
    script: Script,
    /// The variant for a Redis Cluster, when the script publishes.
    cluster: Option<Box<Lua>>,
}

/// The text of a script: the files of `src/store/` named, in order.
macro_rules! lua_files {
    ($($file:literal),+ $(,)?) => {
        concat!($(include_str!(concat!("store/", $file))),+)
    };
}

/// A [`Lua`] script made of the files of `src/store/` named, in order, after the prelude
/// that says how it announces a release: `publish.lua` (`PUBLISH`) on a single server,
/// `spublish.lua` (`SPUBLISH`) in its variant for a Redis Cluster, where a sharded
/// `SPUBLISH` reaches only the subscribers of the shard that owns the channel's slot (the
/// lock's, by its hash tag) and a `PUBLISH` is copied to every node.
macro_rules! publishing {
    ($($file:literal),+ $(,)?) => {
        Lua::publishing(
            lua_files!("publish.lua", $($file),+),
            lua_files!("spublish.lua", $($file),+),
        )
    };
}

impl Lua {
    /// A script that publishes nothing: the same text on every topology.
    pub fn new(source: &'static str) -> Self {
        Lua {
            source,
            script: Script::new(source),
            cluster: None,
        }
    }

    /// A script that publishes: `single` for one server, `cluster` for a Redis Cluster.
    pub fn publishing(single: &'static str, cluster: &'static str) -> Self {
        Lua {
            cluster: Some(Box::new(Lua::new(cluster))),
            ..Lua::new(single)
        }
    }

    /// `SCRIPT LOAD` of this script.
    pub fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }

    /// This script, or its variant for a Redis Cluster when `cluster`.
    pub fn for_cluster(&self, cluster: bool) -> &Lua {
        match &self.cluster {
            Some(variant) if cluster => variant,
            _ => self,
        }
    }

    /// The script's text.
    pub fn source(&self) -> &'static str {
        self.source
    }
}

impl std::ops::Deref for Lua {
    type Target = Script;

    fn deref(&self) -> &Script {
        &self.script
    }
}

/// Take the lock if free; re-grant to the same owner (same token, expiry never shortened);
/// otherwise report the holder's remaining TTL. A free lock whose key has shared state
/// (`KEYS[4]` exists) is the exclusive claim of [`CLAIM`]: refused while
/// shared leases or another owner's reservation live (recording a reservation when leases
/// hold it), re-granted to an owner holding a shared lease, a capacity mismatch on a
/// semaphore.
///
/// `KEYS[1]` lock key, `KEYS[2]` fence key, optionally `KEYS[3]` leases and `KEYS[4]`
/// claims; `ARGV[1]` owner token (32 hex digits),
/// `ARGV[2]` TTL in ms, `ARGV[3]` holder label, `ARGV[4]` fence key TTL in ms, and
/// optionally `ARGV[5]` = `nofloor` to bump the fence without the `TIME` floor (a test-only
/// setting of driver-redlock, whose tests prove its max-register without the floor; empty
/// otherwise), then `ARGV[6]` how long the request has waited in µs and `ARGV[7]` its
/// mark's lifetime in ms when it asks to be next
/// ([`ClaimRequest::waited`](lockcore::driver::ClaimRequest::waited)): refused by
/// another owner's lock, it marks the key (the reservation in `KEYS[4]`) unless an earlier
/// arrival's mark lives; a free key marked by a later arrival is granted (the mark stays
/// for its owner). Without `ARGV[6]` the lock-only path is unchanged.
///
/// Returns `{1, token}` when granted, `{0, pttl}` when another owner holds it, `{0, ms, rev,
/// kept}` when shared leases or a reservation refuse it (`kept` 1 when the refusal recorded
/// the owner's reservation), `{-1, capacity}` on a semaphore's key.
pub static ACQUIRE: LazyLock<Lua> =
    LazyLock::new(|| publishing!("regrant.lua", "shared.lua", "acquire.lua"));

/// [`ACQUIRE`] of several locks in one step, all or nothing: each lock's claim by the text of
/// `acquire.lua` (wrapped as a function by `set_begin.lua` and `set_end.lua`), in the order
/// given; at the first refusal, the locks it granted fresh are deleted and the reservation
/// the refusal recorded is removed.
///
/// `KEYS` are (lock, fence, leases, claims) of each lock in turn, all in one Cluster slot;
/// `ARGV` the owner token, TTL in ms, holder label and fence key TTL in ms. Returns `{1,
/// token, ...}` with a token per lock, or `{flag, index, ...}`: lock `index` (from 1)
/// refused, with [`ACQUIRE`]'s reply after its flag.
pub static ACQUIRE_ALL: LazyLock<Lua> = LazyLock::new(|| {
    publishing!(
        "regrant.lua",
        "shared.lua",
        "set_begin.lua",
        "acquire.lua",
        "set_end.lua"
    )
});

/// Owner-checked delete, announcing the release on the lock's channel when a waiter marked
/// the lock ([`WATCH`]). An owner that does not hold the lock releases its shared lease, if
/// it has a live one (announced when a waiter marked the leases), or else its reservation
/// (left by a refused attempt whose answer was lost; the answer is still `0`, not held)
/// unless `ARGV[3]` is `keep` (driver-redlock undoing the grants of an attempt refused
/// overall, whose waiter keeps its reservations).
///
/// `KEYS[1]` lock key, optionally `KEYS[2]` leases and `KEYS[3]` claims; `ARGV[1]` owner
/// token, optionally `ARGV[2]` the message to publish on the release channel
/// `KEYS[1] .. ':released'` (default `1`; driver-redlock sends one
/// nonce per release to all its instances, so its waiters are woken once, not once per
/// instance). The channel is built here, only when needed, and the prefix is compared with
/// `string.find`, not a `string.sub` copy: the release is on every lock's path, so the
/// server should not pass an argument or copy a string it does not need. Returns 2 when
/// released and announced, 1 when released without an announcement (no waiter had marked
/// it: the releasing client wakes its own waiters, if any, itself), 0 when the owner did
/// not hold it.
pub static RELEASE: LazyLock<Lua> = LazyLock::new(|| publishing!("release.lua"));

/// Owner-checked renewal of the lock, or of the owner's shared lease: never creates one,
/// never shortens one.
///
/// `KEYS[1]` lock key, optionally `KEYS[2]` leases and `KEYS[3]` claims; `ARGV[1]` owner
/// token, `ARGV[2]` TTL in ms.
/// Returns `{1, token}` when renewed, `{0}` when the owner does not hold it.
pub static EXTEND: LazyLock<Lua> =
    LazyLock::new(|| publishing!("regrant.lua", "shared.lua", "extend.lua"));

/// [`EXTEND`] for many locks in one call: each renewal exactly as `EXTEND` does it, alone.
///
/// `KEYS` are (lock, leases, claims) of each lock in turn, `ARGV` its (owner, TTL in ms).
/// Returns one entry per lock: its token (a string) when renewed, `0` when not held.
pub static EXTEND_MANY: LazyLock<Lua> =
    LazyLock::new(|| publishing!("regrant.lua", "shared.lua", "extend_many.lua"));

/// The lock's value and remaining TTL, read atomically; without a lock, the newest live
/// shared lease.
///
/// `KEYS[1]` lock key, optionally `KEYS[2]` leases and `KEYS[3]` claims. Returns `{}` when
/// free, `{value, pttl}` when locked, `{weight, capacity, token, label, pttl, owner}` when
/// held by shared leases.
pub static INSPECT: LazyLock<Lua> = LazyLock::new(|| publishing!("shared.lua", "inspect.lua"));

/// A waiter's re-check after it subscribed to the release channel: the holder's remaining
/// TTL, marking the lock (offset 32 becomes `+`, expiry kept) so that its [`RELEASE`]
/// publishes. Marking and looking are one atomic step: a release after it announces itself,
/// a release before it leaves the key gone.
///
/// A claim refused by shared leases or a reservation passes the `rev` its refusal saw: the
/// re-check then answers "free" when anything was released, expired or abandoned since
/// (`rev` changed, or nothing lives), and otherwise marks the leases (`w`), so that their
/// releases publish, and answers the time until the first lease or reservation expires.
///
/// `KEYS[1]` lock key, optionally `KEYS[2]` leases and `KEYS[3]` claims; optionally
/// `ARGV[1]` the `rev` of the refusal, and `ARGV[2]` = `after` to count only a `rev` above
/// it as a change (driver-redlock, whose hint is the largest `rev` of several instances).
/// Returns the time to wait in ms (`-2` when free).
pub static WATCH: LazyLock<Lua> = LazyLock::new(|| publishing!("shared.lua", "watch.lua"));

/// Delete whoever holds it (operator break-lock): the lock, every shared lease and the
/// reservation, announcing the release.
///
/// `KEYS[1]` lock key, optionally `KEYS[2]` leases and `KEYS[3]` claims; `ARGV[1]` release
/// channel, optionally `ARGV[2]` the message to publish (default `1`). Returns 1 when a
/// live lock or lease was deleted.
pub static FORCE_RELEASE: LazyLock<Lua> = LazyLock::new(|| publishing!("force_release.lua"));

/// Redlock's fencing write-back (driver-redlock): raise the fence to `max(c, T)` (always:
/// raising it is safe even when the lock is gone) and store `T` in the owner's lock value
/// (keeping its expiry and its waiter mark), so a same-owner re-grant returns `T`. `T` is
/// stored with a leading `0` (`…+0T label`), which every reader parses as `T` and which
/// marks the copy as written back: a grant's own token never starts with `0`, so an
/// inspect can tell the holder's settled token from a copy still carrying its own.
///
/// An owner holding a shared lease instead of the lock gets `T` into the lease's data, marked
/// the same way (`weight 0T label`).
///
/// A copy whose own token is above `T` keeps it, unmarked: the write-back of `T` never
/// lowers a token. (A copy granted after the majority read a later `TIME`, and a late
/// write-back must not mark a copy a later grant made.) So a marked copy's token is never
/// below the token its instance granted it, which is what lets a same-owner re-grant keep a
/// token a majority carries marked.
///
/// `KEYS[1]` lock key, `KEYS[2]` fence key, optionally `KEYS[3]` claims; `ARGV[1]` owner
/// token, `ARGV[2]` `T` (decimal digits), `ARGV[3]` fence key TTL in ms. Returns 1 when
/// written (or already `0T`), 0 when the owner no longer holds the lock (or a lease) on
/// this instance or its copy's token is above `T`.
pub static WRITE_BACK: LazyLock<Lua> = LazyLock::new(|| Lua::new(lua_files!("write_back.lua")));

/// Take a shared claim (a reader, or permits of a semaphore): granted when the other
/// owners' live weights plus this weight plus another owner's live reservation fit the
/// capacity; re-granted to an owner that holds a lease (or the exclusive lock) already,
/// with its token, never shortening it. A grant takes the next token of the same fence as
/// the exclusive lock (`max(last + 1, now_us)`) and clears the owner's reservation; a
/// refusal records one (see the module docs).
///
/// `KEYS[1]` lock key, `KEYS[2]` fence key, `KEYS[3]` leases, `KEYS[4]` claims; `ARGV[1]`
/// owner token, `ARGV[2]` TTL in ms, `ARGV[3]` holder label, `ARGV[4]` fence key TTL in
/// ms, `ARGV[5]` weight, `ARGV[6]` capacity, optionally `ARGV[7]` = `nofloor` (as
/// [`ACQUIRE`]).
///
/// Returns `{1, token}` when granted; `{0, pttl}` when an exclusive lock holds the key;
/// `{0, ms until the first blocking expiry or -1, rev, kept}` when leases or a reservation
/// refuse it (`kept`: 1 when the refusal recorded the owner's reservation); `{-1, stored capacity}` when the key is held with another capacity.
pub static CLAIM: LazyLock<Lua> =
    LazyLock::new(|| publishing!("regrant.lua", "shared.lua", "claim.lua"));

/// Every live lease of a key: the exclusive lock's and each shared lease's.
///
/// `KEYS[1]` lock key, `KEYS[2]` leases, `KEYS[3]` claims. Returns a list of
/// `{weight, capacity, token, label, pttl, owner}`, unordered.
pub static INSPECT_ALL: LazyLock<Lua> =
    LazyLock::new(|| publishing!("shared.lua", "inspect_all.lua"));

/// A waiter gave up: remove its reservation (announcing the change, so the claims it held
/// back try again).
///
/// `KEYS[1]` lock key, `KEYS[2]` leases, `KEYS[3]` claims; `ARGV[1]` owner token,
/// optionally `ARGV[2]` the message to publish (default `1`). Returns 2 when a reservation
/// was removed and announced, 1 when removed without an announcement, 0 when the owner had
/// none.
pub static ABANDON: LazyLock<Lua> = LazyLock::new(|| publishing!("shared.lua", "abandon.lua"));

/// The grant script when fencing is off, where the plain `SET NX PX` of
/// [`unfenced_set`] was refused: the same `SET` again, then the same-owner re-grant of
/// [`ACQUIRE`] (same value layout, so release, extend and inspect are shared), without the
/// fence key and the `TIME` read. Its token is always 0.
///
/// `KEYS[1]` lock key; `ARGV[1]` owner token (32 hex digits), `ARGV[2]` TTL in ms,
/// `ARGV[3]` holder label. Returns `{1, token}` when granted, `{0, pttl}` when another
/// owner holds it.
pub static ACQUIRE_UNFENCED: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(lua_files!("regrant.lua", "acquire_unfenced.lua")));

/// The grant of an unfenced lock: `SET lock "<owner> 0 <label>" NX PX ttl`, one command and
/// no script; where it answers nil, [`unfenced_fallback`] re-grants to the same owner or
/// reports the holder's remaining TTL.
pub fn unfenced_set(lock: &str, owner_hex: &str, ttl_ms: u64, label: &str) -> Cmd {
    let mut value = String::with_capacity(owner_hex.len() + 3 + label.len());
    value.push_str(owner_hex);
    value.push_str(" 0 ");
    value.push_str(label);
    let mut set = redis::cmd("SET");
    set.arg(lock).arg(value).arg("NX").arg("PX").arg(ttl_ms);
    set
}

/// A call of [`ACQUIRE_UNFENCED`] for the lock key `lock`.
pub fn unfenced_fallback(
    lock: &str,
    owner_hex: &str,
    ttl_ms: u64,
    label: &str,
) -> ScriptInvocation<'static> {
    let mut invocation = ACQUIRE_UNFENCED.key(lock);
    invocation.arg(owner_hex).arg(ttl_ms).arg(label);
    invocation
}

/// A call of [`ACQUIRE`] (`claim` `None`) or [`CLAIM`] (the shared
/// claim's weight and capacity): the lock, fence, leases and claims keys of `names`, then
/// the owner token, TTL in ms, holder label and fence key TTL. The caller may add `nofloor`.
pub fn grant_call<'s>(
    script: &'s Script,
    names: &Names,
    owner_hex: &str,
    ttl_ms: u64,
    label: &str,
    claim: Option<&Claim>,
) -> ScriptInvocation<'s> {
    let mut invocation = script.key(&names.lock);
    invocation
        .key(names.fence())
        .key(names.leases())
        .key(names.claims())
        .arg(owner_hex)
        .arg(ttl_ms)
        .arg(label)
        .arg(fence_ttl_millis());
    if let Some(claim) = claim {
        invocation.arg(claim.weight()).arg(claim.capacity());
    }
    invocation
}

/// The longest TTL Redis is given: 24 hours.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// How long a fence key outlives the longest lock: long enough that an idle key's counter
/// is still there when a lock could still be held, short enough that fence keys of keys
/// no longer used do not pile up. After it expires, the `TIME` floor keeps tokens rising.
const FENCE_TTL: Duration = Duration::from_secs(3600);

/// A TTL in whole milliseconds, rounded up (Redis `PX` counts milliseconds).
pub fn ttl_millis(ttl: Duration) -> Result<u64, LockError> {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms)
        .ok()
        .filter(|ms| *ms > 0 && *ms <= MAX_TTL.as_millis() as u64)
        .ok_or_else(|| LockError::InvalidTtl {
            ttl,
            reason: format!("the redis backend accepts TTLs from 1 ms to {MAX_TTL:?}"),
        })
}

/// The fence key's TTL in ms: the longest lock TTL plus an hour.
pub fn fence_ttl_millis() -> u64 {
    (MAX_TTL + FENCE_TTL).as_millis() as u64
}

/// Every script, for loading them all at connect time.
pub fn all() -> [&'static Lua; 13] {
    [
        &ACQUIRE,
        &ACQUIRE_ALL,
        &ACQUIRE_UNFENCED,
        &RELEASE,
        &EXTEND,
        &EXTEND_MANY,
        &INSPECT,
        &WATCH,
        &FORCE_RELEASE,
        &WRITE_BACK,
        &CLAIM,
        &INSPECT_ALL,
        &ABANDON,
    ]
}

// Reading the scripts' replies and the lock value they store.

/// A string reply's text (bulk or simple), if it is UTF-8.
pub(crate) fn text(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// An integer reply (or a string holding one).
#[doc(hidden)]
pub fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        v => text(v)?.parse().ok(),
    }
}

/// A fencing token reply (a string of digits, or an integer).
#[doc(hidden)]
pub fn as_token(v: &Value) -> Option<FencingToken> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok().map(FencingToken),
        v => text(v)?.parse().ok().map(FencingToken),
    }
}

/// Whether a token reply carries Redlock's written-back mark: the fencing write-back stores
/// `T` as `0T` (in a lock value and in a shared lease's data alike), and a grant's own
/// token never starts with `0` (an unfenced lock's token is `0` itself, one digit).
#[doc(hidden)]
pub fn written_back(token: &Value) -> bool {
    text(token).is_some_and(|digits| digits.len() > 1 && digits.starts_with('0'))
}

/// A PTTL answer as a remaining TTL: `None` for "no expiry" or "no key".
#[doc(hidden)]
pub fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

/// The answer of the acquire or claim script (see [`ACQUIRE`](crate::store::ACQUIRE) and
/// [`CLAIM`](crate::store::CLAIM)) to `claim` on `key` for `ttl`: granted, held
/// (with the `rev` the refusal saw as the wait hint), or the capacity mismatch error.
#[doc(hidden)]
pub fn acquire_outcome(
    reply: &[Value],
    key: &LockKey,
    claim: &Claim,
    ttl: Duration,
) -> Result<AcquireOutcome, LockError> {
    match reply {
        [flag, token] if as_int(flag) == Some(1) => {
            let token = as_token(token).ok_or_else(|| error::unexpected("acquire token"))?;
            Ok(AcquireOutcome::Acquired(Grant::new(token, ttl)))
        }
        [flag, pttl] if as_int(flag) == Some(0) => Ok(AcquireOutcome::Held(Contention::new(
            as_int(pttl).and_then(remaining),
        ))),
        [flag, wait, rev, kept] if as_int(flag) == Some(0) => {
            let hint = as_int(rev)
                .map_or(WaitHint::none(), WaitHint::at_revision)
                .with_reservation(as_int(kept) == Some(1));
            Ok(AcquireOutcome::Held(
                Contention::new(as_int(wait).and_then(remaining)).with_hint(hint),
            ))
        }
        [flag, capacity] if as_int(flag) == Some(-1) => {
            let stored = as_int(capacity)
                .and_then(|c| u64::try_from(c).ok())
                .ok_or_else(|| error::unexpected("stored capacity"))?;
            Err(LockError::capacity_mismatch(key, stored, claim))
        }
        _ => Err(error::unexpected("acquire reply")),
    }
}

/// The answer of [`ACQUIRE_ALL`] to `requests`, each for `ttl`: a grant per request, or the
/// refusal of one of them.
#[doc(hidden)]
pub fn set_outcome(
    reply: &[Value],
    requests: &[ClaimRequest<'_>],
    ttl: Duration,
) -> Result<SetOutcome, LockError> {
    let unexpected = || error::unexpected("set acquire reply");
    let (flag, rest) = reply.split_first().ok_or_else(unexpected)?;
    if as_int(flag) == Some(1) {
        if rest.len() != requests.len() {
            return Err(unexpected());
        }
        let grants = rest.iter().map(|token| {
            let token = as_token(token).ok_or_else(unexpected)?;
            Ok(Grant::new(token, ttl))
        });
        return grants
            .collect::<Result<_, LockError>>()
            .map(SetOutcome::Acquired);
    }
    let (index, refusal) = rest.split_first().ok_or_else(unexpected)?;
    let index = as_int(index)
        .and_then(|i| usize::try_from(i).ok()?.checked_sub(1))
        .filter(|i| *i < requests.len())
        .ok_or_else(unexpected)?;
    let request = &requests[index];
    let one: Vec<Value> = std::iter::once(flag).chain(refusal).cloned().collect();
    match acquire_outcome(&one, request.key, &request.claim, ttl)? {
        AcquireOutcome::Held(contention) => Ok(SetOutcome::Held { index, contention }),
        AcquireOutcome::Acquired(_) => Err(unexpected()),
    }
}

/// One lease as the inspect scripts list it: `{weight, capacity, token, label, pttl,
/// owner}`, without its owner token (see [`lease_owner`]).
#[doc(hidden)]
pub fn inspected(entry: &[Value]) -> Option<LockInfo> {
    let [weight, capacity, token, label, pttl, _owner] = entry else {
        return None;
    };
    let weight = u64::try_from(as_int(weight)?).ok()?;
    let capacity = u64::try_from(as_int(capacity)?).ok()?;
    let claim = Claim::from_parts(weight, capacity)?;
    let label = match label {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => return None,
    };
    Some(LockInfo::new(label, as_token(token)?, as_int(pttl).and_then(remaining)).with_claim(claim))
}

/// The owner token (hex) of a lease as the inspect scripts list it: for driver-redlock,
/// which groups an owner's copies on its instances by it; never shown to a user.
#[doc(hidden)]
pub fn lease_owner(entry: &[Value]) -> Option<String> {
    match entry.get(5)? {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// The token and label in a lock value `<owner hex><mark><token> <label>` (the mark is a
/// space, or `+` once a waiter watches it).
#[doc(hidden)]
pub fn parse_value(value: &[u8]) -> Option<(FencingToken, String)> {
    let (owner, rest) = (value.get(..32)?, value.get(32..)?);
    let (mark, rest) = rest.split_first()?;
    if !owner.iter().all(u8::is_ascii_hexdigit) || !matches!(mark, b' ' | b'+') {
        return None;
    }
    let rest = std::str::from_utf8(rest).ok()?;
    let (token, label) = rest.split_once(' ').unwrap_or((rest, ""));
    Some((FencingToken(token.parse().ok()?), label.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `source` names the command `command` as a Lua string.
    fn names(source: &str, command: &str) -> bool {
        source.contains(&format!("'{command}'")) || source.contains(&format!("\"{command}\""))
    }

    #[test]
    fn every_variant_publishes_as_its_topology_needs() {
        for script in crate::store::all() {
            let (single, cluster) = (script.for_cluster(false), script.for_cluster(true));
            assert!(std::ptr::eq(single, script));
            assert!(!names(single.source, "SPUBLISH"), "{}", single.source);
            assert!(!names(cluster.source, "PUBLISH"), "{}", cluster.source);
            // A script that publishes does so through the prelude's `PUBLISH`, which each
            // variant sets; one that does not has one text for both.
            let publishes = script.source.contains("redis.call(PUBLISH,");
            assert_eq!(
                publishes,
                !std::ptr::eq(single, cluster),
                "{}",
                single.source
            );
            if publishes {
                assert!(names(single.source, "PUBLISH"), "{}", single.source);
                assert!(names(cluster.source, "SPUBLISH"), "{}", cluster.source);
                assert_ne!(single.get_hash(), cluster.get_hash());
            }
            assert_eq!(script.get_hash(), Script::new(script.source).get_hash());
        }
    }
}

#[cfg(test)]
mod reply_tests {
    use super::*;

    #[test]
    fn values_parse() {
        let owner = "0123456789abcdef0123456789abcdef";
        for mark in [' ', '+'] {
            let value = format!("{owner}{mark}1700000000123456 host/1 task");
            let (t, l) = parse_value(value.as_bytes()).unwrap();
            assert_eq!(t, FencingToken(1_700_000_000_123_456));
            assert_eq!(l, "host/1 task");
        }
        assert!(parse_value(format!("{owner}*17 x").as_bytes()).is_none());
        assert!(parse_value(b"garbage").is_none());
        assert!(parse_value(b"0123 1700000000123456 host/1 task").is_none());
    }
}

#[cfg(test)]
mod ttl_tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_micros(1)).unwrap(), 1);
        assert_eq!(ttl_millis(Duration::from_micros(1500)).unwrap(), 2);
        assert_eq!(ttl_millis(Duration::from_secs(3)).unwrap(), 3000);
        assert!(ttl_millis(Duration::ZERO).is_err());
        assert!(ttl_millis(Duration::MAX).is_err());
    }
}
