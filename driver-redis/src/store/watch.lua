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
local MAXCAP, num, clock, ms, prune, settle, announce, renew, used, earlier, reserve, refused, entries = shared(LOCK, LEASES, CLAIMS)
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
