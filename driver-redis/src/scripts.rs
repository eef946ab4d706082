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
//! Shared claims (see [`claim_scripts`](crate::claim_scripts)) live beside the lock in a
//! sorted set and a hash. The exclusive scripts check for them only where the lock alone
//! cannot answer (acquire of a free lock: one `EXISTS`; release, extend and inspect by an
//! owner that does not hold the lock), and take those keys as optional trailing `KEYS`:
//! without them a script behaves exactly as a lock-only one. Scripts are sent by EVALSHA and
//! loaded on a `NOSCRIPT` answer (after a restart or `SCRIPT FLUSH`) by [`redis::Script`].
//!
//! Numbers: Redis runs Lua 5.1, whose numbers are doubles. Microsecond timestamps (about
//! 1.7e15) are exact in a double, but `tostring` prints only 14 significant digits, so
//! tokens are formatted with `string.format('%.0f', …)` and returned as strings.
//!
//! Acquire reads `TIME` before writing, which needs effects replication of scripts: the
//! default from Redis 5 on (older servers refuse the write with an error, they never
//! misbehave silently). Redis 5 or later (or Valkey) is required.

use std::sync::LazyLock;

use lockcore::Claim;
use redis::{Cmd, Script, ScriptInvocation};

pub use crate::lua::Lua;

use crate::capabilities::fence_ttl_millis;
use crate::claim_scripts::{self, shared_lua};
use crate::names::Names;

/// Take the lock if free; re-grant to the same owner (same token, expiry never shortened);
/// otherwise report the holder's remaining TTL. A free lock whose key has shared state
/// (`KEYS[4]` exists) is the exclusive claim of [`claim_scripts::CLAIM`]: refused while
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
pub static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        r"
local v = redis.call('GET', KEYS[1])
if v then
  if string.sub(v, 1, 32) == ARGV[1] then
    local ttl = tonumber(ARGV[2])
    if redis.call('PTTL', KEYS[1]) < ttl then
      redis.call('PEXPIRE', KEYS[1], ttl)
    end
    return {1, string.match(v, '^%x+[ +](%d+)')}
  end
  if ARGV[6] and KEYS[4] then
    -- A long wait marks the key as its next turn unless an earlier arrival's mark lives.
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local since = now - tonumber(ARGV[6])
    local r = redis.call('HGET', KEYS[4], 'rsv')
    local o, e, s
    if r then
      o, e, s = string.match(r, '^(%x+) %d+ (%d+) ?(%d*)$')
    end
    local live = o and tonumber(e) > now
    if not live or o == ARGV[1] or since < (tonumber(s) or math.huge) then
      if live and o == ARGV[1] and tonumber(s) and tonumber(s) < since then
        since = tonumber(s)
      end
      local f = '%.0f'
      local mark = tonumber(ARGV[7])
      redis.call('HSETNX', KEYS[4], 'rev', string.format(f, now))
      redis.call('HSET', KEYS[4], 'rsv', ARGV[1] .. ' 4294967295 ' .. string.format(f, now + mark * 1000) .. ' ' .. string.format(f, since), 'cap', '4294967295')
      if redis.call('PTTL', KEYS[4]) < mark then
        redis.call('PEXPIRE', KEYS[4], mark + 1)
      end
    end
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
if KEYS[4] and redis.call('EXISTS', KEYS[4]) == 1 then
  local LOCK, LEASES, CLAIMS = KEYS[1], KEYS[3], KEYS[4]
",
        shared_lua!(),
        r"
  local now = clock()
  local expiry = now + tonumber(ARGV[2]) * 1000
  local since = nil
  if ARGV[6] then
    since = now - tonumber(ARGV[6])
    expiry = now + tonumber(ARGV[7]) * 1000
  end
  local live, rsv = prune(now)
  if live > 0 or rsv then
    local cap = tonumber(redis.call('HGET', CLAIMS, 'cap')) or MAXCAP
    if cap ~= MAXCAP then
      settle()
      return {-1, num(cap)}
    end
    local held = renew(ARGV[1], now + tonumber(ARGV[2]) * 1000)
    if held then
      settle()
      return {1, held}
    end
    if live > 0 then
      return refused(now, rsv, ARGV[1], reserve(rsv, ARGV[1], MAXCAP, MAXCAP, expiry, now, since))
    end
    if rsv[1] == ARGV[1] then
      redis.call('HDEL', CLAIMS, 'rsv')
      announce(now, '1')
    elseif not earlier(since, rsv) then
      return refused(now, rsv, ARGV[1], 0)
    end
  end
  settle()
end
local token = (tonumber(redis.call('GET', KEYS[2]) or '0') or 0) + 1
if ARGV[5] ~= 'nofloor' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if now > token then
    token = now
  end
end
local s = string.format('%.0f', token)
redis.call('SET', KEYS[2], s, 'PX', ARGV[4])
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. s .. ' ' .. ARGV[3], 'PX', ARGV[2])
return {1, s}
"
    ))
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
/// instance). The channel is built here, only when needed: one argument less and a prefix
/// comparison by `string.find` instead of a `string.sub` copy cost the server 8% less per
/// release. Returns 2 when released and announced, 1 when released without an announcement (no
/// waiter had marked it: the releasing client wakes its own waiters, if any, itself), 0 when
/// the owner did not hold it.
pub static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local v = redis.call('GET', KEYS[1])
if v and #ARGV[1] == 32 and string.find(v, ARGV[1], 1, true) == 1 then
  redis.call('DEL', KEYS[1])
  if string.byte(v, 33) == 43 then
    redis.call('PUBLISH', KEYS[1] .. ':released', ARGV[2] or '1')
    return 2
  end
  return 1
end
-- Not the lock's owner: its shared lease, if any. Kept short (no pruning, no new expiry:
-- a release only shortens what the keys must outlive), as it is every reader's release.
-- An owner without a lease may have left a reservation (a refused attempt whose answer was
-- lost, compensated by this release): it goes too.
if not KEYS[3] then
  return 0
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
local released = 0
if score then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], 'l:' .. ARGV[1])
elseif ARGV[3] == 'keep' then
  return 0
else
  local r = redis.call('HGET', KEYS[3], 'rsv')
  if not r or string.find(r, ARGV[1], 1, true) ~= 1 then
    return 0
  end
  redis.call('HDEL', KEYS[3], 'rsv')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('HSET', KEYS[3], 'rev', string.format('%.0f', now))
local watched = redis.call('HEXISTS', KEYS[3], 'w') == 1
if watched then
  redis.call('PUBLISH', KEYS[1] .. ':released', ARGV[2] or '1')
end
if score and tonumber(score) > now then
  released = watched and 2 or 1
end
if redis.call('ZCARD', KEYS[2]) == 0 and redis.call('HEXISTS', KEYS[3], 'rsv') == 0 then
  redis.call('DEL', KEYS[2], KEYS[3])
elseif redis.call('PTTL', KEYS[3]) < 0 then
  -- The hash had expired before the set (never within one millisecond): same end as the set.
  redis.call('PEXPIRE', KEYS[3], math.max(redis.call('PTTL', KEYS[2]), 1))
end
return released
",
    )
});

/// Owner-checked renewal of the lock, or of the owner's shared lease: never creates one,
/// never shortens one.
///
/// `KEYS[1]` lock key, optionally `KEYS[2]` leases and `KEYS[3]` claims; `ARGV[1]` owner
/// token, `ARGV[2]` TTL in ms.
/// Returns `{1, token}` when renewed, `{0}` when the owner does not hold it.
pub static EXTEND: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then
  local ttl = tonumber(ARGV[2])
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return {1, string.match(v, '^%x+[ +](%d+)')}
end
if not KEYS[3] or redis.call('EXISTS', KEYS[3]) == 0 then
  return {0}
end
local LOCK, LEASES, CLAIMS = KEYS[1], KEYS[2], KEYS[3]
",
        shared_lua!(),
        r"
local now = clock()
prune(now)
local token = renew(ARGV[1], now + tonumber(ARGV[2]) * 1000)
settle()
if token then
  return {1, token}
end
return {0}
"
    ))
});

/// [`EXTEND`] for many locks in one call: each renewal exactly as `EXTEND` does it, alone.
///
/// `KEYS` are (lock, leases, claims) of each lock in turn, `ARGV` its (owner, TTL in ms).
/// Returns one entry per lock: its token (a string) when renewed, `0` when not held.
pub static EXTEND_MANY: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        r"
local LOCK, LEASES, CLAIMS
",
        shared_lua!(),
        r"
local out = {}
local now = nil
for i = 1, #ARGV / 2 do
  LOCK, LEASES, CLAIMS = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local owner, ttl = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local v = redis.call('GET', LOCK)
  out[i] = 0
  if v and string.sub(v, 1, 32) == owner then
    if redis.call('PTTL', LOCK) < ttl then
      redis.call('PEXPIRE', LOCK, ttl)
    end
    out[i] = string.match(v, '^%x+[ +](%d+)')
  elseif redis.call('EXISTS', CLAIMS) == 1 then
    now = now or clock()
    prune(now)
    local token = renew(owner, now + ttl * 1000)
    settle()
    if token then
      out[i] = token
    end
  end
end
return out
"
    ))
});

/// The lock's value and remaining TTL, read atomically; without a lock, the newest live
/// shared lease.
///
/// `KEYS[1]` lock key, optionally `KEYS[2]` leases and `KEYS[3]` claims. Returns `{}` when
/// free, `{value, pttl}` when locked, `{weight, capacity, token, label, pttl, owner}` when
/// held by shared leases.
pub static INSPECT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        r"
local v = redis.call('GET', KEYS[1])
if v then
  return {v, redis.call('PTTL', KEYS[1])}
end
if not KEYS[3] or redis.call('EXISTS', KEYS[3]) == 0 then
  return {}
end
local LOCK, LEASES, CLAIMS = KEYS[1], KEYS[2], KEYS[3]
",
        shared_lua!(),
        r"
local newest = {}
for _, e in ipairs(entries(clock())) do
  if not newest[3] or tonumber(e[3]) > tonumber(newest[3]) then
    newest = e
  end
end
return newest
"
    ))
});

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
pub static WATCH: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        r"
local v = redis.call('GET', KEYS[1])
if v and string.byte(v, 33) == 32 then
  redis.call('SETRANGE', KEYS[1], 32, '+')
end
if not KEYS[3] or not ARGV[1] then
  if not v then
    return -2
  end
  return redis.call('PTTL', KEYS[1])
end
local LOCK, LEASES, CLAIMS = KEYS[1], KEYS[2], KEYS[3]
",
        shared_lua!(),
        r"
local now = clock()
local live, rsv = prune(now)
settle()
local rev = redis.call('HGET', CLAIMS, 'rev')
if not rev or (ARGV[2] == 'after' and tonumber(rev) > tonumber(ARGV[1])) or (ARGV[2] ~= 'after' and rev ~= ARGV[1]) then
  return -2
end
redis.call('HSET', CLAIMS, 'w', '1')
local wait = nil
if v then
  wait = redis.call('PTTL', LOCK)
end
local first = redis.call('ZRANGE', LEASES, 0, 0, 'WITHSCORES')
if first[2] then
  local left = ms(tonumber(first[2]) - now)
  if not wait or left < wait then
    wait = left
  end
end
if rsv then
  local left = ms(rsv[3] - now)
  if not wait or left < wait then
    wait = left
  end
end
return wait or -2
"
    ))
});

/// Delete whoever holds it (operator break-lock): the lock, every shared lease and the
/// reservation, announcing the release.
///
/// `KEYS[1]` lock key, optionally `KEYS[2]` leases and `KEYS[3]` claims; `ARGV[1]` release
/// channel, optionally `ARGV[2]` the message to publish (default `1`). Returns 1 when a
/// live lock or lease was deleted.
pub static FORCE_RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local freed = redis.call('DEL', KEYS[1])
local deleted = freed
if KEYS[3] then
  local t = redis.call('TIME')
  local now = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  if redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf') > 0 then
    freed = 1
  end
  deleted = deleted + redis.call('DEL', KEYS[2], KEYS[3])
end
if deleted > 0 then
  redis.call('PUBLISH', ARGV[1], ARGV[2] or '1')
end
return freed
",
    )
});

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
pub static WRITE_BACK: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local c = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if tonumber(ARGV[2]) > c then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 32) ~= ARGV[1] then
  local d = KEYS[3] and redis.call('HGET', KEYS[3], 'l:' .. ARGV[1])
  local weight, held, rest = string.match(d or '', '^(%d+) (%d+) (.*)$')
  if not weight or tonumber(held) > tonumber(ARGV[2]) then
    return 0
  end
  redis.call('HSET', KEYS[3], 'l:' .. ARGV[1], weight .. ' 0' .. ARGV[2] .. ' ' .. rest)
  return 1
end
local mark, token, label = string.match(v, '^%x+([ +])(%d+) (.*)$')
if token and tonumber(token) > tonumber(ARGV[2]) then
  return 0
end
if token ~= '0' .. ARGV[2] then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl > 0 then
    redis.call('SET', KEYS[1], ARGV[1] .. (mark or ' ') .. '0' .. ARGV[2] .. ' ' .. (label or ''), 'PX', pttl)
  end
end
return 1
",
    )
});

/// The grant script when fencing is off, where the plain `SET NX PX` of
/// [`unfenced_set`] was refused: the same `SET` again, then the same-owner re-grant of
/// [`ACQUIRE`] (same value layout, so release, extend and inspect are shared), without the
/// fence key and the `TIME` read. Its token is always 0.
///
/// `KEYS[1]` lock key; `ARGV[1]` owner token (32 hex digits), `ARGV[2]` TTL in ms,
/// `ARGV[3]` holder label. Returns `{1, token}` when granted, `{0, pttl}` when another
/// owner holds it.
pub static ACQUIRE_UNFENCED: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
if redis.call('SET', KEYS[1], ARGV[1] .. ' 0 ' .. ARGV[3], 'NX', 'PX', ARGV[2]) then
  return {1, '0'}
end
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then
  local ttl = tonumber(ARGV[2])
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return {1, string.match(v, '^%x+[ +](%d+)')}
end
return {0, redis.call('PTTL', KEYS[1])}
",
    )
});

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

/// An `EVALSHA` of `script` ([`RELEASE`] or its sharded twin) for the owner whose token's hex digits are `owner_hex`, on
/// the keys of `names`, written into one command buffer: every release sends it, and a
/// `ScriptInvocation` allocates each key and argument, then copies them into a command.
pub fn release_call(script: &Lua, names: &Names, owner_hex: &[u8]) -> Cmd {
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha.arg(script.get_hash()).arg(3).arg(&names.lock);
    let mut name = String::with_capacity(names.lock.len() + 8);
    name.push_str(&names.lock);
    name.push_str(":leases");
    evalsha.arg(&name);
    name.truncate(names.lock.len());
    name.push_str(":claims");
    evalsha.arg(&name).arg(owner_hex);
    evalsha
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

/// A call of [`ACQUIRE`] (`claim` `None`) or [`CLAIM`](claim_scripts::CLAIM) (the shared
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

/// Every script, for loading them all at connect time.
pub fn all() -> [&'static Lua; 12] {
    [
        &ACQUIRE,
        &ACQUIRE_UNFENCED,
        &RELEASE,
        &EXTEND,
        &EXTEND_MANY,
        &INSPECT,
        &WATCH,
        &FORCE_RELEASE,
        &WRITE_BACK,
        &claim_scripts::CLAIM,
        &claim_scripts::INSPECT_ALL,
        &claim_scripts::ABANDON,
    ]
}
