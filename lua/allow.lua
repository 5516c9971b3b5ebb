-- allow.lua: decide a group of budget checks atomically and, when every check is
-- admitted, spend them all. The semantics are those of the ratebudget in-process engine
-- (engine.go), in whole milliseconds of the server's clock (redis.call('TIME') for a
-- rolling window, key TTLs for a token bucket).
--
-- KEYS[i]  the budget key of check i; all keys hash to one slot, or live on one server
--          that is not a Redis Cluster node (the Go limiter's WithOneServer).
-- ARGV[1]  "1": decide and write (spend when all are admitted; trim aged rolling-window
--          events and give a counter or bucket found without a TTL its TTL back, either
--          way); "0": decide only, write nothing; "2", "3", "4": see Modes below.
-- ARGV[2+5(i-1) .. 6+5(i-1)], for check i:
--          algorithm (0 fixed window, 1 token bucket, 2 rolling window, 3 in-flight,
--          4 calendar), limit (units per window or period; refill per window for the
--          token bucket), window (ms; calendar: "b0:b1:b2:b3", the periods [b0, b1),
--          [b1, b2), [b2, b3) in Unix ms), capacity (units; equal to limit except for
--          a token bucket), cost (units).
-- Reply: 6 integers per check, in KEYS order:
--          allowed (0/1), exceeded (0/1, cost > capacity), remaining (units, negative
--          if the limit was lowered or a settle put the budget in debt), reset after
--          (ms), retry after (ms),
--          and for an admitted rolling-window check the cumulative sum that names its log
--          entry (a ticket's ID, used by settle.lua), else 0.
--          Remaining and reset after describe the budget as the call leaves it: after
--          the spend when every check was admitted and spent; else (a refusal, or
--          decide only) as it is, nothing spent, also for a check that fits (allowed 1):
--          its remaining before its cost, and the reset of what was spent before (0 for
--          an untouched budget, the fixed window's end, the bucket's time to refill its
--          deficit, the newest event leaving the window, the last lease expiring).
--
-- State:
--   calendar:       "<count>:<period start>" (another period's counts as none), SET PXAT
--                   the period's end. TIME in no period: the error '... miss server
--                   time <ms>', before any read or write.
--   fixed window:   string counter, created with SET key cost PX window, then INCRBY; a
--                   value not in INCRBY's decimal form, or beyond 2^53, is an error reply
--                   before any write (for a single check, INCRBY's own).
--   token bucket:   string "<d>:<t>:<w>": d, the deficit (full - level, in tokens x
--                   window ms; rate = limit per ms, full = capacity x window) when
--                   written, t = ceil(d / rate), its time until full, w the window (ms)
--                   of d's units; SET PX lag + t, so no key is a full bucket. The time
--                   since the write is t - PTTL at any rate (a changed Limit refills at
--                   its new rate, as in engine.go); below zero the clock went back (the
--                   lag: no refill, every wait includes it). Another window converts d
--                   to its units, rounded up, at most 2^53 (timerule's ConvertDeficit).
--                   "<d>:<t>" and "<d>" (older forms) are in the reader's units, the
--                   latter with t = ceil(d / rate). No TTL: written now. A deficit above
--                   full is debt, cut at 2 x full; another form, d beyond 2^53, t beyond
--                   d or w out of 1 ms..366 days is an error reply.
--   in-flight:      sorted set of leases, member = the caller's lease member, score =
--                   the lease's expiry (ms, now + window when taken or renewed); expired
--                   leases are trimmed when writing; PEXPIREAT = the newest expiry.
--   rolling window: sorted set of admitted events, score = ms (never decreasing), member =
--                   "<cumulative cost after the event>:<cost>:<ms>:<base>:<oldest ms>",
--                   all decimal, where base is the cumulative cost before the window's
--                   oldest event and oldest ms that event's time, both as they were when
--                   the event was written; events of one ms are merged. While that
--                   oldest event is still in the window no event has left it, so the
--                   newest event alone gives the window's sum (newest sum - base); once
--                   it has left, the oldest event in the window is read and aged events
--                   are trimmed, at most 1,024 per call (an event written while aged
--                   events are left names an oldest ms of 0, so that later calls trim
--                   the rest; an aged event is never counted). The member repeats the score so that reading an event needs
--                   no WITHSCORES (a double formatted by the server, parsed again here).
--                   Cumulative sums are rebased below 2^46, so Lua's own number-to-string
--                   conversion (%.14g) writes them exactly. A rebase rewrites the older
--                   events as "<sum>:<cost>:<ms>", and a refund can leave the newest
--                   so; such a member never names the window.
--                   PEXPIRE = until the newest event leaves the window.
-- Every number stays an exact integer below 2^53.
--
-- Cost per check, in server commands: fixed window GET, PTTL (when the counter exists),
-- then SET or INCRBY on admission; token bucket GET, PTTL (when the bucket exists), then
-- SET with PX on admission (PEXPIRE when a bucket without a TTL is refused); rolling
-- window the newest event, then on admission ZADD and PEXPIRE, or ZADD and ZREM when
-- the admission merges into the newest event (whose TTL already ends when it leaves
-- the window: the new member is added first, so the set never empties), plus
-- a read of the oldest event in the window, its ZRANK and a ZREMRANGEBYSCORE of at
-- most 1,024 aged events once events have left the window,
-- and a binary search over ranks for a refusal's retry time. A reservation that can be
-- voided (modes '5', '6') adds a GET of its marker per call, and a SET on admission.
-- calendar GET, then SET on admission. TIME once per call, only for a rolling window, a
-- lease or a calendar period; PEXPIRETIME once per call that replies tickets
-- (and once more per admitted fixed window). Lua work is kept small next to the
-- commands: no closure is created, a single check keeps its state in locals and
-- builds one table (the reply), and a group builds two (the reply and S).
-- Formatting a number costs about as much as a whole command, so the common paths
-- pass strings: the caller's window and cost strings (required in canonical decimal
-- form), the server time as TIME's own digits, and literal ranks. Numbers that must be
-- computed go to redis.call as Lua numbers, which Redis formats with %.17g, exact below
-- 2^53 (Lua's %.14g rounds above 14 digits); a token bucket's value is one format call.

local mode = ARGV[1]
-- Modes '5' and '6' are '2' and '4' for a reservation that can be voided: its marker
-- key is the last of KEYS (in the slot of the others), its TTL (ms, canonical decimal)
-- the last of ARGV. A marker found there (a void's tombstone: the caller was answered
-- without this reservation) makes the call a no-op, an error reply before any write;
-- else an admission writes, after its spend, the marker "<ticket>:<sum>" per check,
-- joined by ',' (the ticket and the sixth value replied), for a void to give it back.
local marker = (mode == '5' or mode == '6') and KEYS[#KEYS]
local n = #KEYS
local extra = 0
if marker then
  n, extra = n - 1, 1
  if mode == '5' then mode = '2' else mode = '4' end
  if not string.find(ARGV[#ARGV], '^[1-9]%d*$') then
    return redis.error_reply('ERR ratebudget: bad marker TTL')
  end
end
if n == 0 or #ARGV ~= 1 + extra + 5 * n and #ARGV ~= 1 + extra + 6 * n then
  return redis.error_reply('ERR ratebudget: bad argument count')
end
-- Modes: '0' decide only; '1' decide and spend; '2' as '1', and reply a ticket per check
-- after the 6n values (settle.lua's record of the spend: a fixed window's PEXPIRETIME,
-- a rolling-window event's or a lease's time, a calendar period's start, else 0); '3' force: spend every check
-- without refusing it, its cost cut so that a fixed or rolling window counts at most
-- twice its limit and a token bucket's deficit stays within 2 x full and 2^53 (the
-- extra of a settle above its reservation, run by settle.lua, which calls this script as
-- a function; never for in-flight checks); '4' as '2', and when the spend is made, reply
-- after the tickets each check's reset after (ms) as it was before the spend: for a
-- decision of several slot groups, whose spent groups are given back when a later
-- group refuses, and then reported as they are again (their remaining is the reply's
-- plus the cost).
local unspent = mode == '4'
local write, tickets, force = mode ~= '0', mode == '2' or unspent, mode == '3'
if not (write or mode == '0') or write and not (mode == '1' or tickets or force) then
  return redis.error_reply('ERR ratebudget: bad mode')
end
-- ARGV[2+5n .. 1+6n], when present: each check's lease member (16 hex digits) for an
-- in-flight check (algorithm 3), anything for the others.
local members = #ARGV == 1 + extra + 6 * n

local MAXLIMIT = 1099511627776      -- 2^40
local MAXSCALED = 9007199254740992  -- 2^53
local MAXWINDOW = 31622400000       -- 366 days in ms
local REBASE = 70368744177664       -- 2^46: rebase cumulative sums above this
local TRIM = 1024                   -- aged rolling-window events trimmed per call, at most
local tonumber, call = tonumber, redis.call
local fmod, format, match, find, sub = math.fmod, string.format, string.match, string.find, string.sub

-- Parse and validate every check before reading or writing anything (Redis has no
-- rollback). The algorithm is compared as a string, capacity as the limit's string
-- (equal except for a token bucket) and a cost of '1' needs no parsing: tonumber is the
-- costly part. (x % 1 ~= 0 also rejects NaN and infinities.) A single check's values
-- stay in locals; several checks' go to S, 12 per check: these 5, then the 7 plan values
-- below. Their tables are created at their final size, in one allocation each (a table
-- constructor takes all the values of the call that ends it: here 12n and 6n zeros),
-- since growing a Lua table costs more than a command.
local now, nowstr -- server time in ms (and its digits), read on first use
local a, lim, w, capa, k
local S, reply
if n > 1 and n <= 64 then
  local byte, rep = string.byte, string.rep
  S, reply = {byte(rep('\0', 12 * n), 1, -1)}, {byte(rep('\0', 6 * n), 1, -1)}
elseif n > 64 then
  S, reply = {}, {}
end
for i = 1, n do
  local b = 5 * i - 3
  local as, ls, ws, cs, ks = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  a, lim, w = 0, tonumber(ls), nil
  capa, k = lim, 1
  -- The window and cost strings are passed on to SET, PEXPIRE, INCRBY and rolling-window
  -- members as they are, so they must be plain decimals.
  if find(ws, '^[1-9]%d*$') then w = tonumber(ws) end
  if ks ~= '1' then k = find(ks, '^[1-9]%d*$') and tonumber(ks) end
  if as == '1' then
    a, capa = 1, tonumber(cs)
  elseif as == '2' then
    a = 2
  elseif as == '3' then
    a = 3
    if k ~= 1 or force or not members or not find(ARGV[1 + 5 * n + i], '^%x+$') or #ARGV[1 + 5 * n + i] > 32 then
      return redis.error_reply('ERR ratebudget: bad lease for check ' .. i)
    end
  elseif as == '4' then
    a = 4
    local b0, b1, b2, b3 = match(ws, '^(%d+):(%d+):(%d+):(%d+)$')
    b0, b1, b2, b3 = tonumber(b0), tonumber(b1), tonumber(b2), tonumber(b3)
    if b0 and b0 < b1 and b1 < b2 and b2 < b3 and b3 <= MAXSCALED then
      if not now then
        local t = call('TIME')
        nowstr = t[1] .. sub(sub('00000' .. t[2], -6), 1, 3)
        now = tonumber(nowstr)
      end
      if now < b0 or now >= b3 then
        return redis.error_reply('ERR ratebudget: calendar periods miss server time ' .. nowstr)
      end
      w = 1
    end
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
    local p = 12 * i
    S[p - 11], S[p - 10], S[p - 9], S[p - 8], S[p - 7] = a, lim, w, capa, k
  end
end

-- A ticket reads a fixed window's PEXPIRETIME after its spend: read it once now, so
-- that a server or user without it (Redis before 7.0, an ACL that does not grant it)
-- fails before any write rather than after the spend.
if tickets then call('PEXPIRETIME', KEYS[1]) end
if marker and call('GET', marker) then
  return redis.error_reply('ERR ratebudget: reservation voided')
end


-- Phase 1: read (and trim aged rolling-window events, which changes no outcome); compute
-- every outcome and what an admission would write (x1..x7, per algorithm below).
local all = true
local x1, x2, x3, x4, x5, x6, x7 -- the last check's, for a single check
-- idle: an admitted check's reset after as the budget is without its spend.
local ok, exc, rem, reset, retry, idle
for i = 1, n do
  local key = KEYS[i]
  if S then
    local p = 12 * i
    a, lim, w, capa, k = S[p - 11], S[p - 10], S[p - 9], S[p - 8], S[p - 7]
  end
  ok, exc, rem, reset, retry, idle = 0, 0, 0, 0, 0, 0
  x1, x2, x3, x4, x5, x6, x7 = false, false, 0, 0, 0, false, false
  local count, left = 0, w
  if a == 4 then
    -- Calendar: x2, x3 the period that holds TIME; x1 the count to write.
    local b0, b1, b2, b3 = match(ARGV[5 * i - 1], '^(%d+):(%d+):(%d+):(%d+)$')
    x2, x3 = b0, tonumber(b1)
    if now >= x3 then
      x2, x3 = b1, tonumber(b2)
      if now >= x3 then x2, x3 = b2, tonumber(b3) end
    end
    left = x3 - now
    local v = call('GET', key)
    if v then
      local cs, ss = match(v, '^(%d+):(%d+)$')
      if not cs or tonumber(cs) > MAXSCALED then
        return redis.error_reply('ERR ratebudget: corrupt counter in check ' .. i)
      end
      if ss == x2 then count = tonumber(cs) end
    end
  elseif a == 0 then
    -- x1: create the counter; x2: give an immortal counter its TTL.
    local v = call('GET', key)
    x1 = true
    if v then
      -- tonumber also reads '1.5', '05', ' 5', '0x5' or 'nan', which INCRBY refuses: in a
      -- group, after the earlier checks' writes, so a group's counters must be in INCRBY's
      -- own form. A single check's INCRBY is its first write and refuses such a value
      -- itself, so its path is spared the pattern match (a C call, as costly as a command).
      local cnt = tonumber(v)
      if n > 1 and not (v == '0' or find(v, '^%-?[1-9]%d*$')) then cnt = nil end
      if not cnt or cnt > MAXSCALED or cnt < -MAXSCALED then
        return redis.error_reply('ERR ratebudget: corrupt counter in check ' .. i)
      end
      local pttl = call('PTTL', key)
      if pttl == -1 then
        count, x1, x2 = cnt, false, true -- immortal counter: its window starts now
      elseif pttl > 0 then
        count, left, x1 = cnt, pttl, false
      end
    end
  end
  if a == 0 or a == 4 then
    if force then
      if count + k > 2 * lim then k = 2 * lim - count end
      if k < 0 then k = 0 end
      ok, rem, reset = 1, lim - count - k, left
    elseif k > lim then
      exc, rem = 1, lim - count
      if count > 0 then reset = left end
    elseif count + k > lim then
      rem, reset, retry = lim - count, left, left
    else
      ok, rem, reset = 1, lim - count - k, left
      if count ~= 0 then idle = left end
    end
    if a == 4 then
      x1 = count + k
    elseif x2 and write and (ok == 0 or n > 1) then
      call('PEXPIRE', key, ARGV[5 * i - 1]) -- the window; the spend repeats it on admission
    end
  elseif a == 1 then
    -- x1: the value to write ("<deficit>:<time until full>:<window>"), x2: its TTL (lag
    -- + time until full).
    local rate, full = lim, capa * w
    local d, lag, fix = 0, 0, false -- the deficit now (full - level), the backward clock's lag, a TTL to give back
    local ttl = -1 -- the bucket's PTTL: a refusal's waits end by then at the latest (the bucket is full once it expires)
    local v = call('GET', key)
    if v then
      local ds, ts, wv = match(v, '^(%d+):(%d+):(%d+)$')
      if not ds then
        ds, ts = match(v, '^(%d+):(%d+)$')
        if not ds then ds = match(v, '^%d+$') end
      end
      d = tonumber(ds)
      if not d or d > MAXSCALED or ts and tonumber(ts) > d then
        -- t = ceil(d / rate) for a rate of 1 to 2^40: at most d.
        return redis.error_reply('ERR ratebudget: corrupt bucket in check ' .. i)
      end
      if wv and wv ~= ARGV[5 * i - 1] then
        -- Written under another window (the rule's Window changed under the same name):
        -- the same number of tokens in this window's units, d x w / wo rounded up, at
        -- most 2^53, as timerule.ConvertDeficit. Exactly: d = q x wo + r, and r x w
        -- (up to 2^70) is divided in two parts, w split at 2^17, every product below 2^53.
        local wo = tonumber(wv)
        if wo < 1 or wo > MAXWINDOW then
          return redis.error_reply('ERR ratebudget: corrupt bucket in check ' .. i)
        end
        local r = fmod(d, wo)
        local q = (d - r) / wo
        if q > (MAXSCALED - fmod(MAXSCALED, w)) / w then
          d = MAXSCALED
        else
          local wl = fmod(w, 131072)
          local x = r * ((w - wl) / 131072)
          local rx = fmod(x, wo)
          local y = rx * 131072 + r * wl
          local ry = fmod(y, wo)
          local f = (x - rx) / wo * 131072 + (y - ry) / wo
          if ry > 0 then f = f + 1 end
          d = q * w + f -- above 2^53 it may round, but not below 2^53
          if d > MAXSCALED then d = MAXSCALED end
        end
      end
      -- The value was written with PX = lag + t, t its time until full at the writer's
      -- rate (ceil(d / rate), the reader's, for a value that does not name it), so the
      -- time since the bucket's timestamp is t - PTTL; negative when the clock went
      -- back. The writer's own t keeps a rule's rate changed under the same name from
      -- reading as time passed or as a clock gone back.
      local r = fmod(d, rate)
      local t = (d - r) / rate
      if r > 0 then t = t + 1 end
      local tw = t
      if ts then tw = tonumber(ts) end
      local pttl = call('PTTL', key)
      if pttl == -1 then
        -- No TTL (written by hand): its time is now; give it its TTL back.
        if write then fix = tw end
      else
        ttl = pttl
        local elapsed = tw - pttl
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
      -- A deficit above full is debt (a settle charged more than was reserved), at most
      -- one more full bucket; beyond that (the rule's capacity was lowered under the same
      -- name) it is cut there.
      if d > 2 * full then d = 2 * full end
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
    if force then
      local top = 2 * full
      if top > MAXSCALED then top = MAXSCALED end
      if d + need > top then need = top - d end
      if need < 0 then need = 0 end
    end
    if k > capa and not force then
      exc, rem, reset = 1, (level - fmod(level, w)) / w, tofull
      if ttl >= 0 and ttl < reset then reset = ttl end
    elseif level < need and not force then
      local e = need - level
      local r = fmod(e, rate)
      retry = lag + (e - r) / rate
      if r > 0 then retry = retry + 1 end
      rem, reset = (level - fmod(level, w)) / w, tofull
      if ttl >= 0 and ttl < retry then retry = ttl end
      if ttl >= 0 and ttl < reset then reset = ttl end
    else
      d = d + need
      level = full - d
      local r = fmod(d, rate)
      idle = tofull
      tofull = lag + (d - r) / rate
      if r > 0 then tofull = tofull + 1 end
      ok, rem, reset = 1, (level - fmod(level, w)) / w, tofull
      x1, x2 = format('%d:%d:%s', d, tofull - lag, ARGV[5 * i - 1]), tofull
    end
    if fix and (ok == 0 or n > 1) then
      call('PEXPIRE', key, fix) -- the spend's SET PX repeats it on admission
    end
  elseif a == 3 then
    -- In-flight leases: a sorted set of lease members scored by expiry (ms). x1: the new
    -- lease's expiry, now + window (also when a lease taken under a longer window of the
    -- rule's name, or before the clock went back, expires later); x2: the key's, the
    -- newest lease's expiry.
    if not now then
      local t = call('TIME')
      nowstr = t[1] .. sub(sub('00000' .. t[2], -6), 1, 3)
      now = tonumber(nowstr)
    end
    if write then call('ZREMRANGEBYSCORE', key, '-inf', nowstr) end
    local live = call('ZCOUNT', key, '(' .. nowstr, '+inf')
    local last = 0
    if live > 0 then last = tonumber(call('ZRANGE', key, '-1', '-1', 'WITHSCORES')[2]) end
    if last > now then reset = last - now end
    if live + 1 > lim then
      rem = lim - live
      retry = tonumber(call('ZRANGEBYSCORE', key, '(' .. nowstr, '+inf', 'WITHSCORES', 'LIMIT', '0', '1')[2]) - now
    else
      local at, top = now + w, now + w
      if last > top then top = last end
      ok, rem, idle, reset, x1, x2 = 1, lim - live - 1, reset, top - now, at, top
    end
  else
    -- x1: time of the event, x2: the cumulative sum before the window (the string
    -- written with the newest event, or a number to format once it is below 2^46),
    -- x3, x4: the newest event's sum and cost, x5: the newest event's time as written
    -- when the new event merges into it (else false), x6: its member (false: no event
    -- in the window), x7: the window's oldest event's time as written.
    if not now then
      local t = call('TIME')
      nowstr = t[1] .. sub(sub('00000' .. t[2], -6), 1, 3)
      now = tonumber(nowstr)
    end
    local sum, last, nacc, ncost, lastms = 0, 0, 0, 0, false
    local base, basestr, oms = 0, '0', nowstr -- an empty window: the new event is its oldest
    local edge = now - w
    local ofirst = false -- the oldest event in the window when aged events may precede it
    local nmember = call('ZRANGE', key, '-1', '-1')[1] or false
    if nmember then
      local na, nc, nt, nb, no = match(nmember, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
      if not na then
        na, nc, nt = match(nmember, '^(%d+):(%d+):(%d+)$')
      end
      nacc, ncost, last = tonumber(na), tonumber(nc), tonumber(nt)
      if not (nacc and ncost and last) then
        return redis.error_reply('ERR ratebudget: corrupt log in check ' .. i)
      end
      if last <= edge then
        -- Every event has left the window.
        if write then call('DEL', key) end
        nmember, nacc, ncost, last = false, 0, 0, 0
      else
        lastms = nt
        if no and tonumber(no) > edge then
          -- The oldest event of the window the newest was written in is still in the
          -- window: no event has left it since, and the base written then holds.
          basestr, oms = nb, no
          base = tonumber(nb)
        else
          -- Events have left the window (or the newest does not name it): trim them
          -- when writing, and read the oldest event that is left.
          -- Trimming frees at most TRIM aged events per call, so that a log left with
          -- many behind a newer event (a burst, then a quiet spell) never blocks the
          -- server for long: later calls trim the rest, and aged events still in the
          -- log are never counted (they precede the oldest event in the window).
          -- An event written while aged events are left names an oldest ms of 0, so
          -- that the next call trims on.
          local first, oacc, ocost
          local left = false
          first = call('ZRANGEBYSCORE', key, '(' .. format('%.0f', edge), '+inf', 'LIMIT', '0', '1')[1]
          ofirst = first
          if write and first then
            -- Scores are distinct (one event per ms), so trimming up to the score of the
            -- TRIM-th event trims TRIM events.
            local aged = call('ZRANK', key, first)
            if aged > TRIM then
              left = true
              call('ZREMRANGEBYSCORE', key, '-inf', call('ZRANGE', key, TRIM - 1, TRIM - 1, 'WITHSCORES')[2])
            elseif aged > 0 then
              call('ZREMRANGEBYSCORE', key, '-inf', format('%.0f', edge))
            end
          end
          if first then oacc, ocost, oms = match(first, '^(%d+):(%d+):(%d+)') end
          if left then oms = '0' end
          oacc, ocost = tonumber(oacc), tonumber(ocost)
          if not (oacc and ocost and oms) then
            return redis.error_reply('ERR ratebudget: corrupt log in check ' .. i)
          end
          base = oacc - ocost
          basestr = false -- formatted on admission, after any rebase
        end
        sum = nacc - base
        reset = last + w - now
      end
    end
    local at = now
    if last > now then at = last end -- keep events in order if the clock went back
    if force then
      if sum + k > 2 * lim then k = 2 * lim - sum end
      if k < 0 then k = 0 end
    end
    if k > lim and not force then
      exc, rem = 1, lim - sum
    elseif sum + k > lim and not force then
      rem, retry = lim - sum, reset
      -- The oldest event whose leaving frees enough: binary search by rank over
      -- cumulative sums (each rank read is O(log n)).
      local need = sum + k - lim
      local lo = 0 -- the oldest event in the window: aged ones were trimmed, or there are none
      if ofirst then lo = call('ZRANK', key, ofirst) end
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
      ok, rem, idle, reset = 1, lim - sum - k, reset, at + w - now
      if last ~= at then lastms = false end
      x1, x2, x3, x4, x5, x6, x7 = at, basestr or base, nacc, ncost, lastms, nmember, oms
    end
  end
  if ok == 0 then all = false end
  if S then
    local r = 6 * i
    -- The sixth value holds idle until phase 2 (or the refusal) replaces it.
    reply[r - 5], reply[r - 4], reply[r - 3], reply[r - 2], reply[r - 1], reply[r] = ok, exc, rem, reset, retry, idle
    local p = 12 * i
    S[p - 7] = k -- cut by force
    S[p - 6], S[p - 5], S[p - 4], S[p - 3], S[p - 2], S[p - 1], S[p] = x1, x2, x3, x4, x5, x6, x7
  end
end

-- Nothing is spent (a refusal, or decide only): a check that fits is reported with its
-- budget as it is, its cost not taken (the remaining of a token bucket, too, is short
-- by exactly its cost: whole units of tokens x window).
if not (write and all) then
  if S then
    for i = 1, n do
      local r = 6 * i
      if reply[r - 5] == 1 then
        reply[r - 3], reply[r - 2] = reply[r - 3] + S[12 * i - 7], reply[r]
      end
      reply[r] = 0
    end
    return reply
  end
  if ok == 1 then return {1, 0, rem + k, idle, 0, 0} end -- decide only
  return {ok, exc, rem, reset, retry, 0}
end

-- Phase 2: the spend, every check being admitted. It writes each check's new state and,
-- for a rolling window, its event's cumulative sum into the reply.
for i = 1, n do
  local key = KEYS[i]
  if S then
    local p = 12 * i
    a, w, k = S[p - 11], S[p - 9], S[p - 7]
    x1, x2, x3, x4, x5, x6, x7 = S[p - 6], S[p - 5], S[p - 4], S[p - 3], S[p - 2], S[p - 1], S[p]
  end
  local acc, tk = 0, 0
  local ws, ks = ARGV[5 * i - 1], ARGV[5 * i + 1] -- this check's window and cost strings
  if force then ks = format('%d', k) end
  if a == 0 then
    if x1 then
      call('SET', key, ks, 'PX', ws)
    else
      call('INCRBY', key, ks)
      if x2 then call('PEXPIRE', key, ws) end
    end
    if tickets then tk = call('PEXPIRETIME', key) end
  elseif a == 1 then
    call('SET', key, x1, 'PX', x2)
  elseif a == 4 then
    if k > 0 then call('SET', key, format('%d:%s', x1, x2), 'PXAT', x3) end
    tk = tonumber(x2)
  elseif a == 3 then
    call('ZADD', key, x1, ARGV[1 + 5 * n + i])
    call('PEXPIREAT', key, x2)
    tk = x1
  elseif force and k == 0 then
    -- A forced extra cut to nothing (the window already counts twice its limit): no
    -- event, which would only move the window's end and the key's TTL.
  else
    tk = x1
    local at, base, nacc, ncost, mergeat, newest, oms = x1, x2, x3, x4, x5, x6, x7
    local ttl = not mergeat -- a new key or a new newest event needs its TTL set
    if not newest then
      nacc = 0
    elseif nacc + k > REBASE then
      ttl = true -- the DEL below drops the TTL
      base = tonumber(base)
      -- Rewrite the window's events with sums relative to the oldest one, keeping each
      -- event's time as its score reads; aged events that phase 1 did not trim are
      -- dropped with the key.
      local evs = call('ZRANGEBYSCORE', key, '(' .. format('%.0f', now - w), '+inf', 'WITHSCORES')
      call('DEL', key)
      for j = 1, #evs, 2 do
        local eacc, ec = match(evs[j], '^(%d+):(%d+)')
        newest = (tonumber(eacc) - base) .. ':' .. ec .. ':' .. evs[j + 1]
        call('ZADD', key, evs[j + 1], newest)
      end
      nacc, base = nacc - base, '0'
      if mergeat then mergeat = evs[#evs] end
    elseif type(base) == 'number' then
      base = base .. '' -- exact: base <= nacc < 2^46
    end
    acc = nacc + k
    -- The newest event also names the window's base and oldest event, so that the next
    -- decision needs no other read until that event leaves the window.
    local tail = ':' .. base .. ':' .. oms
    if mergeat then
      -- Merged into the newest event: added before the old member is removed (they
      -- differ: a higher sum), so the set never empties and the key keeps the TTL set
      -- when that event was written, which ends as it leaves the window. No PEXPIRE.
      call('ZADD', key, mergeat, acc .. ':' .. (ncost + k) .. ':' .. mergeat .. tail)
      call('ZREM', key, newest)
    else
      call('ZADD', key, nowstr, acc .. ':' .. ks .. ':' .. nowstr .. tail) -- at == now
    end
    if ttl then
      if at == now then
        call('PEXPIRE', key, ws)
      else
        call('PEXPIRE', key, at + w - now) -- the clock went back: the newest event is ahead
      end
    end
  end
  if not S then
    if tickets then
      if marker then call('SET', marker, tk .. ':' .. acc, 'PX', ARGV[#ARGV]) end
      if unspent then return {ok, exc, rem, reset, retry, acc, tk, idle} end
      return {ok, exc, rem, reset, retry, acc, tk}
    end
    return {ok, exc, rem, reset, retry, acc}
  end
  if tickets then
    reply[6 * n + i] = tk
    if unspent then reply[7 * n + i] = reply[6 * i] end
  end
  reply[6 * i] = acc
end
if marker then
  local m = {}
  for i = 1, n do m[i] = reply[6 * n + i] .. ':' .. reply[6 * i] end
  call('SET', marker, table.concat(m, ','), 'PX', ARGV[#ARGV])
end
return reply
