-- settle.lua: settle a group of admitted checks in one execution (docs/SETTLING.md):
-- give back what allow.lua spent, as far as that spend still counts, charge what was used
-- above the reservation, and release or renew in-flight leases. A decision of several
-- slot groups whose later group refused gives the earlier groups back with it too: a
-- settle at cost 0 of their tickets.
--
-- The Go side runs this file after allow.lua wrapped as a function,
--   local function allow(KEYS, ARGV) <allow.lua> end
-- so that an extra above a reservation is spent by allow.lua's own code in mode '3'
-- (force: no refusal, cut at the debt bound) and every state format has one author. (A
-- group whose checks are all charged above is sent to allow.lua in mode '3' itself.)
-- Line numbers in Lua errors count allow.lua's lines first.
--
-- KEYS[i]  the budget key of check i; all keys hash to one slot (or live on one server).
-- ARGV[1]  'settle' (give back, charge and release) or 'renew' (renew leases, nothing else).
-- ARGV[2+9(i-1) .. 10+9(i-1)], for check i:
--          algorithm (0 fixed, 1 token, 2 rolling, 3 in-flight, 4 calendar), limit,
--          window (ms; a calendar check's period boundaries) and capacity, as allow.lua
--          takes them; the units to give back (0: none); the units
--          to charge above the reservation (0: none; never with units to give back, nor
--          for an in-flight check); and the ticket allow.lua gave in mode '2': the
--          rolling event's cumulative sum (else 0), the window's PEXPIRETIME, the calendar
--          period's start, the event's or the lease's time (ms; ignored for a token bucket), and the lease member for an
--          in-flight check (else '-').
-- Reply: one integer per check: 1 if it was given back, charged, released or renewed,
--          0 if the state no longer allowed it (the window closed, the event is no longer
--          the newest or left the window, the lease expired, a counter or bucket given
--          back is corrupt, the key holds another type than the check's); nothing is
--          written for that check then, and the other checks are settled.
--          An error reply (bad arguments, or a corrupt counter, bucket or log of a
--          charged check, or the server's time in none of a charged calendar check's
--          periods: allow.lua's replies, whose check numbers count the charged checks
--          only) comes before any write but allow.lua's trims of aged events (a
--          reservation's marker, read before, is put back, its TTL anew).
--          A command that fails after the group's first write (one the user may not
--          run, say) is an error reply starting 'ERR ratebudget: settle partly
--          written': Redis keeps the writes before it.
--
-- The extras are charged first, all in one call of allow in mode '3', so that its checks
-- of arguments and state come before any give-back is written; the keys of a decision
-- are distinct, so the order changes no result. A fixed window is given back only while
-- its PEXPIRETIME is the ticket's (the same window); a count back to 0 deletes the key,
-- so that the next admission opens its own window. A token bucket's deficit (read with
-- PTTL as allow.lua reads it, converted to this rule's window's units, and cut at 2 x
-- full in debt) is lowered, never below a full bucket, and written in allow.lua's form.
-- A calendar count is given back only while its period start is the ticket's (the key
-- expires at the period's end); back to 0 it is deleted. A renewed lease expires window
-- from now. A rolling-window event is given back only
-- while it is the newest, in the window, and has the ticket's time and sum: it is
-- removed, or rewritten in allow.lua's member form when it merged other admissions; the
-- event that becomes the newest loses its name of the window only if the given-back
-- admission trimmed events; and the key expires again when its newest event leaves the
-- window (PEXPIREAT, from that event's own time).

local MAXLIMIT = 1099511627776      -- 2^40
local MAXSCALED = 9007199254740992  -- 2^53
local MAXWINDOW = 31622400000       -- 366 days in ms

-- A reservation that can be voided (allow.lua's modes '5' and '6') is settled with its
-- marker: the last of KEYS, its TTL (ms) the last of ARGV, and ARGV[1] one of
--   'first'  a settle as 'settle', unless a re-sent one ('retry') has landed (the marker
--            is the tombstone 'x'); it deletes the marker;
--   'retry'  a settle re-sent after a failure: applied only while the marker is the
--            reservation's own (neither the first settle nor another retry has landed,
--            which delete it or leave the tombstone), then left as the tombstone;
--   'void'   a reservation whose caller was answered without it: with the reservation's
--            marker, its spend is given back (each check's ticket and sum read from the
--            marker; the costs, the lease members and the rules are the call's) and the
--            tombstone left; without one, the tombstone is left, so that the reservation,
--            should it still arrive, spends nothing (see allow.lua).
-- A settle not applied replies 0 for every check. So each applies at most once: the
-- marker is the reservation's own until the first of them lands.
local n = #KEYS
local marker = false
local mode = ARGV[1]
if mode == 'first' or mode == 'retry' or mode == 'void' then
  marker, n = KEYS[n], n - 1
  if n < 1 or #ARGV ~= 2 + 9 * n or not string.find(ARGV[#ARGV], '^[1-9]%d*$') then
    return redis.error_reply('ERR ratebudget: bad argument count')
  end
elseif n == 0 or #ARGV ~= 1 + 9 * n then
  return redis.error_reply('ERR ratebudget: bad argument count')
end
local renewing = mode == 'renew'
if not (renewing or marker) and mode ~= 'settle' then
  return redis.error_reply('ERR ratebudget: bad mode')
end
-- wrote: a write of this call was made (by write, or by allow's charge). call is
-- redis.call, whose failure after a write is reported as such (see Reply); write is call
-- of a write command; first is call of a check's first command on its key, nil when the
-- key holds another type (WRONGTYPE): such a value (an operator's) is left as it is,
-- rather than failing after the writes of the checks before it.
local wrote = false
local pcall_ = redis.pcall
local function failed(r)
  if wrote then error({err = 'ERR ratebudget: settle partly written: ' .. r.err}) end
  error(r)
end
local function call(...)
  local r = pcall_(...)
  if type(r) == 'table' and r.err then failed(r) end
  return r
end
local function write(...)
  local r = call(...)
  wrote = true
  return r
end
local function first(...)
  local r = pcall_(...)
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 9) == 'WRONGTYPE' then return nil end
    failed(r)
  end
  return r
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

-- convert is allow.lua's conversion of a token bucket's deficit d, written under the
-- window wo, to the units of the window w (timerule.ConvertDeficit): d x w / wo
-- rounded up, at most 2^53, exactly. nil for a window out of range (a corrupt bucket).
local function convert(d, wo, w)
  if wo == w then return d end
  if wo < 1 or wo > MAXWINDOW then return nil end
  local fmod = math.fmod
  local r = fmod(d, wo)
  local q = (d - r) / wo
  if q > (MAXSCALED - fmod(MAXSCALED, w)) / w then return MAXSCALED end
  local wl = fmod(w, 131072)
  local x = r * ((w - wl) / 131072)
  local rx = fmod(x, wo)
  local y = rx * 131072 + r * wl
  local ry = fmod(y, wo)
  local f = (x - rx) / wo * 131072 + (y - ry) / wo
  if ry > 0 then f = f + 1 end
  d = q * w + f
  if d > MAXSCALED then d = MAXSCALED end
  return d
end

local args = {}
local xkeys, xargv = {}, {'3'} -- the checks charged above their reservation, for allow
for i = 1, n do
  local b = 1 + 9 * (i - 1)
  local a = {
    algo = int(ARGV[b + 1], 0, 4), limit = int(ARGV[b + 2], 1, MAXLIMIT),
    win = int(ARGV[b + 3], 1, MAXWINDOW), cap = int(ARGV[b + 4], 1, MAXLIMIT),
    give = int(ARGV[b + 5], 0, MAXLIMIT), extra = int(ARGV[b + 6], 0, MAXLIMIT),
    aux = int(ARGV[b + 7], 0, MAXSCALED), at = int(ARGV[b + 8], 0, MAXSCALED),
    member = ARGV[b + 9],
  }
  if a.algo == 4 and string.find(ARGV[b + 3], '^%d+:%d+:%d+:%d+$') then
    a.win = 1 -- the periods' boundaries: allow.lua reads them for a charge
  end
  if not (a.algo and a.limit and a.win and a.cap and a.give and a.extra and a.aux and a.at)
    or a.extra > 0 and (a.give > 0 or a.algo == 3) then
    return redis.error_reply('ERR ratebudget: bad argument for check ' .. i)
  end
  if a.extra > 0 and not renewing then
    -- allow.lua's own arguments, as this call's strings: it checks their form again.
    xkeys[#xkeys + 1] = KEYS[i]
    for j = 1, 4 do xargv[#xargv + 1] = ARGV[b + j] end
    xargv[#xargv + 1] = ARGV[b + 6]
  end
  if a.algo == 1 and a.cap > MAXSCALED / a.win then
    return redis.error_reply('ERR ratebudget: capacity x window exceeds 2^53 for check ' .. i)
  end
  if a.algo == 3 and not (string.find(a.member, '^%x+$') and #a.member <= 32) then
    return redis.error_reply('ERR ratebudget: bad lease for check ' .. i)
  end
  args[i] = a
end

local m -- the marker's value before this call, with a marker
if marker then
  local none = {}
  for i = 1, n do none[i] = 0 end
  if mode == 'first' then
    m = redis.call('GETDEL', marker)
    if m == 'x' then
      redis.call('SET', marker, 'x', 'PX', ARGV[#ARGV]) -- a retry landed first: keep its tombstone
      return none
    end
  else
    m = redis.call('GET', marker)
    if m == 'x' or not m and mode == 'retry' then return none end
    redis.call('SET', marker, 'x', 'PX', ARGV[#ARGV])
    if not m then return none end -- a void before its reservation: the tombstone
    if mode == 'void' then
      -- Each check's ticket and sum, as allow.lua wrote them.
      local i = 0
      for at, aux in string.gmatch(m, '(%d+):(%d+)') do
        i = i + 1
        if i > n then return none end
        args[i].at, args[i].aux = int(at, 0, MAXSCALED), int(aux, 0, MAXSCALED)
      end
      if i ~= n then return none end
    end
  end
end

local now
local function clock()
  if not now then
    local t = call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end

-- A fixed window's give-back reads its PEXPIRETIME (Redis 7.0) after the earlier
-- checks' writes: read it once now, so that a server or user without it fails before
-- any write.
for i = 1, n do
  local a = args[i]
  if a.algo == 0 and a.give > 0 and not renewing then
    call('PEXPIRETIME', KEYS[1])
    break
  end
end

if #xkeys > 0 then
  local r = allow(xkeys, xargv)
  if r.err then
    -- Nothing is settled: the reservation's marker is put back (its TTL anew), so that
    -- the settle sent again ('first' around the server's time after a calendar miss,
    -- or 'retry') still applies, once.
    if m and m ~= 'x' then redis.call('SET', marker, m, 'PX', ARGV[#ARGV]) end
    return r
  end
  wrote = true
end

local reply = {}
for i = 1, n do
  local a, key = args[i], KEYS[i]
  local done = 0
  if a.extra > 0 and not renewing then
    done = 1 -- charged by allow above
  elseif a.algo == 3 then
    if renewing then
      local s = first('ZSCORE', key, a.member)
      if s and tonumber(s) > clock() then
        -- Window from now, also when another lease expires later (taken under a
        -- longer window of the rule's name, or before the clock went back); the key
        -- expires with its newest lease.
        local at = now + a.win
        write('ZADD', key, 'XX', at, a.member)
        write('PEXPIREAT', key, call('ZRANGE', key, '-1', '-1', 'WITHSCORES')[2])
        done = 1
      end
    else
      done = first('ZREM', key, a.member) or 0 -- a ZREM that fails writes nothing
      if done == 1 then wrote = true end
    end
  elseif renewing or a.give == 0 then
    done = 0
  elseif a.algo == 0 then
    if call('PEXPIRETIME', key) == a.at then
      -- A counter not in DECRBY's form (see allow.lua) is not given back: DECRBY would
      -- fail after the group's earlier writes.
      local v = first('GET', key)
      v = v and (v == '0' or string.find(v, '^%-?[1-9]%d*$')) and tonumber(v)
      if v and (v > MAXSCALED or v < -MAXSCALED) then v = nil end
      if v and v <= a.give then
        write('DEL', key)
        done = 1
      elseif v then
        write('DECRBY', key, a.give) -- keeps the TTL
        done = 1
      end
    end
  elseif a.algo == 4 then
    -- allow.lua's form "<count>:<period start>"; of another period, nothing to give back.
    local v = first('GET', key)
    local cs, ss
    if v then cs, ss = string.match(v, '^(%d+):(%d+)$') end
    local c = cs and tonumber(cs)
    if c and c <= MAXSCALED and tonumber(ss) == a.at then
      if c <= a.give then
        write('DEL', key)
      else
        write('SET', key, string.format('%d:%s', c - a.give, ss), 'KEEPTTL')
      end
      done = 1
    end
  elseif a.algo == 1 then
    local v = first('GET', key)
    -- allow.lua's form "<deficit>:<time until full at the writer's rate>:<the writer's
    -- window>", or either older form: "<deficit>:<time until full>", a plain deficit
    -- (whose time until full is read at this rule's rate), both in this rule's units.
    local ds, ts, wv
    if v then
      ds, ts, wv = string.match(v, '^(%d+):(%d+):(%d+)$')
      if not ds then
        ds, ts = string.match(v, '^(%d+):(%d+)$')
        if not ds then ds = string.match(v, '^%d+$') end
      end
    end
    local d = ds and tonumber(ds)
    if d and ts and tonumber(ts) > d then d = nil end -- t = ceil(d / rate) <= d
    local w, rate = a.win, a.limit
    local full = a.cap * w
    if d and d <= MAXSCALED and wv then
      d = convert(d, tonumber(wv), w)
    end
    if d and d <= MAXSCALED then
      local lag = 0
      local pttl = call('PTTL', key)
      if pttl ~= -1 then
        local t = ceildiv(d, rate)
        local elapsed = (ts and tonumber(ts) or t) - pttl
        if elapsed < 0 then
          lag = -elapsed
        elseif elapsed >= t then
          d = 0
        else
          d = d - elapsed * rate
        end
      end
      -- Debt beyond one capacity (the rule's capacity was lowered under the same name)
      -- is cut there first, as allow.lua reads it.
      if d > 2 * full then d = 2 * full end
      local give = a.give
      if give > a.cap then give = a.cap end -- an admitted cost is at most the capacity
      d = d - give * w
      if d <= 0 then
        write('DEL', key)
      else
        local t = ceildiv(d, rate)
        write('SET', key, string.format('%d:%d:%d', d, t, w), 'PX', lag + t)
      end
      done = 1
    end
  else
    local newest = first('ZRANGE', key, -1, -1, 'WITHSCORES')
    if newest and #newest > 0 and tonumber(newest[2]) == a.at and a.at > clock() - a.win then
      local acc, c, tail = string.match(newest[1], '^(%d+):(%d+)(.*)$')
      acc, c = tonumber(acc), tonumber(c)
      local give = a.give
      if c and give > c then give = c end
      local last
      if acc == a.aux and c and give > 0 then
        if c > give then
          tail = string.match(tail, '^:%d+(:%d+:%d+)$') or ''
          write('ZADD', key, newest[2], (acc - give) .. ':' .. (c - give) .. ':' .. newest[2] .. tail)
          write('ZREM', key, newest[1])
          last = newest[2]
        else
          write('ZREM', key, newest[1])
          local prev = call('ZRANGE', key, -1, -1, 'WITHSCORES')
          local head, ptail
          if #prev > 0 then head, ptail = string.match(prev[1], '^(%d+:%d+):%d+(:%d+:%d+)$') end
          if head and ptail ~= string.match(tail, '^:%d+(:%d+:%d+)$') then
            write('ZADD', key, prev[2], head .. ':' .. prev[2])
            write('ZREM', key, prev[1])
          end
          if #prev > 0 then last = prev[2] end
        end
        if last then write('PEXPIREAT', key, tonumber(last) + a.win) end
        done = 1
      end
    end
  end
  reply[i] = done
end
return reply
