local freed = redis.call('DEL', KEYS[1])
local deleted = freed
if KEYS[3] then
  local t = redis.call('TIME')
  local now = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  if redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf') > 0 then
    freed = 1
  end
  deleted = deleted + redis.call('DEL', KEYS[2], KEYS[3])
end
if deleted > 0 then
  redis.call(PUBLISH, ARGV[1], ARGV[2] or '1')
end
return freed
