-- The same owner's lock, whose value is `v`, at LOCK: renewed to `ttl` ms, never shortened
-- (a re-grant or a renewal asking less than is left keeps the longer expiry); its token.
local function regrant(LOCK, v, ttl)
  if redis.call('PTTL', LOCK) < ttl then
    redis.call('PEXPIRE', LOCK, ttl)
  end
  return string.match(v, '^%x+[ +](%d+)')
end
