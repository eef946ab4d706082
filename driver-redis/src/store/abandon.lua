if redis.call('EXISTS', KEYS[3]) == 0 then
  return 0
end
local LOCK, LEASES, CLAIMS = KEYS[1], KEYS[2], KEYS[3]
local MAXCAP, num, clock, ms, prune, settle, announce, renew, used, earlier, reserve, refused, entries = shared(LOCK, LEASES, CLAIMS)
local now = clock()
local live, rsv = prune(now)
local removed = 0
if rsv and rsv[1] == ARGV[1] then
  redis.call('HDEL', CLAIMS, 'rsv')
  removed = announce(now, ARGV[2] or '1')
end
settle()
return removed
