-- A fleet-wide budget of extra requests (hedges, retries): deposits and withdrawals over a
-- sliding window of 10 slots, as latencykit.RetryBudget keeps them in one process.
--
-- KEYS[1]: a hash, field = slot number mod 10, value = "slot deposits withdrawals".
-- ARGV: slot ms, ratio, reserve (min_per_second x ttl), deposits to add, tokens wanted,
--       tokens given back (leased earlier, unused), ttl ms.
-- Withdraws up to the wanted tokens while the balance holds a whole one, atomically, and
-- returns {tokens granted, the balance left (a string: a float)}.

local slot_ms, ratio, reserve = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local deposits, want, give_back = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local ttl_ms = tonumber(ARGV[7])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local slot = math.floor(now / slot_ms)
local field = tostring(slot % 10)

local total_d, total_w, here_d, here_w = 0, 0, 0, 0
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local s, d, w = string.match(fields[i + 1], '^(%-?%d+) (%-?%d+) (%-?%d+)$')
  s = tonumber(s)
  if s and s > slot - 10 and s <= slot then
    total_d, total_w = total_d + d, total_w + w
    if s == slot then here_d, here_w = tonumber(d), tonumber(w) end
  else
    redis.call('HDEL', KEYS[1], fields[i])
  end
end

here_d, total_d = here_d + deposits, total_d + deposits
here_w, total_w = here_w - give_back, total_w - give_back
local balance = total_d * ratio + reserve - total_w
local granted = 0
if want > 0 and balance >= 1 then
  granted = math.min(want, math.floor(balance))
  here_w, total_w = here_w + granted, total_w + granted
  balance = balance - granted
end
if deposits ~= 0 or give_back ~= 0 or granted ~= 0 then
  redis.call('HSET', KEYS[1], field, slot .. ' ' .. here_d .. ' ' .. here_w)
end
redis.call('PEXPIRE', KEYS[1], ttl_ms)
return {granted, tostring(balance)}
