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
-- per call, only when a rolling window is decided. Lua work is kept small next to the
-- commands: no closure is created, a single check keeps its state in locals and
-- builds one table (the reply), and a group builds two (the reply and S, created at
-- their final size for 2 or 3 checks, since growing a Lua table costs more than a
-- command).
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
local tonumber, call = tonumber, redis.call
local fmod, format, match, find = math.fmod, string.format, string.match, string.find

-- Parse and validate every check before reading or writing anything (Redis has no
-- rollback). The algorithm is compared as a string, capacity as the limit's string
-- (equal except for a token bucket) and a cost of '1' needs no parsing: tonumber is the
-- costly part. (x % 1 ~= 0 also rejects NaN and infinities.) A single check's values
-- stay in locals; several checks' go to S, 11 per check: these 5, then the 6 plan values
-- below. S and the reply are created at their size for 2 or 3 checks (growing a Lua
-- table costs more than the commands).
local a, lim, w, capa, k
local S, reply
if n == 2 then
  S, reply = {0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}, {0,0,0,0,0,0,0,0,0,0,0,0}
elseif n == 3 then
  S, reply = {0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}, {0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}
elseif n > 3 then
  S, reply = {}, {}
end
for i = 1, n do
  local b = 5 * i - 3
  local as, ls, cs, ks = ARGV[b], ARGV[b + 1], ARGV[b + 3], ARGV[b + 4]
  a, lim, w = 0, tonumber(ls), tonumber(ARGV[b + 2])
  capa, k = lim, 1
  if ks ~= '1' then k = tonumber(ks) end
  if as == '1' then
    a, capa = 1, tonumber(cs)
  elseif as == '2' then
    a = 2
  elseif as ~= '0' then
    a = nil
  end
  if not (a and lim and w and capa and k)
    or lim % 1 ~= 0 or lim < 1 or lim > MAXLIMIT or w % 1 ~= 0 or w < 1 or w > MAXWINDOW
    or capa % 1 ~= 0 or capa < 1 or capa > MAXLIMIT or k % 1 ~= 0 or k < 1 or k > MAXLIMIT then
    return redis.error_reply('ERR ratebudget: bad argument for check ' .. i)
  end
  if a == 1 then
    if capa > MAXSCALED / w then
      return redis.error_reply('ERR ratebudget: capacity x window exceeds 2^53 for check ' .. i)
    end
  elseif cs ~= ls then
    return redis.error_reply('ERR ratebudget: capacity differs from limit for check ' .. i)
  end
  if S then
    local p = 11 * i
    S[p - 10], S[p - 9], S[p - 8], S[p - 7], S[p - 6] = a, lim, w, capa, k
  end
end

local now -- server time in ms, read on first use

-- Phase 1: read (and trim aged rolling-window events, which changes no outcome); compute
-- every outcome and what an admission would write (x1..x6, per algorithm below).
local all = true
local x1, x2, x3, x4, x5, x6 -- the last check's, for a single check
local ok, exc, rem, reset, retry
for i = 1, n do
  local key = KEYS[i]
  if S then
    local p = 11 * i
    a, lim, w, capa, k = S[p - 10], S[p - 9], S[p - 8], S[p - 7], S[p - 6]
  end
  ok, exc, rem, reset, retry = 0, 0, 0, 0, 0
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
      call('PEXPIRE', key, w) -- the spend repeats it on admission
    end
  elseif a == 1 then
    -- x1: new deficit, x2: its TTL (lag + time until full).
    local rate, full = lim, capa * w
    local d, lag, fix = 0, 0, false -- the deficit now (full - level), the backward clock's lag, a TTL to give back
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
      call('PEXPIRE', key, fix) -- the spend's SET PX repeats it on admission
    end
  else
    -- x1: time of the event, x2: cumulative sum before the window, x3, x4: the newest
    -- event's sum and cost, x5: its time, x6: its member (false: no event in the window).
    if not now then
      local t = call('TIME')
      local us = tonumber(t[2])
      now = tonumber(t[1]) * 1000 + (us - us % 1000) / 1000
    end
    local sum, last, base, nacc, ncost, nmember = 0, 0, 0, 0, 0, false
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
      nmember = newest[1]
      local na, nc = match(nmember, '^(%d+):(%d+)$')
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
      x1, x2, x3, x4, x5, x6 = at, base, nacc, ncost, last, nmember
    end
  end
  if ok == 0 then all = false end
  if S then
    local r = 6 * i
    reply[r - 5], reply[r - 4], reply[r - 3], reply[r - 2], reply[r - 1], reply[r] = ok, exc, rem, reset, retry, 0
    local p = 11 * i
    S[p - 5], S[p - 4], S[p - 3], S[p - 2], S[p - 1], S[p] = x1, x2, x3, x4, x5, x6
  end
end

-- Phase 2: the spend, every check being admitted. It writes each check's new state and,
-- for a rolling window, its event's cumulative sum into the reply.
if not (write and all) then
  if S then return reply end
  return {ok, exc, rem, reset, retry, 0}
end
for i = 1, n do
  local key = KEYS[i]
  if S then
    local p = 11 * i
    a, w, k = S[p - 10], S[p - 8], S[p - 6]
    x1, x2, x3, x4, x5, x6 = S[p - 5], S[p - 4], S[p - 3], S[p - 2], S[p - 1], S[p]
  end
  local acc = 0
  if a == 0 then
    if x1 then
      call('SET', key, k, 'PX', w)
    else
      call('INCRBY', key, k)
      if x2 then call('PEXPIRE', key, w) end
    end
  elseif a == 1 then
    call('SET', key, x1, 'PX', x2)
  else
    local at, base, nacc, ncost, last, newest = x1, x2, x3, x4, x5, x6
    if not newest then
      nacc = 0
    elseif nacc + k > REBASE then
      -- Rewrite the window's events with sums relative to the oldest one.
      local evs = call('ZRANGE', key, 0, -1, 'WITHSCORES')
      call('DEL', key)
      for j = 1, #evs, 2 do
        local eacc, ec = match(evs[j], '^(%d+):(%d+)$')
        call('ZADD', key, evs[j + 1], format('%016.0f:%.0f', tonumber(eacc) - base, tonumber(ec)))
      end
      nacc = nacc - base
      newest = format('%016.0f:%.0f', nacc, ncost)
    end
    acc = nacc + k
    if newest and last == at then
      call('ZREM', key, newest)
      call('ZADD', key, at, format('%016.0f:%.0f', acc, ncost + k))
    else
      call('ZADD', key, at, format('%016.0f:%.0f', acc, k))
    end
    call('PEXPIRE', key, at + w - now)
  end
  if not S then return {ok, exc, rem, reset, retry, acc} end
  reply[6 * i] = acc
end
return reply
