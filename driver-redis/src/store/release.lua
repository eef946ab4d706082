local v = redis.call('GET', KEYS[1])
if v and #ARGV[1] == 32 and string.find(v, ARGV[1], 1, true) == 1 then
  redis.call('DEL', KEYS[1])
  if string.byte(v, 33) == 43 then
    redis.call(PUBLISH, KEYS[1] .. ':released', ARGV[2] or '1')
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
  redis.call(PUBLISH, KEYS[1] .. ':released', ARGV[2] or '1')
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
