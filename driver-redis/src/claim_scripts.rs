//! The Lua of shared claims (read-write locks and semaphores): helpers over a key's set of
//! shared leases, and the claim, inspect-all and abandon scripts. The exclusive scripts in
//! [`scripts`](crate::scripts) embed the same helpers in their slow paths, which run only
//! when shared state exists, so the exclusive lock's fast path is unchanged.
//!
//! Public (but hidden from the docs) for driver-redlock; not a stable API.
//!
//! # Layout (all under the lock's hash tag, see `names.rs`)
//!
//! * `P{K}` — the exclusive lock (a string, see [`scripts`](crate::scripts)): weight and
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
//! Numbers: Lua 5.1 numbers are doubles; µs timestamps and tokens are exact in them but
//! `tostring` (and `..`) prints 14 digits, so every number stored or compared as text is
//! formatted with `num` (`%.0f`).

use std::sync::LazyLock;

use crate::lua::Lua;

/// The helpers every shared-claim script runs, as Lua text (a macro, so scripts can
/// `concat!` it). The script must first define `LOCK`, `LEASES` and `CLAIMS` (the key
/// names) as locals.
///
/// * `prune(now)` removes expired leases (and their data) and an expired reservation,
///   stamping `rev`; returns the number of live leases and the live reservation
///   `{owner, weight, expiry, since}` (`since` may be `nil`) or `nil`.
/// * `settle()` sets both keys to expire with the last lease or reservation, or deletes
///   them when nothing lives.
/// * `announce(now, message)` stamps `rev` and publishes on the release channel when a
///   waiter marked the leases: 2 when published, 1 when not.
/// * `renew(owner, expiry)` re-grants `owner`'s live lease (never shortening it): its
///   token, or `nil` when it holds none.
/// * `used(cap, live)` the live leases' total weight (readers weigh 1 each).
/// * `earlier(since, rsv)` whether a request that arrived at `since` (`nil`: one that did
///   not say) arrived before the reservation's.
/// * `reserve(rsv, owner, weight, cap, expiry, now, since)` records or refreshes `owner`'s
///   reservation unless another owner's lives that arrived no later (`since` `nil`: a
///   request that did not say, which displaces nobody and is recorded as arriving now); a
///   refreshed reservation keeps its earliest arrival; returns 1 when it did, else 0.
/// * `refused(now, rsv, owner, kept)` the reply of a refused claim: `{0, ms until the first
///   lease (or the other owner's reservation) expires or -1, rev, kept}`, `kept` 1 when the
///   refusal recorded or refreshed the owner's reservation (`reserve`'s answer), else 0.
/// * `entries(now)` every live shared lease as `{weight, cap, token, label, pttl, owner}`
///   (the owner token goes no further than the driver: driver-redlock groups an owner's
///   copies by it, and no `LockInfo` carries it).
macro_rules! shared_lua {
    () => {
        r"
local MAXCAP = 4294967295
local function num(n)
  return string.format('%.0f', n)
end
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function ms(us)
  return math.ceil(us / 1000)
end
local function prune(now)
  local changed = false
  local gone = redis.call('ZRANGEBYSCORE', LEASES, '-inf', num(now))
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', LEASES, '-inf', num(now))
    for i = 1, #gone, 500 do
      local fields = {}
      for j = i, math.min(i + 499, #gone) do
        fields[#fields + 1] = 'l:' .. gone[j]
      end
      redis.call('HDEL', CLAIMS, unpack(fields))
    end
    changed = true
  end
  local rsv = nil
  local r = redis.call('HGET', CLAIMS, 'rsv')
  if r then
    local o, w, e, s = string.match(r, '^(%x+) (%d+) (%d+) ?(%d*)$')
    if o and tonumber(e) > now then
      rsv = {o, tonumber(w), tonumber(e), tonumber(s)}
    else
      redis.call('HDEL', CLAIMS, 'rsv')
      changed = true
    end
  end
  if changed then
    redis.call('HSET', CLAIMS, 'rev', num(now))
  end
  return redis.call('ZCARD', LEASES), rsv
end
local function settle()
  local e = 0
  local top = redis.call('ZRANGE', LEASES, -1, -1, 'WITHSCORES')
  if top[2] then
    e = tonumber(top[2])
  end
  local r = redis.call('HGET', CLAIMS, 'rsv')
  local re = r and tonumber(string.match(r, '^%x+ %d+ (%d+)'))
  if re and re > e then
    e = re
  end
  if e == 0 then
    redis.call('DEL', LEASES, CLAIMS)
  else
    local at = num(math.floor(e / 1000) + 1)
    redis.call('PEXPIREAT', LEASES, at)
    redis.call('PEXPIREAT', CLAIMS, at)
  end
end
local function announce(now, message)
  redis.call('HSET', CLAIMS, 'rev', num(now))
  if redis.call('HEXISTS', CLAIMS, 'w') == 1 then
    redis.call('PUBLISH', LOCK .. ':released', message)
    return 2
  end
  return 1
end
local function renew(owner, expiry)
  local score = redis.call('ZSCORE', LEASES, owner)
  if not score then
    return nil
  end
  local d = redis.call('HGET', CLAIMS, 'l:' .. owner)
  local token = d and string.match(d, '^%d+ (%d+)')
  if not token then
    return nil
  end
  if tonumber(score) < expiry then
    redis.call('ZADD', LEASES, num(expiry), owner)
  end
  return token
end
local function used(cap, live)
  if cap == MAXCAP then
    return live
  end
  local sum = 0
  local owners = redis.call('ZRANGE', LEASES, 0, -1)
  for i = 1, #owners do
    local d = redis.call('HGET', CLAIMS, 'l:' .. owners[i])
    sum = sum + (tonumber(d and string.match(d, '^(%d+)')) or cap)
  end
  return sum
end
local function earlier(since, rsv)
  return since ~= nil and since < (rsv[4] or math.huge)
end
local function reserve(rsv, owner, weight, cap, expiry, now, since)
  if rsv and rsv[1] ~= owner and not earlier(since, rsv) then
    return 0
  end
  since = since or now
  if rsv and rsv[1] == owner and rsv[4] and rsv[4] < since then
    since = rsv[4]
  end
  redis.call('HSETNX', CLAIMS, 'rev', num(now))
  redis.call('HSET', CLAIMS, 'rsv', owner .. ' ' .. num(weight) .. ' ' .. num(expiry) .. ' ' .. num(since), 'cap', num(cap))
  return 1
end
local function refused(now, rsv, owner, kept)
  settle()
  local wait = nil
  local first = redis.call('ZRANGE', LEASES, 0, 0, 'WITHSCORES')
  if first[2] then
    wait = ms(tonumber(first[2]) - now)
  end
  if not wait and rsv and rsv[1] ~= owner then
    wait = ms(rsv[3] - now)
  end
  return {0, wait or -1, redis.call('HGET', CLAIMS, 'rev') or '', kept}
end
local function entries(now)
  local cap = redis.call('HGET', CLAIMS, 'cap') or num(MAXCAP)
  local live = redis.call('ZRANGEBYSCORE', LEASES, '(' .. num(now), '+inf', 'WITHSCORES')
  local out = {}
  for i = 1, #live, 2 do
    local d = redis.call('HGET', CLAIMS, 'l:' .. live[i])
    local w, t, label = string.match(d or '', '^(%d+) (%d+) (.*)$')
    if w then
      out[#out + 1] = {w, cap, t, label, ms(tonumber(live[i + 1]) - now), live[i]}
    end
  end
  return out
end
"
    };
}
pub(crate) use shared_lua;

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
/// [`ACQUIRE`](crate::scripts::ACQUIRE)).
///
/// Returns `{1, token}` when granted; `{0, pttl}` when an exclusive lock holds the key;
/// `{0, ms until the first blocking expiry or -1, rev, kept}` when leases or a reservation
/// refuse it (`kept`: 1 when the refusal recorded the owner's reservation); `{-1, stored capacity}` when the key is held with another capacity.
pub static CLAIM: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        r"
local LOCK, FENCE, LEASES, CLAIMS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
",
        shared_lua!(),
        r"
local owner, label = ARGV[1], ARGV[3]
local weight, cap = tonumber(ARGV[5]), tonumber(ARGV[6])
local now = clock()
local expiry = now + tonumber(ARGV[2]) * 1000
local function grant()
  local t = (tonumber(redis.call('GET', FENCE) or '0') or 0) + 1
  if ARGV[7] ~= 'nofloor' and now > t then
    t = now
  end
  local token = num(t)
  redis.call('SET', FENCE, token, 'PX', ARGV[4])
  redis.call('ZADD', LEASES, num(expiry), owner)
  redis.call('HSETNX', CLAIMS, 'rev', num(now))
  redis.call('HSET', CLAIMS, 'l:' .. owner, num(weight) .. ' ' .. token .. ' ' .. label, 'cap', num(cap))
  return token
end
local v = redis.call('GET', LOCK)
if not v and redis.call('EXISTS', CLAIMS) == 0 then
  -- Nothing shared lives (both keys go together): the first lease, of any capacity.
  local token = grant()
  local at = num(math.floor(expiry / 1000) + 1)
  redis.call('PEXPIREAT', LEASES, at)
  redis.call('PEXPIREAT', CLAIMS, at)
  return {1, token}
end
local live, rsv = prune(now)
local stored = nil
if v then
  stored = MAXCAP
elseif live > 0 or rsv then
  stored = tonumber(redis.call('HGET', CLAIMS, 'cap')) or MAXCAP
end
if stored and stored ~= cap then
  settle()
  return {-1, num(stored)}
end
if v then
  if string.sub(v, 1, 32) == owner then
    local ttl = tonumber(ARGV[2])
    if redis.call('PTTL', LOCK) < ttl then
      redis.call('PEXPIRE', LOCK, ttl)
    end
    settle()
    return {1, string.match(v, '^%x+[ +](%d+)')}
  end
  reserve(rsv, owner, weight, cap, expiry, now)
  settle()
  return {0, redis.call('PTTL', LOCK)}
end
local token = renew(owner, expiry)
if token then
  settle()
  return {1, token}
end
local reserved = 0
if rsv and rsv[1] ~= owner then
  reserved = rsv[2]
end
if used(cap, live) + weight + reserved > cap then
  return refused(now, rsv, owner, reserve(rsv, owner, weight, cap, expiry, now))
end
token = grant()
if rsv and rsv[1] == owner then
  redis.call('HDEL', CLAIMS, 'rsv')
  announce(now, '1')
end
settle()
return {1, token}
"
    ))
});

/// Every live lease of a key: the exclusive lock's and each shared lease's.
///
/// `KEYS[1]` lock key, `KEYS[2]` leases, `KEYS[3]` claims. Returns a list of
/// `{weight, capacity, token, label, pttl, owner}`, unordered.
pub static INSPECT_ALL: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        r"
local LOCK, LEASES, CLAIMS = KEYS[1], KEYS[2], KEYS[3]
",
        shared_lua!(),
        r"
local out = {}
local v = redis.call('GET', LOCK)
if v then
  local t, label = string.match(v, '^%x+[ +](%d+) ?(.*)$')
  if t then
    out[1] = {num(MAXCAP), num(MAXCAP), t, label, redis.call('PTTL', LOCK), string.sub(v, 1, 32)}
  end
end
if redis.call('EXISTS', CLAIMS) == 1 then
  for _, e in ipairs(entries(clock())) do
    out[#out + 1] = e
  end
end
return out
"
    ))
});

/// A waiter gave up: remove its reservation (announcing the change, so the claims it held
/// back try again).
///
/// `KEYS[1]` lock key, `KEYS[2]` leases, `KEYS[3]` claims; `ARGV[1]` owner token,
/// optionally `ARGV[2]` the message to publish (default `1`). Returns 2 when a reservation
/// was removed and announced, 1 when removed without an announcement, 0 when the owner had
/// none.
pub static ABANDON: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        r"
if redis.call('EXISTS', KEYS[3]) == 0 then
  return 0
end
local LOCK, LEASES, CLAIMS = KEYS[1], KEYS[2], KEYS[3]
",
        shared_lua!(),
        r"
local now = clock()
local live, rsv = prune(now)
local removed = 0
if rsv and rsv[1] == ARGV[1] then
  redis.call('HDEL', CLAIMS, 'rsv')
  removed = announce(now, ARGV[2] or '1')
end
settle()
return removed
"
    ))
});
