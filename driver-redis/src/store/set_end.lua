end
-- A set of locks taken in one step, each by `acquire_one` (acquire.lua: the rule's one
-- copy) in the order given. KEYS are (lock, fence, leases, claims) of each lock in turn;
-- ARGV the owner token, TTL in ms, holder label and fence key TTL in ms, as for one lock.
-- At the first lock refused, what the set changed goes back: the locks it granted fresh
-- are deleted (a re-grant of the owner's own lock stays as it was, but longer), and the
-- reservation its refusal recorded is removed. Returns `{1, token, ...}` with a token per
-- lock, or `{flag, index, ...}`: the refusal of lock `index` (from 1) as acquire.lua
-- answers it after its flag.
local owner = ARGV[1]
local fresh = {}
local tokens = {1}
for i = 1, #KEYS / 4 do
  local keys = {KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]}
  local before = redis.call('GET', keys[1])
  local reply = acquire_one(keys, ARGV)
  if reply[1] ~= 1 then
    for _, lock in ipairs(fresh) do
      redis.call('DEL', lock)
    end
    if reply[4] == 1 then
      local r = redis.call('HGET', keys[4], 'rsv')
      if r and string.find(r, owner, 1, true) == 1 then
        redis.call('HDEL', keys[4], 'rsv')
      end
    end
    local refused = {reply[1], i}
    for j = 2, #reply do
      refused[#refused + 1] = reply[j]
    end
    return refused
  end
  if not (before and string.find(before, owner, 1, true) == 1) then
    fresh[#fresh + 1] = keys[1]
  end
  tokens[#tokens + 1] = reply[2]
end
return tokens
