-- A target's adaptive concurrency shared by the fleet, as
-- latencykit.fleet.redis.SharedConcurrency describes it: each worker (a process's stage for
-- the target) tells its attempts in flight, its demand (in flight and waiting) and its
-- estimate of the target's limit; it reads back the others' and the fleet's limit. Times are
-- the server's (TIME): a worker's clock does not matter.
--
-- KEYS[1]: a hash, field = worker id, value = "in_flight demand estimate seen" (seen: server s).
-- ARGV: worker id, in flight, demand, estimate, seconds a worker counts as seen, ttl ms.
-- Returns {the others' in flight, the others' demand, workers seen (itself included), the
--          fleet's limit: the mean of their estimates} (strings).

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local me, seen_for = ARGV[1], tonumber(ARGV[5])

redis.call('HSET', KEYS[1], me, ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. now)
redis.call('PEXPIRE', KEYS[1], ARGV[6])

local in_flight, demand, workers, estimates = 0, 0, 0, 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f, d, e, at = string.match(all[i + 1], '^(%S+) (%S+) (%S+) (%S+)$')
  at = tonumber(at)
  if not at or now - at > seen_for then
    redis.call('HDEL', KEYS[1], all[i]) -- gone (or garbage): it holds nothing any more
  else
    workers, estimates = workers + 1, estimates + (tonumber(e) or 0)
    if all[i] ~= me then
      in_flight, demand = in_flight + (tonumber(f) or 0), demand + (tonumber(d) or 0)
    end
  end
end
return {tostring(in_flight), tostring(demand), tostring(workers), tostring(estimates / workers)}
