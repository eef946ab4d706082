//! The Lua scripts of the fair layout (`fair=true`): waiters queue in the store and are
//! served in the order they first asked, across every client of the lock.
//!
//! The lock itself is the plain layout's string key (same value, same fence key), so
//! renewals and the holders' listing are the plain scripts. Beside it, with the
//! same hash tag:
//!
//! * `P{E(K)}:queue`, a sorted set: each waiting owner (32 hex digits) with its *ticket*,
//!   handed out when the store first refused it: `max(last ticket + 1, now in µs)` by the
//!   server's `TIME`, so tickets keep rising even after the queue expired;
//! * `P{E(K)}:places`, a hash: each waiter's place expiry (server µs) and, under `#`, the
//!   last ticket. A place lasts the waiter's TTL from its last attempt or re-check; a waiter
//!   that died or went away without abandoning (network down) blocks the queue no longer.
//!   Both keys live as long as their longest place.
//!
//! A free lock goes only to the first live place (or to anyone when nobody waits), so a
//! holder that releases and asks again at once queues behind the waiters. A release, an
//! abandon of the first place and a force-release publish the first live place's ticket on
//! the release channel: only the waiter holding that ticket wakes (see `lockcore::driver::Tickets`).
//!
//! Keys and owners are data (`KEYS`/`ARGV`), never spliced into the script text.

use std::sync::LazyLock;

use crate::lua::Lua;

/// What every fair script starts with: its keys, the server's clock and the first live
/// place of the queue (dropping those that ran out).
macro_rules! fair_lua {
    () => {
        r"
local LOCK, QUEUE, PLACES = KEYS[1], KEYS[2], KEYS[3]
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- Whole milliseconds, rounded up, at least 1: a wait never rounds down to nothing.
local function ms(us)
  return math.max(math.ceil(us / 1000), 1)
end
-- The first place that has not run out (owner, ticket, expiry), after dropping the ones
-- before it that have.
local function first(now)
  while true do
    local f = redis.call('ZRANGE', QUEUE, 0, 0, 'WITHSCORES')
    if not f[1] then
      return nil
    end
    local ends = tonumber(redis.call('HGET', PLACES, f[1]) or '0') or 0
    if ends > now then
      return f[1], f[2], ends
    end
    redis.call('ZREM', QUEUE, f[1])
    redis.call('HDEL', PLACES, f[1])
  end
end
"
    };
}

/// Take the lock if it is free and the caller is first in the queue (or nobody waits);
/// re-grant to the same owner (same token, expiry never shortened); otherwise give the
/// caller a place in the queue (keeping its ticket if it has one) that lasts its TTL.
///
/// `KEYS[1]` lock key, `KEYS[2]` queue, `KEYS[3]` places, `KEYS[4]` fence key; `ARGV[1]`
/// owner token (32 hex digits), `ARGV[2]` TTL in ms, `ARGV[3]` holder label, `ARGV[4]`
/// fence key TTL in ms.
///
/// Returns `{1, token}` when granted, `{0, wait_ms, ticket}` when queued: the holder's
/// remaining TTL, or while the lock is free, how long the first place has left.
pub static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        fair_lua!(),
        r"
local owner, ttl = ARGV[1], tonumber(ARGV[2])
local v = redis.call('GET', LOCK)
if v and string.sub(v, 1, 32) == owner then
  if redis.call('PTTL', LOCK) < ttl then
    redis.call('PEXPIRE', LOCK, ttl)
  end
  return {1, string.match(v, '^%x+[ +](%d+)')}
end
local now = clock()
local head, _, head_ends = first(now)
if not v and (not head or head == owner) then
  if head then
    redis.call('ZREM', QUEUE, owner)
    redis.call('HDEL', PLACES, owner)
  end
  local token = (tonumber(redis.call('GET', KEYS[4]) or '0') or 0) + 1
  if now > token then
    token = now
  end
  local s = string.format('%.0f', token)
  redis.call('SET', KEYS[4], s, 'PX', ARGV[4])
  redis.call('SET', LOCK, owner .. ' ' .. s .. ' ' .. ARGV[3], 'PX', ttl)
  return {1, s}
end
local ticket = redis.call('ZSCORE', QUEUE, owner)
if not ticket then
  local last = tonumber(redis.call('HGET', PLACES, '#') or '0') or 0
  ticket = string.format('%.0f', math.max(now, last + 1))
  redis.call('HSET', PLACES, '#', ticket)
  redis.call('ZADD', QUEUE, ticket, owner)
end
redis.call('HSET', PLACES, owner, string.format('%.0f', now + ttl * 1000))
if redis.call('PTTL', PLACES) < ttl then
  redis.call('PEXPIRE', PLACES, ttl)
end
if redis.call('PTTL', QUEUE) < ttl then
  redis.call('PEXPIRE', QUEUE, ttl)
end
local wait
if v then
  wait = redis.call('PTTL', LOCK)
else
  wait = ms(head_ends - now)
end
return {0, wait, ticket}
"
    ))
});

/// Owner-checked delete of the lock (or, with an empty owner, whoever holds it: the
/// operator's force-release), then the first live place's ticket published on the release
/// channel `KEYS[1] .. ':released'`.
///
/// `KEYS[1]` lock key, `KEYS[2]` queue, `KEYS[3]` places; `ARGV[1]` owner token, or `''`.
/// Returns 2 when released and announced, 1 when released with nobody waiting, 0 when the
/// owner did not hold it (nothing announced) or, forced, when nobody held it (the first
/// place is still announced: its waiter may be sleeping through a lock that expired).
pub static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        fair_lua!(),
        r"
local v = redis.call('GET', LOCK)
local freed = 0
if v and (ARGV[1] == '' or (#ARGV[1] == 32 and string.find(v, ARGV[1], 1, true) == 1)) then
  redis.call('DEL', LOCK)
  freed = 1
elseif ARGV[1] ~= '' then
  return 0
end
if redis.call('EXISTS', QUEUE) == 0 then
  return freed
end
local head, ticket = first(clock())
if not head then
  return freed
end
redis.call('PUBLISH', LOCK .. ':released', ticket)
return freed * 2
"
    ))
});

/// Removes the owner's place (a waiter that gave up). When it was first and the lock is
/// free, the next live place's ticket is published, so that waiter does not sleep until
/// the removed place would have run out.
///
/// `KEYS[1]` lock key, `KEYS[2]` queue, `KEYS[3]` places; `ARGV[1]` owner token.
/// Returns 1 when a place was removed, 0 when the owner had none.
pub static ABANDON: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        fair_lua!(),
        r"
local f = redis.call('ZRANGE', QUEUE, 0, 0)
if redis.call('ZREM', QUEUE, ARGV[1]) == 0 then
  return 0
end
redis.call('HDEL', PLACES, ARGV[1])
if f[1] ~= ARGV[1] or redis.call('EXISTS', LOCK) == 1 then
  return 1
end
local head, ticket = first(clock())
if head then
  redis.call('PUBLISH', LOCK .. ':released', ticket)
end
return 1
"
    ))
});

/// A queued waiter's re-check after it subscribed to the release channel: whether it
/// should try now (its place is first and the lock is free, or its place is gone and it
/// must queue again), or else how long to wait at most: until the holder's lease or the
/// first place runs out, and never past half of what its own place has left, so the next
/// attempt renews the place before it lapses.
///
/// `KEYS[1]` lock key, `KEYS[2]` queue, `KEYS[3]` places; `ARGV[1]` the waiter's ticket.
/// Returns the time to wait in ms, `-2` to try now.
pub static WATCH: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        fair_lua!(),
        r"
local now = clock()
local mine = redis.call('ZRANGEBYSCORE', QUEUE, ARGV[1], ARGV[1], 'LIMIT', 0, 1)
if not mine[1] then
  return -2
end
local ends = tonumber(redis.call('HGET', PLACES, mine[1]) or '0') or 0
if ends <= now then
  return -2
end
local most = ms((ends - now) / 2)
local wait = redis.call('PTTL', LOCK)
if wait == -2 then
  local head, _, head_ends = first(now)
  if not head or head == mine[1] then
    return -2
  end
  wait = ms(head_ends - now)
end
if wait < 0 or wait > most then
  wait = most
end
return wait
"
    ))
});

/// Every fair script, for loading them at connect time.
pub fn all() -> [&'static Lua; 4] {
    [&ACQUIRE, &RELEASE, &ABANDON, &WATCH]
}
