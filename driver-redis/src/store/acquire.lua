local v = redis.call('GET', KEYS[1])
if v then
  if string.sub(v, 1, 32) == ARGV[1] then
    return {1, regrant(KEYS[1], v, tonumber(ARGV[2]))}
  end
  if ARGV[6] and KEYS[4] then
    -- A long wait marks the key as its next turn unless an earlier arrival's mark lives.
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local since = now - tonumber(ARGV[6])
    local r = redis.call('HGET', KEYS[4], 'rsv')
    local o, e, s
    if r then
      o, e, s = string.match(r, '^(%x+) %d+ (%d+) ?(%d*)$')
    end
    local live = o and tonumber(e) > now
    if not live or o == ARGV[1] or since < (tonumber(s) or math.huge) then
      if live and o == ARGV[1] and tonumber(s) and tonumber(s) < since then
        since = tonumber(s)
      end
      local f = '%.0f'
      local mark = tonumber(ARGV[7])
      redis.call('HSETNX', KEYS[4], 'rev', string.format(f, now))
      redis.call('HSET', KEYS[4], 'rsv', ARGV[1] .. ' 4294967295 ' .. string.format(f, now + mark * 1000) .. ' ' .. string.format(f, since), 'cap', '4294967295')
      if redis.call('PTTL', KEYS[4]) < mark then
        redis.call('PEXPIRE', KEYS[4], mark + 1)
      end
    end
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
if KEYS[4] and redis.call('EXISTS', KEYS[4]) == 1 then
  local LOCK, LEASES, CLAIMS = KEYS[1], KEYS[3], KEYS[4]
  local MAXCAP, num, clock, ms, prune, settle, announce, renew, used, earlier, reserve, refused, entries = shared(LOCK, LEASES, CLAIMS)
  local now = clock()
  local expiry = now + tonumber(ARGV[2]) * 1000
  local since = nil
  if ARGV[6] then
    since = now - tonumber(ARGV[6])
    expiry = now + tonumber(ARGV[7]) * 1000
  end
  local live, rsv = prune(now)
  if live > 0 or rsv then
    local cap = tonumber(redis.call('HGET', CLAIMS, 'cap')) or MAXCAP
    if cap ~= MAXCAP then
      settle()
      return {-1, num(cap)}
    end
    local held = renew(ARGV[1], now + tonumber(ARGV[2]) * 1000)
    if held then
      settle()
      return {1, held}
    end
    if live > 0 then
      return refused(now, rsv, ARGV[1], reserve(rsv, ARGV[1], MAXCAP, MAXCAP, expiry, now, since))
    end
    if rsv[1] == ARGV[1] then
      redis.call('HDEL', CLAIMS, 'rsv')
      announce(now, '1')
    elseif not earlier(since, rsv) then
      return refused(now, rsv, ARGV[1], 0)
    end
  end
  settle()
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
