-- A target's recent latencies, pooled by the fleet: a stream of batches, one entry per
-- process and refresh, trimmed to the window on the server's clock.
--
-- KEYS[1]: the stream. ARGV: this process's id, the last entry id it read ("0": none yet),
--          the window in ms, this process's new samples ("" for none; comma-separated
--          seconds, negative for a censored sample).
-- Returns {the last entry id read, the other processes' batches since the one given...}. A
-- process's first read returns the whole window: it starts warm.

local me, last, window_ms, batch = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if batch ~= '' then redis.call('XADD', KEYS[1], '*', 'p', me, 'v', batch) end
redis.call('XTRIM', KEYS[1], 'MINID', now - window_ms)
redis.call('PEXPIRE', KEYS[1], 2 * window_ms)

if last == '0' then last = tostring(now - window_ms) end
local entries = redis.call('XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', 1000)
local out = {last}
for _, entry in ipairs(entries) do
  out[1] = entry[1]
  local fields = entry[2]
  if fields[2] ~= me then table.insert(out, fields[4]) end
end
return out
