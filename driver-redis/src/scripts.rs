//! The Lua scripts that make each lock operation atomic in Redis.
//!
//! Public (but hidden from the docs) for driver-redlock, which runs the same scripts on
//! each of its instances; not a stable API.
//!
//! A lock is a string key holding `<owner token hex><mark><fencing token> <holder label>`
//! with a PX expiry. The mark is one byte at offset 32: a space, or `+` once a waiter has
//! asked to be told of the release ([`WATCH`]); [`RELEASE`] publishes only then, so a lock
//! nobody waits for is released without a `PUBLISH`. Every key a script touches is passed in `KEYS` (the lock key and, for
//! acquire, its fence key, which share a hash tag); lock keys and labels are data in
//! `KEYS`/`ARGV`, never spliced into the script text. Scripts are sent by EVALSHA and
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

use redis::Script;

/// Take the lock if free; re-grant to the same owner (same token, expiry never shortened);
/// otherwise report the holder's remaining TTL.
///
/// `KEYS[1]` lock key, `KEYS[2]` fence key; `ARGV[1]` owner token (32 hex digits),
/// `ARGV[2]` TTL in ms, `ARGV[3]` holder label, `ARGV[4]` fence key TTL in ms, and
/// optionally `ARGV[5]` = `nofloor` to bump the fence without the `TIME` floor (a test-only
/// setting of driver-redlock, whose tests prove its max-register without the floor).
///
/// Returns `{1, token}` when granted, `{0, pttl}` when another owner holds it.
pub static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
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
  return {0, redis.call('PTTL', KEYS[1])}
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
",
    )
});

/// Owner-checked delete, announcing the release on the lock's channel when a waiter marked
/// the lock ([`WATCH`]).
///
/// `KEYS[1]` lock key; `ARGV[1]` owner token, optionally `ARGV[2]` the message to publish
/// on the release channel `KEYS[1] .. ':released'` (default `1`; driver-redlock sends one
/// nonce per release to all its instances, so its waiters are woken once, not once per
/// instance). The channel is built here, only when needed: one argument less and a prefix
/// comparison by `string.find` instead of a `string.sub` copy cost the server 8% less per
/// release. Returns 2 when released and announced, 1 when released without an announcement (no
/// waiter had marked it: the releasing client wakes its own waiters, if any, itself), 0 when
/// the owner did not hold it.
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
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
return 0
",
    )
});

/// Owner-checked renewal: never creates the key, never shortens its expiry.
///
/// `KEYS[1]` lock key; `ARGV[1]` owner token, `ARGV[2]` TTL in ms.
/// Returns `{1, token}` when renewed, `{0}` when the owner does not hold it.
pub static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then
  local ttl = tonumber(ARGV[2])
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return {1, string.match(v, '^%x+[ +](%d+)')}
end
return {0}
",
    )
});

/// The lock's value and remaining TTL, read atomically.
///
/// `KEYS[1]` lock key. Returns `{}` when free, `{value, pttl}` when held.
pub static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.call('GET', KEYS[1])
if v then
  return {v, redis.call('PTTL', KEYS[1])}
end
return {}
",
    )
});

/// A waiter's re-check after it subscribed to the release channel: the holder's remaining
/// TTL, marking the lock (offset 32 becomes `+`, expiry kept) so that its [`RELEASE`]
/// publishes. Marking and looking are one atomic step: a release after it announces itself,
/// a release before it leaves the key gone.
///
/// `KEYS[1]` lock key. Returns the PTTL (`-2` when free).
pub static WATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.call('GET', KEYS[1])
if not v then
  return -2
end
if string.byte(v, 33) == 32 then
  redis.call('SETRANGE', KEYS[1], 32, '+')
end
return redis.call('PTTL', KEYS[1])
",
    )
});

/// Delete whoever holds it (operator break-lock), announcing the release.
///
/// `KEYS[1]` lock key; `ARGV[1]` release channel, optionally `ARGV[2]` the message to
/// publish (default `1`). Returns 1 when a lock was deleted.
pub static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], ARGV[2] or '1')
  return 1
end
return 0
",
    )
});

/// Redlock's fencing write-back (driver-redlock): raise the fence to `max(c, T)` (always:
/// raising it is safe even when the lock is gone) and store `T` in the owner's lock value
/// (keeping its expiry and its waiter mark), so a same-owner re-grant returns `T`.
///
/// `KEYS[1]` lock key, `KEYS[2]` fence key; `ARGV[1]` owner token, `ARGV[2]` `T` (decimal
/// digits), `ARGV[3]` fence key TTL in ms. Returns 1 when written, 0 when the owner no
/// longer holds the lock on this instance.
pub static WRITE_BACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local c = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if tonumber(ARGV[2]) > c then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 32) ~= ARGV[1] then
  return 0
end
local mark, token, label = string.match(v, '^%x+([ +])(%d+) (.*)$')
if token ~= ARGV[2] then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl > 0 then
    redis.call('SET', KEYS[1], ARGV[1] .. (mark or ' ') .. ARGV[2] .. ' ' .. (label or ''), 'PX', pttl)
  end
end
return 1
",
    )
});

/// Every script, for loading them all at connect time.
pub fn all() -> [&'static Script; 7] {
    [
        &ACQUIRE,
        &RELEASE,
        &EXTEND,
        &INSPECT,
        &WATCH,
        &FORCE_RELEASE,
        &WRITE_BACK,
    ]
}
