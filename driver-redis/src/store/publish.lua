-- How a single server's scripts announce a release: every subscriber hears a PUBLISH.
local PUBLISH = 'PUBLISH'
