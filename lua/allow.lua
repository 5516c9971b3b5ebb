-- allow.lua: decide a group of budget checks atomically and, when every check is
-- admitted, spend them all. The semantics are those of the ratebudget in-process engine
-- (engine.go), in whole milliseconds of the server's clock (redis.call('TIME') for a
-- rolling window, key TTLs for a token bucket).
--
-- KEYS[i]  the budget key of check i; all keys hash to one slot.
-- ARGV[1]  "1": decide and write (spend when all are admitted; trim aged rolling-window
--          events and give a counter or bucket found without a TTL its TTL back, either
--          way); "0": decide only, write nothing.
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
--   token bucket:   string integer d, the deficit (full - level, in tokens x window ms;
--                   rate = limit per ms, full = capacity x window) at the time of the
--                   write, written with SET key d PX lag + ceil(d / rate): the key expires
--                   when the bucket is full again, and no key is a full bucket. Redis
--                   keeps the expiry as an absolute time and PTTL = expiry - now, so a
--                   reader gets the time since the write as ceil(d / rate) - PTTL; below
--                   zero, the clock went back by that much (the lag: no refill, and
--                   every wait includes it, as in engine.go). A value without a TTL
--                   counts as written now; a deficit above full (a lowered capacity) is
--                   an empty bucket; a value that is not a decimal integer below 2^53 is
--                   an error reply.
--   rolling window: sorted set of admitted events, score = ms (never decreasing), member =
--                   "<16-digit cumulative cost after the event>:<cost>"; events of one ms
--                   are merged. PEXPIRE = until the newest event leaves the window.
-- Every number stays an exact integer below 2^53.
--
-- Cost per check, in server commands: fixed window GET, PTTL (when the counter exists),
-- then SET or INCRBY on admission; token bucket GET, PTTL (when the bucket exists), then
-- SET with PX on admission (PEXPIRE when a bucket without a TTL is refused); rolling
-- window the oldest and newest events, then ZADD (and ZREM when the newest event's
-- millisecond is merged) and PEXPIRE on admission, plus ZREMRANGEBYSCORE when events
-- have aged out and a binary search over ranks for a refusal's retry time. TIME once
-- per call, only when a rolling window is decided. The script creates no table per
-- check apart from the reply (and one plan table for a group of several checks).
-- Numbers are passed to redis.call as Lua numbers: Redis formats them with %.17g, exact
-- for integers below 2^53 (Lua's own number-to-string conversion, %.14g, would round
-- above 14 digits, so strings are built with %.0f).

local n = #KEYS
if n == 0 or #ARGV ~= 1 + 5 * n then
  return redis.error_reply('ERR ratebudget: bad argument count')
end
local write = ARGV[1] == '1'
if not write and ARGV[1] ~= '0' then
  return redis.error_reply('ERR ratebudget: bad mode')
end

local MAXLIMIT = 1099511627776      -- 2^40
local MAXSCALED = 9007199254740992  -- 2^53
local MAXWINDOW = 31622400000       -- 366 days in ms
local REBASE = 4503599627370496     -- 2^52: rebase cumulative sums above this
local tonumber = tonumber
local call = redis.call

-- args returns check i's algorithm, limit, window, capacity and cost, or nil and an
-- error reply. The algorithm is compared as a string, capacity as the limit's string
-- (equal except for a token bucket) and a cost of '1' needs no parsing: tonumber is the
-- costly part. (x % 1 ~= 0 also rejects NaN and infinities.)
local function args(i)
  local b = 5 * i - 3
  local as, ls, cs, ks = ARGV[b], ARGV[b + 1], ARGV[b + 3], ARGV[b + 4]
  local a, l, w = 0, tonumber(ls), tonumber(ARGV[b + 2])
  local c, k = l, 1
  if ks ~= '1' then k = tonumber(ks) end
  if as == '1' then
    a, c = 1, tonumber(cs)
  elseif as == '2' then
    a = 2
  elseif as ~= '0' then
    a = nil
  end
  if not (a and l and w and c and k)
    or l % 1 ~= 0 or l < 1 or l > MAXLIMIT or w % 1 ~= 0 or w < 1 or w > MAXWINDOW
    or c % 1 ~= 0 or c < 1 or c > MAXLIMIT or k % 1 ~= 0 or k < 1 or k > MAXLIMIT then
    return nil, redis.error_reply('ERR ratebudget: bad argument for check ' .. i)
  end
  if a == 1 then
    if c > MAXSCALED / w then
      return nil, redis.error_reply('ERR ratebudget: capacity x window exceeds 2^53 for check ' .. i)
    end
  elseif cs ~= ls then
    return nil, redis.error_reply('ERR ratebudget: capacity differs from limit for check ' .. i)
  end
  return a, l, w, c, k
end

-- Validate every argument before writing anything: Redis has no rollback. A single
-- check is validated below, before its first command.
if n > 1 then
  for i = 1, n do
    local a, err = args(i)
    if not a then return err end
  end
end

local fmod, format, match, find = math.fmod, string.format, string.match, string.find
local now -- server time in ms, read on first use

-- spend writes an admitted check's new state (see the plan values below) and returns the
-- rolling window's cumulative sum, else 0.
local function spend(key, a, w, k, x1, x2, x3, x4, x5, x6)
  if a == 0 then
    if x1 then
      call('SET', key, k, 'PX', w)
    else
      call('INCRBY', key, k)
      if x2 then call('PEXPIRE', key, w) end
    end
    return 0
  elseif a == 1 then
    call('SET', key, x1, 'PX', x2)
    return 0
  end
  local at, base, nacc, ncost, last, empty = x1, x2, x3, x4, x5, x6
  if empty then
    nacc = 0
  elseif nacc + k > REBASE then
    -- Rewrite the window's events with sums relative to the oldest one.
    local evs = call('ZRANGE', key, 0, -1, 'WITHSCORES')
    call('DEL', key)
    for j = 1, #evs, 2 do
      local acc, ec = match(evs[j], '^(%d+):(%d+)$')
      call('ZADD', key, evs[j + 1], format('%016.0f:%.0f', tonumber(acc) - base, tonumber(ec)))
    end
    nacc = nacc - base
  end
  local acc = nacc + k
  if not empty and last == at then
    call('ZREM', key, format('%016.0f:%.0f', nacc, ncost))
    call('ZADD', key, at, format('%016.0f:%.0f', acc, ncost + k))
  else
    call('ZADD', key, at, format('%016.0f:%.0f', acc, k))
  end
  call('PEXPIRE', key, at + w - now)
  return acc
end

-- Phase 1: read (and trim aged rolling-window events, which changes no outcome); compute
-- every outcome and what an admission would write.
local reply, plan -- for several checks: 6 reply and 9 plan values (a, w, cost, x1..x6) per check
if n > 1 then reply, plan = {}, {} end
local all = true
local a, w, k, x1, x2, x3, x4, x5, x6 -- the last check's, for a single check
local ok1, exc1, rem1, reset1, retry1
for i = 1, n do
  local key = KEYS[i]
  local lim, capa
  a, lim, w, capa, k = args(i)
  if not a then return lim end
  local ok, exc, rem, reset, retry = 0, 0, 0, 0, 0
  local fix = false -- a token bucket's TTL to give back (it had none)
  x1, x2, x3, x4, x5, x6 = false, false, 0, 0, 0, false
  if a == 0 then
    -- x1: create the counter; x2: give an immortal counter its TTL.
    local count, left = 0, w
    local v = call('GET', key)
    x1 = true
    if v then
      local cnt = tonumber(v)
      if cnt == nil then return redis.error_reply('ERR ratebudget: corrupt counter in check ' .. i) end
      local pttl = call('PTTL', key)
      if pttl == -1 then
        count, x1, x2 = cnt, false, true -- immortal counter: its window starts now
      elseif pttl > 0 then
        count, left, x1 = cnt, pttl, false
      end
    end
    if k > lim then
      exc, rem = 1, lim - count
      if count > 0 then reset = left end
    elseif count + k > lim then
      rem, reset, retry = lim - count, left, left
    else
      ok, rem, reset = 1, lim - count - k, left
    end
    if x2 and write and (ok == 0 or n > 1) then
      call('PEXPIRE', key, w) -- spend repeats it on admission
    end
  elseif a == 1 then
    -- x1: new deficit, x2: its TTL (lag + time until full).
    local rate, full = lim, capa * w
    local d, lag = 0, 0 -- the deficit now (full - level) and the backward clock's lag
    local v = call('GET', key)
    if v then
      if not find(v, '^%d+$') then
        return redis.error_reply('ERR ratebudget: corrupt bucket in check ' .. i)
      end
      d = tonumber(v)
      if d > MAXSCALED then
        return redis.error_reply('ERR ratebudget: corrupt bucket in check ' .. i)
      end
      -- The deficit was written with PX = lag + ceil(d / rate), so the time since the
      -- bucket's timestamp is ceil(d / rate) - PTTL; negative when the clock went back.
      local r = fmod(d, rate)
      local t = (d - r) / rate
      if r > 0 then t = t + 1 end
      local pttl = call('PTTL', key)
      if pttl == -1 then
        -- No TTL (written by hand): its time is now; give it its TTL back.
        if write then fix = t end
      else
        local elapsed = t - pttl
        if elapsed < 0 then
          -- The clock went back: no refill, keep the later timestamp. Refill resumes when
          -- the clock passes it again, so every wait below (and the TTL) includes the lag.
          lag = -elapsed
        elseif elapsed >= t then
          d = 0
        else
          d = d - elapsed * rate -- elapsed * rate < d: exact
        end
      end
      -- A deficit above full (the rule's capacity was lowered under the same name) is an
      -- empty bucket.
      if d > full then d = full end
    end
    -- wait(want) = 0 if want <= level, else lag + ceil((want - level) / rate)
    local level = full - d
    local need = k * w
    local tofull = 0
    if d > 0 then
      local r = fmod(d, rate)
      tofull = lag + (d - r) / rate
      if r > 0 then tofull = tofull + 1 end
    end
    if k > capa then
      exc, rem, reset = 1, (level - fmod(level, w)) / w, tofull
    elseif level < need then
      local e = need - level
      local r = fmod(e, rate)
      retry = lag + (e - r) / rate
      if r > 0 then retry = retry + 1 end
      rem, reset = (level - fmod(level, w)) / w, tofull
    else
      d = d + need
      level = full - d
      local r = fmod(d, rate)
      tofull = lag + (d - r) / rate
      if r > 0 then tofull = tofull + 1 end
      ok, rem, reset = 1, (level - fmod(level, w)) / w, tofull
      x1, x2 = d, tofull
    end
    if fix and (ok == 0 or n > 1) then
      call('PEXPIRE', key, fix) -- spend's SET PX repeats it on admission
    end
  else
    -- x1: time of the event, x2: cumulative sum before the window, x3, x4: the newest
    -- event's sum and cost, x5: its time, x6: no event in the window.
    if not now then
      local t = call('TIME')
      local us = tonumber(t[2])
      now = tonumber(t[1]) * 1000 + (us - us % 1000) / 1000
    end
    local sum, last, base, nacc, ncost = 0, 0, 0, 0, 0
    local edge = now - w
    local o
    if write then
      o = call('ZRANGE', key, 0, 0, 'WITHSCORES')
      if o[1] and tonumber(o[2]) <= edge then
        call('ZREMRANGEBYSCORE', key, '-inf', edge)
        o = call('ZRANGE', key, 0, 0, 'WITHSCORES')
      end
    else
      o = call('ZRANGEBYSCORE', key, '(' .. format('%.0f', edge), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    end
    local first = o[1]
    if first then
      local oacc, ocost = match(first, '^(%d+):(%d+)$')
      local newest = call('ZRANGE', key, -1, -1, 'WITHSCORES')
      local na, nc = match(newest[1], '^(%d+):(%d+)$')
      oacc, ocost, nacc, ncost, last = tonumber(oacc), tonumber(ocost), tonumber(na), tonumber(nc), tonumber(newest[2])
      if not (oacc and ocost and nacc and ncost and last) then
        return redis.error_reply('ERR ratebudget: corrupt log in check ' .. i)
      end
      base = oacc - ocost
      sum = nacc - base
      reset = last + w - now
    end
    local at = now
    if last > now then at = last end -- keep events in order if the clock went back
    if k > lim then
      exc, rem = 1, lim - sum
    elseif sum + k > lim then
      rem, retry = lim - sum, reset
      -- The oldest event whose leaving frees enough: binary search by rank over
      -- cumulative sums (each rank read is O(log n)).
      local need = sum + k - lim
      local lo = call('ZRANK', key, first)
      local hi = call('ZCARD', key) - 1
      while lo < hi do
        local mid = (lo + hi - (lo + hi) % 2) / 2
        local e = call('ZRANGE', key, mid, mid)
        local acc = tonumber(match(e[1], '^(%d+):'))
        if acc == nil then return redis.error_reply('ERR ratebudget: corrupt log in check ' .. i) end
        if acc - base >= need then hi = mid else lo = mid + 1 end
      end
      local e = call('ZRANGE', key, lo, lo, 'WITHSCORES')
      retry = tonumber(e[2]) + w - now
    else
      ok, rem, reset = 1, lim - sum - k, at + w - now
      x1, x2, x3, x4, x5, x6 = at, base, nacc, ncost, last, first == nil
    end
  end
  if ok == 0 then all = false end
  ok1, exc1, rem1, reset1, retry1 = ok, exc, rem, reset, retry
  if plan then
    local r = 6 * i
    reply[r - 5], reply[r - 4], reply[r - 3], reply[r - 2], reply[r - 1], reply[r] = ok, exc, rem, reset, retry, 0
    local p = 9 * i
    plan[p - 8], plan[p - 7], plan[p - 6] = a, w, k
    plan[p - 5], plan[p - 4], plan[p - 3], plan[p - 2], plan[p - 1], plan[p] = x1, x2, x3, x4, x5, x6
  end
end

-- Phase 2: the spend, all checks being admitted.
if n == 1 then
  local acc = 0
  if write and all then acc = spend(KEYS[1], a, w, k, x1, x2, x3, x4, x5, x6) end
  return {ok1, exc1, rem1, reset1, retry1, acc}
end
if not (write and all) then return reply end
for i = 1, n do
  local p = 9 * i
  reply[6 * i] = spend(KEYS[i], plan[p - 8], plan[p - 7], plan[p - 6],
    plan[p - 5], plan[p - 4], plan[p - 3], plan[p - 2], plan[p - 1], plan[p])
end
return reply
