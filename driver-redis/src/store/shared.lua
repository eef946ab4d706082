-- The helpers of every script that reads shared claims (read-write locks and semaphores),
-- over the keys of one lock: LOCK (the lock), LEASES (the sorted set of shared leases) and
-- CLAIMS (the hash of their data). A script calls `shared` on the paths that need them and
-- unpacks what it returns in this order:
--
--   local MAXCAP, num, clock, ms, prune, settle, announce, renew, used, earlier, reserve,
--     refused, entries = shared(LOCK, LEASES, CLAIMS)
--
-- so that a fast path, which needs none of them, does not pay for making a dozen closures.
-- Needs `PUBLISH` (publish.lua or spublish.lua) in front.
--
-- * `prune(now)` removes expired leases (and their data) and an expired reservation,
--   stamping `rev`; returns the number of live leases and the live reservation
--   `{owner, weight, expiry, since}` (`since` may be `nil`) or `nil`.
-- * `settle()` sets both keys to expire with the last lease or reservation, or deletes
--   them when nothing lives.
-- * `announce(now, message)` stamps `rev` and publishes on the release channel when a
--   waiter marked the leases: 2 when published, 1 when not.
-- * `renew(owner, expiry)` re-grants `owner`'s live lease (never shortening it): its
--   token, or `nil` when it holds none.
-- * `used(cap, live)` the live leases' total weight (readers weigh 1 each).
-- * `earlier(since, rsv)` whether a request that arrived at `since` (`nil`: one that did
--   not say) arrived before the reservation's.
-- * `reserve(rsv, owner, weight, cap, expiry, now, since)` records or refreshes `owner`'s
--   reservation unless another owner's lives that arrived no later (`since` `nil`: a
--   request that did not say, which displaces nobody and is recorded as arriving now); a
--   refreshed reservation keeps its earliest arrival; returns 1 when it did, else 0.
-- * `refused(now, rsv, owner, kept)` the reply of a refused claim: `{0, ms until the first
--   lease (or the other owner's reservation) expires or -1, rev, kept}`, `kept` 1 when the
--   refusal recorded or refreshed the owner's reservation (`reserve`'s answer), else 0.
-- * `entries(now)` every live shared lease as `{weight, cap, token, label, pttl, owner}`
--   (the owner token goes no further than the driver: driver-redlock groups an owner's
--   copies by it, and no `LockInfo` carries it).
--
-- Numbers: Lua 5.1 numbers are doubles; µs timestamps and tokens are exact in them but
-- `tostring` (and `..`) prints 14 digits, so every number stored or compared as text is
-- formatted with `num` (`%.0f`).
local function shared(LOCK, LEASES, CLAIMS)
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
      redis.call(PUBLISH, LOCK .. ':released', message)
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
  return MAXCAP, num, clock, ms, prune, settle, announce, renew, used, earlier, reserve, refused, entries
end
