-- A provider's rate-limit room shared by the fleet (one per target and API key hash), as
-- latencykit.fleet.redis.SharedRoom describes it: what the answers' headers told, merged, and
-- the leases the workers take from it. Times are the server's (TIME); a worker sends only
-- durations, so its clock does not matter.
--
-- KEYS[1]: a hash {r_limit, r_level, r_at, r_rate, t_limit, t_level, t_at, t_rate, paused}
--          (r_: requests, t_: tokens; levels are the room not leased out; at, paused: server s).
-- KEYS[2]: a sorted set of the workers seen (score: server seconds of their last exchange).
-- KEYS[3]: a hash, field = worker id, value = "requests tokens" it holds in leases, unspent.
-- KEYS[4]: the probe: the id of the one worker that may find out a room nobody was told of
--          yet (SET NX PX: it lapses unless its holder renews it).
-- ARGV: worker id; what an answer told ("" where not told): requests limit, remaining, reset
--       (s), tokens limit, remaining, reset (s), retry-after (s), its age (s); requests and
--       tokens wanted, requests and tokens given back (negative: a debt), the floor (a
--       fraction of the limit no lease may take: the reserve of the lanes above the asking
--       one), ttl ms, seconds a worker counts as seen, requests and tokens it still holds;
--       "1" if the worker has calls waiting to find out the room, "1" if an answer came back
--       to it (told limits or not), the probe's ttl ms, the channel a room newly told (or
--       found to tell nothing) is announced on (every worker's store refreshes at once).
-- Returns {requests granted, tokens granted, requests left, limit, rate, tokens left, limit,
--          rate, seconds paused, workers seen, 1 if the worker may find out the room} (strings
--          but the last two; a limit of -1: not told yet).

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local names = {'r_limit', 'r_level', 'r_at', 'r_rate', 't_limit', 't_level', 't_at', 't_rate',
               'paused', 'answered'}
local stored = redis.call('HMGET', KEYS[1], unpack(names))
local s = {}
for i, name in ipairs(names) do s[name] = tonumber(stored[i]) end

local function arg(i) return tonumber(ARGV[i]) end
local age = arg(9) or 0

-- The room refills continuously, at least at a per-minute limit's pace.
for _, p in ipairs({'r', 't'}) do
  if s[p .. '_limit'] then
    local elapsed = math.max(0, now - s[p .. '_at'])
    s[p .. '_level'] = math.min(s[p .. '_limit'], s[p .. '_level'] + s[p .. '_rate'] * elapsed)
    s[p .. '_at'] = now
  end
end

-- The workers seen, and the leases they hold unspent (the provider counts them as left).
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - arg(16))
redis.call('HSET', KEYS[3], ARGV[1], ARGV[17] .. ' ' .. ARGV[18])
local held = {r = 0, t = 0}
local leases = redis.call('HGETALL', KEYS[3])
for i = 1, #leases, 2 do
  if redis.call('ZSCORE', KEYS[2], leases[i]) then
    local r, tk = string.match(leases[i + 1], '^(%S+) (%S+)$')
    held.r, held.t = held.r + (tonumber(r) or 0), held.t + (tonumber(tk) or 0)
  else
    redis.call('HDEL', KEYS[3], leases[i])
  end
end

-- An answer's word, aged to now, less the leases held: it can only lower the room (the room
-- not leased out is at most what the provider says is left, less what the workers hold;
-- any other client's calls are in its count, not ours), except the limit itself, which is
-- the provider's.
local function read(p, limit, left, reset)
  if not left then return end
  local known = s[p .. '_limit']
  limit = limit or math.max(left, known or 0)
  left = math.min(left, limit)
  local rate = limit / 60
  if reset and reset > 0 and limit > left then rate = math.max(rate, (limit - left) / reset) end
  -- Aged: refilled since, unless the server had no room (restarted, or new): then its
  -- workers went on alone and spent that refill (the first word of a new room is fresh).
  local refilled = known and rate * age or 0
  local told = math.min(limit, left + refilled) - math.max(0, held[p])
  if known then told = math.min(told, s[p .. '_level']) end
  s[p .. '_limit'], s[p .. '_level'], s[p .. '_at'], s[p .. '_rate'] = limit, told, now, rate
end
local unknown = not s.r_limit and not s.t_limit and not s.answered
read('r', arg(2), arg(3), arg(4))
read('t', arg(5), arg(6), arg(7))
-- An answer that told no limits: there is nothing to find out (the host tells none).
if ARGV[20] == '1' and not s.r_limit and not s.t_limit then s.answered = 1 end
local retry = arg(8)
if retry then s.paused = math.max(s.paused or 0, now + retry - age) end

-- Leftovers back, then the lease: whole requests, down to the floor.
local floor = arg(14)
local function lease(p, want, back)
  local limit = s[p .. '_limit']
  if not limit then return 0 end -- nothing told yet: the workers find out, one call each
  s[p .. '_level'] = math.min(limit, s[p .. '_level'] + back)
  local granted = math.max(0, math.min(want, s[p .. '_level'] - floor * limit))
  if p == 'r' then granted = math.floor(granted) end
  s[p .. '_level'] = s[p .. '_level'] - granted
  return granted
end
local granted_r = lease('r', arg(10), arg(12))
local granted_t = lease('t', arg(11), arg(13))

local fields = {}
for _, name in ipairs(names) do
  if s[name] then
    fields[#fields + 1] = name
    fields[#fields + 1] = tostring(s[name])
  end
end
if #fields > 0 then
  redis.call('HSET', KEYS[1], unpack(fields))
  redis.call('PEXPIRE', KEYS[1], arg(15))
end

redis.call('PEXPIRE', KEYS[2], arg(15))
redis.call('PEXPIRE', KEYS[3], arg(15))
local workers = redis.call('ZCARD', KEYS[2])

-- The probe: while nobody has heard the room, one worker at a time finds it out (the others
-- wait for its answer's word, announced as soon as it is merged).
local probe = 1
if s.r_limit or s.t_limit or s.answered then
  if unknown then
    redis.call('DEL', KEYS[4])
    redis.call('PUBLISH', ARGV[22], KEYS[1])
  end
else
  local holder = redis.call('GET', KEYS[4])
  if ARGV[19] == '1' and (not holder or holder == ARGV[1]) then
    redis.call('SET', KEYS[4], ARGV[1], 'PX', arg(21))
  elseif holder == ARGV[1] then
    redis.call('DEL', KEYS[4]) -- no call of its own wants it any more
  end
  probe = redis.call('GET', KEYS[4]) == ARGV[1] and 1 or 0
end

local function told(name) return tostring(s[name] or -1) end
return {tostring(granted_r), tostring(granted_t),
        told('r_level'), told('r_limit'), told('r_rate'),
        told('t_level'), told('t_limit'), told('t_rate'),
        tostring(math.max(0, (s.paused or 0) - now)), workers, probe}
