local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then
  return {1, regrant(KEYS[1], v, tonumber(ARGV[2]))}
end
if not KEYS[3] or redis.call('EXISTS', KEYS[3]) == 0 then
  return {0}
end
local LOCK, LEASES, CLAIMS = KEYS[1], KEYS[2], KEYS[3]
local MAXCAP, num, clock, ms, prune, settle, announce, renew, used, earlier, reserve, refused, entries = shared(LOCK, LEASES, CLAIMS)
local now = clock()
prune(now)
local token = renew(ARGV[1], now + tonumber(ARGV[2]) * 1000)
settle()
if token then
  return {1, token}
end
return {0}
