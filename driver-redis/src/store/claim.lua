local LOCK, FENCE, LEASES, CLAIMS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local MAXCAP, num, clock, ms, prune, settle, announce, renew, used, earlier, reserve, refused, entries = shared(LOCK, LEASES, CLAIMS)
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
    local token = regrant(LOCK, v, tonumber(ARGV[2]))
    settle()
    return {1, token}
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
