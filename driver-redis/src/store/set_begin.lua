-- The exclusive claim of one lock, as a function over its own KEYS and ARGV: the text of
-- acquire.lua follows, and set_end.lua closes it.
local function acquire_one(KEYS, ARGV)
