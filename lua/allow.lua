-- allow.lua: decide a group of budget checks atomically and, when every check is
-- admitted, spend them all. The semantics are those of the ratebudget in-process engine
-- (engine.go), in whole milliseconds of the server's clock (redis.call('TIME')).
--
-- KEYS[i]  the budget key of check i; all keys hash to one slot.
-- ARGV[1]  "1": decide and write (spend when all are admitted; trim aged rolling-window
--          events and give a counter found without a TTL its TTL back, either way);
--          "0": decide only, write nothing.
-- ARGV[2+5(i-1) .. 6+5(i-1)], for check i:
--          algorithm (0 fixed window, 1 token bucket, 2 rolling window),
--          limit (units per window; refill per window for the token bucket),
--          window (ms), capacity (units; equal to limit except for a token bucket), cost (units).
-- Reply: 6 integers per check, in KEYS order:
--          allowed (0/1), exceeded (0/1, cost > capacity), remaining (units, may be
--          negative if the limit was lowered), reset after (ms), retry after (ms),
--          and for an admitted rolling-window check the cumulative sum that names its log
--          entry (used by refund.lua), else 0.
--
-- State:
--   fixed window:   string counter, created with SET key cost PX window, then INCRBY.
--   token bucket:   hash {l = level in tokens x window ms, t = ms of the level}, PEXPIRE =
--                   time until full.
--   rolling window: sorted set of admitted events, score = ms (never decreasing), member =
--                   "<16-digit cumulative cost after the event>:<cost>"; events of one ms
--                   are merged. PEXPIRE = until the newest event leaves the window.
-- Every number stays an exact integer below 2^53.

local MAXLIMIT = 1099511627776      -- 2^40
local MAXSCALED = 9007199254740992  -- 2^53
local MAXWINDOW = 31622400000       -- 366 days in ms
local REBASE = 4503599627370496     -- 2^52: rebase cumulative sums above this

local n = #KEYS
if n == 0 or #ARGV ~= 1 + 5 * n then
  return redis.error_reply('ERR ratebudget: bad argument count')
end
local write = ARGV[1] == '1'
if not write and ARGV[1] ~= '0' then
  return redis.error_reply('ERR ratebudget: bad mode')
end

local function int(s, lo, hi)
  local v = tonumber(s)
  if v == nil or v ~= math.floor(v) or v < lo or v > hi then return nil end
  return v
end
local function fmt(x) return string.format('%.0f', x) end
-- Exact integer division of non-negative integers below 2^53 (fmod is exact).
local function floordiv(a, b) return (a - math.fmod(a, b)) / b end
local function ceildiv(a, b)
  if a <= 0 then return 0 end
  local r = math.fmod(a, b)
  local q = (a - r) / b
  if r > 0 then q = q + 1 end
  return q
end
local function member(acc, cost) return string.format('%016.0f:%.0f', acc, cost) end
local function parse(m)
  local a, c = string.match(m, '^(%d+):(%d+)$')
  return tonumber(a), tonumber(c)
end

-- Validate every argument before reading or writing anything: Redis has no rollback.
local algo, limit, win, cap, cost = {}, {}, {}, {}, {}
for i = 1, n do
  local b = 1 + 5 * (i - 1)
  algo[i] = int(ARGV[b + 1], 0, 2)
  limit[i] = int(ARGV[b + 2], 1, MAXLIMIT)
  win[i] = int(ARGV[b + 3], 1, MAXWINDOW)
  cap[i] = int(ARGV[b + 4], 1, MAXLIMIT)
  cost[i] = int(ARGV[b + 5], 1, MAXLIMIT)
  if not (algo[i] and limit[i] and win[i] and cap[i] and cost[i]) then
    return redis.error_reply('ERR ratebudget: bad argument for check ' .. i)
  end
  if algo[i] == 1 then
    if cap[i] > MAXSCALED / win[i] then
      return redis.error_reply('ERR ratebudget: capacity x window exceeds 2^53 for check ' .. i)
    end
  elseif cap[i] ~= limit[i] then
    return redis.error_reply('ERR ratebudget: capacity differs from limit for check ' .. i)
  end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Phase 1: read only. Compute every outcome and what an admission would write.
local reply = {}
local plan = {}
local all = true
for i = 1, n do
  local key, a, w, c = KEYS[i], algo[i], win[i], cost[i]
  local ok, exc, rem, reset, retry = 0, 0, 0, 0, 0
  local p = {}
  if a == 0 then
    local lim = limit[i]
    local count, left, fresh = 0, w, true
    local v = redis.call('GET', key)
    if v then
      local cnt = tonumber(v)
      if cnt == nil then return redis.error_reply('ERR ratebudget: corrupt counter in check ' .. i) end
      local pttl = redis.call('PTTL', key)
      if pttl == -1 then
        count, fresh, p.repair = cnt, false, true -- immortal counter: its window starts now
      elseif pttl > 0 then
        count, left, fresh = cnt, pttl, false
      end
    end
    p.fresh = fresh
    if c > lim then
      exc, rem = 1, lim - count
      if count > 0 then reset = left end
    elseif count + c > lim then
      rem, reset, retry = lim - count, left, left
    else
      ok, rem, reset = 1, lim - count - c, left
    end
  elseif a == 1 then
    local rate, capa = limit[i], cap[i]
    local full = capa * w
    local level, ts = full, now
    local h = redis.call('HMGET', key, 'l', 't')
    if h[1] or h[2] then
      local l, st = tonumber(h[1]), tonumber(h[2])
      if l == nil or st == nil or l < 0 then
        return redis.error_reply('ERR ratebudget: corrupt bucket in check ' .. i)
      end
      ts = st
      local elapsed = now - ts
      if elapsed < 0 then elapsed = 0 else ts = now end -- clock went back: no refill
      if elapsed >= ceildiv(full - l, rate) then level = full else level = l + elapsed * rate end
    end
    local need = c * w
    if c > capa then
      exc, rem, reset = 1, floordiv(level, w), ceildiv(full - level, rate)
    elseif level < need then
      rem, reset, retry = floordiv(level, w), ceildiv(full - level, rate), ceildiv(need - level, rate)
    else
      level = level - need
      local tofull = ceildiv(full - level, rate)
      ok, rem, reset = 1, floordiv(level, w), tofull
      p.level, p.ts, p.ttl = level, ts, ts + tofull - now
    end
  else
    local lim = limit[i]
    local sum, last, base, nacc, ncost, first = 0, 0, 0, 0, 0, nil
    local oldest = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now - w), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if #oldest > 0 then
      first = oldest[1]
      local oacc, ocost = parse(first)
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      nacc, ncost = parse(newest[1])
      last = tonumber(newest[2])
      if not (oacc and ocost and nacc and ncost and last) then
        return redis.error_reply('ERR ratebudget: corrupt log in check ' .. i)
      end
      base = oacc - ocost
      sum = nacc - base
      reset = last + w - now
    end
    local at = math.max(now, last) -- keep events in order if the clock went back
    if c > lim then
      exc, rem = 1, lim - sum
    elseif sum + c > lim then
      rem, retry = lim - sum, reset
      -- The oldest event whose leaving frees enough: binary search by rank over
      -- cumulative sums (each rank read is O(log n)).
      local need = sum + c - lim
      local lo = redis.call('ZRANK', key, first)
      local hi = redis.call('ZCARD', key) - 1
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        local e = redis.call('ZRANGE', key, mid, mid)
        local acc = parse(e[1])
        if acc == nil then return redis.error_reply('ERR ratebudget: corrupt log in check ' .. i) end
        if acc - base >= need then hi = mid else lo = mid + 1 end
      end
      local e = redis.call('ZRANGE', key, lo, lo, 'WITHSCORES')
      retry = tonumber(e[2]) + w - now
    else
      ok, rem, reset = 1, lim - sum - c, at + w - now
      p.at, p.base, p.nacc, p.ncost, p.last = at, base, nacc, ncost, last
      p.empty = first == nil
    end
  end
  if ok == 0 then all = false end
  plan[i] = p
  local r = #reply
  reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5], reply[r + 6] = ok, exc, rem, reset, retry, 0
end

if not write then return reply end

-- Phase 2: housekeeping that changes no outcome, then the spend if all were admitted.
for i = 1, n do
  local a, p, key = algo[i], plan[i], KEYS[i]
  if a == 0 and p.repair and not all then
    redis.call('PEXPIRE', key, fmt(win[i]))
  elseif a == 2 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - win[i]))
  end
end
if not all then return reply end

for i = 1, n do
  local a, p, key, c, w = algo[i], plan[i], KEYS[i], cost[i], win[i]
  if a == 0 then
    if p.fresh then
      redis.call('SET', key, fmt(c), 'PX', fmt(w))
    else
      redis.call('INCRBY', key, fmt(c))
      if p.repair then redis.call('PEXPIRE', key, fmt(w)) end
    end
  elseif a == 1 then
    redis.call('HSET', key, 'l', fmt(p.level), 't', fmt(p.ts))
    redis.call('PEXPIRE', key, fmt(p.ttl))
  else
    local nacc = p.nacc
    if p.empty then
      nacc = 0
    elseif nacc + c > REBASE then
      -- Rewrite the window's events with sums relative to the oldest one.
      local evs = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
      redis.call('DEL', key)
      for j = 1, #evs, 2 do
        local acc, ec = parse(evs[j])
        redis.call('ZADD', key, evs[j + 1], member(acc - p.base, ec))
      end
      nacc = nacc - p.base
    end
    local acc = nacc + c
    if not p.empty and p.last == p.at then
      redis.call('ZREM', key, member(nacc, p.ncost))
      redis.call('ZADD', key, fmt(p.at), member(acc, p.ncost + c))
    else
      redis.call('ZADD', key, fmt(p.at), member(acc, c))
    end
    redis.call('PEXPIRE', key, fmt(p.at + w - now))
    reply[6 * i] = acc
  end
end
return reply
