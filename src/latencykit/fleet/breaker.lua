-- One circuit breaker's fleet-wide state, changed atomically on the server.
--
-- KEYS[1]: the state (a hash); KEYS[2]: the window (count window: a list of call codes, newest
-- first; time window: a hash, field = bucket number mod size, value = "bucket calls failed slow").
-- ARGV: op, epoch, window type, size, bucket ms, minimum calls, failure rate, slow-call rate,
--       open ms, max open ms (0: none), half-open calls, ttl ms, op argument, the channel a
--       state change is published on (every process's store listens: it refreshes at once).
-- ops: "sync" (argument: the calls' codes, one character each: 1 + 2 if failed + 4 if slow),
--      "probe" (take a half-open probe permit), "probe_end" (argument: one code, "0" = ignored),
--      "isolate", "reset".
-- Returns {state, epoch, remaining ms while open, free probe permits, calls, failures, slow,
--          1 if a probe permit was granted}.
-- Times are the server's (TIME): every process reads the same clock.

local op, epoch_arg = ARGV[1], tonumber(ARGV[2])
local count_window = ARGV[3] == 'count'
local size, bucket_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
local minimum, failure_rate, slow_rate = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local open_ms, max_open_ms = tonumber(ARGV[9]), tonumber(ARGV[10])
local probes_max, ttl_ms = tonumber(ARGV[11]), tonumber(ARGV[12])
local arg = ARGV[13] or ''
local channel = ARGV[14]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local shape = ARGV[3] .. '/' .. ARGV[4] .. '/' .. ARGV[5]

local s = redis.call('HMGET', KEYS[1], 'state', 'epoch', 'since', 'open_for', 'probes',
  'probe_calls', 'probe_failures', 'probe_slow', 'calls', 'failures', 'slow', 'shape')
local state = s[1] or 'closed'
local epoch = tonumber(s[2]) or 0
local since = tonumber(s[3]) or now
local open_for = tonumber(s[4]) or open_ms
local probes, probe_calls = tonumber(s[5]) or 0, tonumber(s[6]) or 0
local probe_failures, probe_slow = tonumber(s[7]) or 0, tonumber(s[8]) or 0
local calls, failures, slow = tonumber(s[9]) or 0, tonumber(s[10]) or 0, tonumber(s[11]) or 0
if s[12] ~= shape then -- new, or another layout: a fresh window (the state is kept)
  redis.call('DEL', KEYS[2])
  calls, failures, slow = 0, 0, 0
end

local function clear_window()
  redis.call('DEL', KEYS[2])
  calls, failures, slow = 0, 0, 0
end

local function move(to)
  if to == 'open' then
    if state == 'half_open' and max_open_ms > 0 then
      open_for = math.min(open_for * 2, max_open_ms)
    else
      open_for = open_ms
    end
  elseif to == 'half_open' then
    probes, probe_calls, probe_failures, probe_slow = 0, 0, 0, 0
  elseif to == 'closed' then
    clear_window()
    open_for = open_ms
  end
  since, state, epoch = now, to, epoch + 1
end

-- A time window's totals: the buckets still inside it (the others are dropped).
local bucket = math.floor(now / bucket_ms)
local function time_totals()
  calls, failures, slow = 0, 0, 0
  local fields = redis.call('HGETALL', KEYS[2])
  for i = 1, #fields, 2 do
    local b, c, f, sl = string.match(fields[i + 1], '^(%-?%d+) (%d+) (%d+) (%d+)$')
    b = tonumber(b)
    if b and b > bucket - size and b <= bucket then
      calls, failures, slow = calls + c, failures + f, slow + sl
    else
      redis.call('HDEL', KEYS[2], fields[i])
    end
  end
end

local function add_calls(codes)
  if count_window then
    if #codes > size then codes = string.sub(codes, -size) end -- only the last `size` stay
    for i = 1, #codes do
      local code = tonumber(string.sub(codes, i, i))
      redis.call('LPUSH', KEYS[2], code)
      calls = calls + 1
      if code % 4 >= 2 then failures = failures + 1 end
      if code >= 4 then slow = slow + 1 end
      if calls > size then -- a full window: the oldest call makes room
        local old = tonumber(redis.call('RPOP', KEYS[2])) or 1
        calls = calls - 1
        if old % 4 >= 2 then failures = failures - 1 end
        if old >= 4 then slow = slow - 1 end
      end
    end
    return
  end
  local c, f, sl = 0, 0, 0
  for i = 1, #codes do
    local code = tonumber(string.sub(codes, i, i))
    c = c + 1
    if code % 4 >= 2 then f = f + 1 end
    if code >= 4 then sl = sl + 1 end
  end
  local field = tostring(bucket % size)
  local old = redis.call('HGET', KEYS[2], field)
  if old then
    local b, oc, of, os = string.match(old, '^(%-?%d+) (%d+) (%d+) (%d+)$')
    if tonumber(b) == bucket then c, f, sl = c + oc, f + of, sl + os end
  end
  redis.call('HSET', KEYS[2], field, bucket .. ' ' .. c .. ' ' .. f .. ' ' .. sl)
  time_totals()
end

local granted = 0
if not count_window then time_totals() end

if op == 'sync' then
  if state == 'closed' and epoch_arg == epoch and #arg > 0 then
    add_calls(arg)
    if calls >= minimum and (failures / calls >= failure_rate or slow / calls >= slow_rate) then
      move('open')
    end
  end
elseif op == 'probe' then
  if state == 'open' and now >= since + open_for then move('half_open') end
  if state == 'half_open' then
    -- Permits held longer than an open spell belong to a process that died: free them.
    if probes >= probes_max and now - since > open_for then probes = probe_calls end
    if probes < probes_max then
      probes = probes + 1
      granted = 1
    end
  end
elseif op == 'probe_end' then
  if state == 'half_open' and epoch_arg == epoch and probes > probe_calls then
    local code = tonumber(arg) or 0
    if code == 0 then
      probes = probes - 1 -- released: another probe may take its place
    else
      probe_calls = probe_calls + 1
      if code % 4 >= 2 then probe_failures = probe_failures + 1 end
      if code >= 4 then probe_slow = probe_slow + 1 end
      if probe_failures / probes_max >= failure_rate or probe_slow / probes_max >= slow_rate then
        move('open')
      elseif probe_calls >= probes_max then
        move('closed')
      end
    end
  end
elseif op == 'isolate' then
  if state ~= 'forced_open' then move('forced_open') end
elseif op == 'reset' then
  if state ~= 'closed' then
    move('closed')
  else
    clear_window()
    since, epoch = now, epoch + 1
  end
else
  return redis.error_reply('latencykit breaker: unknown op ' .. op)
end

redis.call('HSET', KEYS[1], 'state', state, 'epoch', epoch, 'since', since, 'open_for', open_for,
  'probes', probes, 'probe_calls', probe_calls, 'probe_failures', probe_failures,
  'probe_slow', probe_slow, 'calls', calls, 'failures', failures, 'slow', slow, 'shape', shape)
redis.call('PEXPIRE', KEYS[1], ttl_ms)
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ttl_ms) end

if epoch ~= (tonumber(s[2]) or 0) and channel then redis.call('PUBLISH', channel, KEYS[1]) end

local remaining = 0
if state == 'open' then remaining = math.max(0, since + open_for - now) end
local free = 0
if state == 'half_open' then free = probes_max - probes end
return {state, epoch, remaining, free, calls, failures, slow, granted}
