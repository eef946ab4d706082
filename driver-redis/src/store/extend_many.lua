local out = {}
local now = nil
for i = 1, #ARGV / 2 do
  local LOCK, LEASES, CLAIMS = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local owner, ttl = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local v = redis.call('GET', LOCK)
  out[i] = 0
  if v and string.sub(v, 1, 32) == owner then
    out[i] = regrant(LOCK, v, ttl)
  elseif redis.call('EXISTS', CLAIMS) == 1 then
    local MAXCAP, num, clock, ms, prune, settle, announce, renew, used, earlier, reserve, refused, entries = shared(LOCK, LEASES, CLAIMS)
    now = now or clock()
    prune(now)
    local token = renew(owner, now + ttl * 1000)
    settle()
    if token then
      out[i] = token
    end
  end
end
return out
