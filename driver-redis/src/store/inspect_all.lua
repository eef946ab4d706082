local LOCK, LEASES, CLAIMS = KEYS[1], KEYS[2], KEYS[3]
local MAXCAP, num, clock, ms, prune, settle, announce, renew, used, earlier, reserve, refused, entries = shared(LOCK, LEASES, CLAIMS)
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
