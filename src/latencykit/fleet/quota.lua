-- A fleet-wide token bucket (a tenant's request or token quota), as
-- latencykit.RedisStore.take describes it (the limiter keeps the same bucket in memory).
--
-- KEYS[1]: a hash {tokens, at (server ms)}.
-- ARGV: amount (negative: a refund), rate per second, burst, max wait in seconds.
-- Returns the wait in seconds (a string: a float); above max wait, nothing was taken.

local amount, rate, burst, max_wait =
  tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local stored = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(stored[1]) or burst
local at = tonumber(stored[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
at = math.max(at, now)

local wait = 0
if amount <= 0 then
  tokens = math.min(burst, tokens - amount)
else
  if tokens < amount then wait = (amount - tokens) / rate end
  if wait <= max_wait then tokens = tokens - amount end
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(at))
-- Forgotten once it would be full again (an unknown bucket is a full one).
local refill = (burst - tokens) / rate
redis.call('PEXPIRE', KEYS[1], math.ceil((refill + 1) * 1000))
return tostring(wait)
