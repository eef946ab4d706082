if redis.call('SET', KEYS[1], ARGV[1] .. ' 0 ' .. ARGV[3], 'NX', 'PX', ARGV[2]) then
  return {1, '0'}
end
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then
  return {1, regrant(KEYS[1], v, tonumber(ARGV[2]))}
end
return {0, redis.call('PTTL', KEYS[1])}
