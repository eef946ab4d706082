local v = redis.call('GET', KEYS[1])
if v then
  return {v, redis.call('PTTL', KEYS[1])}
end
if not KEYS[3] or redis.call('EXISTS', KEYS[3]) == 0 then
  return {}
end
local LOCK, LEASES, CLAIMS = KEYS[1], KEYS[2], KEYS[3]
local MAXCAP, num, clock, ms, prune, settle, announce, renew, used, earlier, reserve, refused, entries = shared(LOCK, LEASES, CLAIMS)
local newest = {}
for _, e in ipairs(entries(clock())) do
  if not newest[3] or tonumber(e[3]) > tonumber(newest[3]) then
    newest = e
  end
end
return newest
