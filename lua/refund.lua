-- refund.lua: give back what allow.lua spent for a group of checks, best effort. Used
-- when a later group of the same decision refused (Redis has no cross-slot transaction).
--
-- KEYS[i]  the budget key of check i; all keys hash to one slot.
-- ARGV[6(i-1)+1 .. 6(i-1)+6], for check i:
--          algorithm (0 fixed window, 1 token bucket, 2 rolling window),
--          limit (units per window; refill per window for the token bucket),
--          window (ms), capacity (units), cost (units), and for a rolling window the
--          cumulative sum allow.lua replied for the admitted event (else 0).
-- Reply: one integer per check: 1 if the cost was given back, 0 if the state no longer
--          allowed an exact refund (the window closed, the bucket is gone, or the event
--          is no longer the newest); nothing is given back then.
--
-- State: as written by allow.lua (see its header). A refunded rolling-window event is
-- removed, or rewritten in allow.lua's current member form when it merged other
-- admissions; the event that becomes the newest loses its name of the window only if
-- the refunded admission trimmed events; and the key expires again when its newest
-- event leaves the window (PEXPIREAT, from that event's own time). A token bucket's
-- deficit is read with its PTTL as allow.lua reads it, lowered by cost x window and
-- rewritten with SET key deficit PX lag + ceil(deficit / rate), or deleted once the
-- bucket is full; a value that is not a decimal integer in [0, full] is left alone.

local MAXLIMIT = 1099511627776      -- 2^40
local MAXSCALED = 9007199254740992  -- 2^53
local MAXWINDOW = 31622400000       -- 366 days in ms

local n = #KEYS
if n == 0 or #ARGV ~= 6 * n then
  return redis.error_reply('ERR ratebudget: bad argument count')
end
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
  local b = 6 * (i - 1)
  local a = {
    algo = int(ARGV[b + 1], 0, 2), limit = int(ARGV[b + 2], 1, MAXLIMIT),
    win = int(ARGV[b + 3], 1, MAXWINDOW), cap = int(ARGV[b + 4], 1, MAXLIMIT),
    cost = int(ARGV[b + 5], 1, MAXLIMIT), aux = int(ARGV[b + 6], 0, MAXSCALED),
  }
  if not (a.algo and a.limit and a.win and a.cap and a.cost and a.aux) then
    return redis.error_reply('ERR ratebudget: bad argument for check ' .. i)
  end
  if a.algo == 1 and a.cap > MAXSCALED / a.win then
    return redis.error_reply('ERR ratebudget: capacity x window exceeds 2^53 for check ' .. i)
  end
  args[i] = a
end

local reply = {}
for i = 1, n do
  local a, key = args[i], KEYS[i]
  local done = 0
  if a.algo == 0 then
    local v = tonumber(redis.call('GET', key) or '0')
    if v and v == a.cost then
      redis.call('DEL', key)
      done = 1
    elseif v and v > a.cost then
      redis.call('DECRBY', key, a.cost) -- keeps the TTL
      done = 1
    end
  elseif a.algo == 1 then
    local v = redis.call('GET', key)
    local d = v and string.find(v, '^%d+$') and tonumber(v)
    local w, rate = a.win, a.limit
    local full = a.cap * w
    if d and d <= full then
      -- The time since the write is ceil(d / rate) - PTTL (see allow.lua); below zero
      -- the clock went back: no refill, and the new TTL keeps the lag.
      local lag = 0
      local pttl = redis.call('PTTL', key)
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
      d = d - a.cost * w
      if d <= 0 then
        redis.call('DEL', key)
      else
        redis.call('SET', key, d, 'PX', lag + ceildiv(d, rate))
      end
      done = 1
    end
  else
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if #newest > 0 then
      -- tail: the window's base and oldest event that allow.lua wrote with the event.
      local acc, c, tail = string.match(newest[1], '^(%d+):(%d+)(.*)$')
      acc, c = tonumber(acc), tonumber(c)
      local last -- the newest event's time after the refund, if any is left
      if acc == a.aux and c and c >= a.cost then
        -- A rewritten event is added before its old member is removed (the members
        -- differ: a lower cumulative sum, or fewer fields), so that the set is never
        -- empty in between: Redis would delete the key, and ZADD create it anew.
        if c > a.cost then
          -- The event stays the newest, and its tail still holds. Its time is its score
          -- (WITHSCORES writes integers exactly).
          tail = string.match(tail, '^:%d+(:%d+:%d+)$') or ''
          redis.call('ZADD', key, newest[2], (acc - a.cost) .. ':' .. (c - a.cost) .. ':' .. newest[2] .. tail)
          redis.call('ZREM', key, newest[1])
          last = newest[2]
        else
          redis.call('ZREM', key, newest[1]) -- if it was the only event, the key goes with it
          -- The event before it becomes the newest. Its tail names the window as it was
          -- before the refunded admission. If that admission named the same window, it
          -- trimmed nothing (a trim names a later oldest event), and the event is left
          -- as it is: the log is as before the admission. Otherwise the tail may name
          -- events that were trimmed: it is dropped, so that allow.lua reads the oldest
          -- event again.
          local prev = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
          local head, ptail
          if #prev > 0 then head, ptail = string.match(prev[1], '^(%d+:%d+):%d+(:%d+:%d+)$') end
          if head and ptail ~= string.match(tail, '^:%d+(:%d+:%d+)$') then
            redis.call('ZADD', key, prev[2], head .. ':' .. prev[2])
            redis.call('ZREM', key, prev[1])
          end
          if #prev > 0 then last = prev[2] end
        end
        -- The key expires when its newest event leaves the window, as allow.lua had it
        -- before the refunded admission moved it on (an absolute time: no clock read).
        if last then redis.call('PEXPIREAT', key, tonumber(last) + a.win) end
        done = 1
      end
    end
  end
  reply[i] = done
end
return reply
