if redis.call('SET', KEYS[1], ARGV[1] .. ' 0 ' .. ARGV[3], 'NX', 'PX', ARGV[2]) then
  return {1, '0'}
end
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then
  local ttl = tonumber(ARGV[2])
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return {1, string.match(v, '^%x+[ +](%d+)')}
end
return {0, redis.call('PTTL', KEYS[1])}
