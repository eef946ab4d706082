-- How a Redis Cluster's scripts announce a release: on the sharded channel, which only the
-- shard owning its slot (the lock's, by its hash tag) carries (Redis 7).
local PUBLISH = 'SPUBLISH'
