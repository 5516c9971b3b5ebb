-- settle.lua: give back what allow.lua spent for a group of admitted checks, as far as
-- that spend still counts, and release or renew their in-flight leases (docs/SETTLING.md).
-- The extra of a settle above its reservation is spent by allow.lua in mode '3'.
--
-- KEYS[i]  the budget key of check i; all keys hash to one slot (or live on one server).
-- ARGV[1]  'settle' (give back and release) or 'renew' (renew leases, nothing else).
-- ARGV[2+8(i-1) .. 9+8(i-1)], for check i:
--          algorithm (0 fixed, 1 token, 2 rolling, 3 in-flight), limit, window (ms),
--          capacity, the units to give back (0: none), and the ticket allow.lua gave in
--          mode '2': the rolling event's cumulative sum (else 0), the window's
--          PEXPIRETIME, the event's or the lease's time (ms; 0 for a token bucket), and
--          the lease member for an in-flight check (else '-').
-- Reply: one integer per check: 1 if it was given back, released or renewed, 0 if the
--          state no longer allowed it (the window closed, the event is no longer the
--          newest or left the window, the lease expired); nothing is written then.
--
-- A fixed window is given back only while its PEXPIRETIME is the ticket's (the same
-- window); a count back to 0 deletes the key, so that the next admission opens its own
-- window. A token bucket's deficit (read with PTTL as allow.lua reads it, up to 2 x
-- full in debt) is lowered, never below a full bucket. A rolling-window event is given
-- back only while it is the newest and has the ticket's time and sum (as refund.lua).

local MAXLIMIT = 1099511627776      -- 2^40
local MAXSCALED = 9007199254740992  -- 2^53
local MAXWINDOW = 31622400000       -- 366 days in ms

local n = #KEYS
if n == 0 or #ARGV ~= 1 + 8 * n then
  return redis.error_reply('ERR ratebudget: bad argument count')
end
local renewing = ARGV[1] == 'renew'
if not renewing and ARGV[1] ~= 'settle' then
  return redis.error_reply('ERR ratebudget: bad mode')
end
local call = redis.call
local function int(s, lo, hi)
  local v = tonumber(s)
  if v == nil or v ~= math.floor(v) or v < lo or v > hi then return nil end
  return v
end
local function ceildiv(a, b)
  if a <= 0 then return 0 end
  local r = math.fmod(a, b)
  local q = (a - r) / b
  if r > 0 then q = q + 1 end
  return q
end

local args = {}
for i = 1, n do
  local b = 1 + 8 * (i - 1)
  local a = {
    algo = int(ARGV[b + 1], 0, 3), limit = int(ARGV[b + 2], 1, MAXLIMIT),
    win = int(ARGV[b + 3], 1, MAXWINDOW), cap = int(ARGV[b + 4], 1, MAXLIMIT),
    give = int(ARGV[b + 5], 0, MAXLIMIT), aux = int(ARGV[b + 6], 0, MAXSCALED),
    at = int(ARGV[b + 7], 0, MAXSCALED), member = ARGV[b + 8],
  }
  if not (a.algo and a.limit and a.win and a.cap and a.give and a.aux and a.at) then
    return redis.error_reply('ERR ratebudget: bad argument for check ' .. i)
  end
  if a.algo == 1 and a.cap > MAXSCALED / a.win then
    return redis.error_reply('ERR ratebudget: capacity x window exceeds 2^53 for check ' .. i)
  end
  if a.algo == 3 and not (string.find(a.member, '^%x+$') and #a.member <= 32) then
    return redis.error_reply('ERR ratebudget: bad lease for check ' .. i)
  end
  args[i] = a
end

local now
local function clock()
  if not now then
    local t = call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end

local reply = {}
for i = 1, n do
  local a, key = args[i], KEYS[i]
  local done = 0
  if a.algo == 3 then
    if renewing then
      local s = call('ZSCORE', key, a.member)
      if s and tonumber(s) > clock() then
        local at = now + a.win
        local last = tonumber(call('ZRANGE', key, '-1', '-1', 'WITHSCORES')[2])
        if last > at then at = last end
        call('ZADD', key, 'XX', at, a.member)
        call('PEXPIREAT', key, at)
        done = 1
      end
    else
      done = call('ZREM', key, a.member)
    end
  elseif renewing or a.give == 0 then
    done = 0
  elseif a.algo == 0 then
    if call('PEXPIRETIME', key) == a.at then
      local v = tonumber(call('GET', key))
      if v and v <= a.give then
        call('DEL', key)
        done = 1
      elseif v then
        call('DECRBY', key, a.give) -- keeps the TTL
        done = 1
      end
    end
  elseif a.algo == 1 then
    local v = call('GET', key)
    local d = v and string.find(v, '^%d+$') and tonumber(v)
    local w, rate = a.win, a.limit
    local full = a.cap * w
    if d and d <= 2 * full and d <= MAXSCALED then
      local lag = 0
      local pttl = call('PTTL', key)
      if pttl ~= -1 then
        local t = ceildiv(d, rate)
        local elapsed = t - pttl
        if elapsed < 0 then
          lag = -elapsed
        elseif elapsed >= t then
          d = 0
        else
          d = d - elapsed * rate
        end
      end
      local give = a.give
      if give > a.cap then give = a.cap end -- an admitted cost is at most the capacity
      d = d - give * w
      if d <= 0 then
        call('DEL', key)
      else
        call('SET', key, d, 'PX', lag + ceildiv(d, rate))
      end
      done = 1
    end
  else
    local newest = call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if #newest > 0 and tonumber(newest[2]) == a.at and a.at > clock() - a.win then
      local acc, c, tail = string.match(newest[1], '^(%d+):(%d+)(.*)$')
      acc, c = tonumber(acc), tonumber(c)
      local give = a.give
      if c and give > c then give = c end
      local last
      if acc == a.aux and c and give > 0 then
        if c > give then
          tail = string.match(tail, '^:%d+(:%d+:%d+)$') or ''
          call('ZADD', key, newest[2], (acc - give) .. ':' .. (c - give) .. ':' .. newest[2] .. tail)
          call('ZREM', key, newest[1])
          last = newest[2]
        else
          call('ZREM', key, newest[1])
          local prev = call('ZRANGE', key, -1, -1, 'WITHSCORES')
          local head, ptail
          if #prev > 0 then head, ptail = string.match(prev[1], '^(%d+:%d+):%d+(:%d+:%d+)$') end
          if head and ptail ~= string.match(tail, '^:%d+(:%d+:%d+)$') then
            call('ZADD', key, prev[2], head .. ':' .. prev[2])
            call('ZREM', key, prev[1])
          end
          if #prev > 0 then last = prev[2] end
        end
        if last then call('PEXPIREAT', key, tonumber(last) + a.win) end
        done = 1
      end
    end
  end
  reply[i] = done
end
return reply
