local c = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if tonumber(ARGV[2]) > c then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 32) ~= ARGV[1] then
  local d = KEYS[3] and redis.call('HGET', KEYS[3], 'l:' .. ARGV[1])
  local weight, held, rest = string.match(d or '', '^(%d+) (%d+) (.*)$')
  if not weight or tonumber(held) > tonumber(ARGV[2]) then
    return 0
  end
  redis.call('HSET', KEYS[3], 'l:' .. ARGV[1], weight .. ' 0' .. ARGV[2] .. ' ' .. rest)
  return 1
end
local mark, token, label = string.match(v, '^%x+([ +])(%d+) (.*)$')
if token and tonumber(token) > tonumber(ARGV[2]) then
  return 0
end
if token ~= '0' .. ARGV[2] then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl > 0 then
    redis.call('SET', KEYS[1], ARGV[1] .. (mark or ' ') .. '0' .. ARGV[2] .. ' ' .. (label or ''), 'PX', pttl)
  end
end
return 1
