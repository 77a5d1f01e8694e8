-- allow.lua: checks every rule of one identity at once, all-or-nothing.
--
-- KEYS[1..m]   the containers: string keys holding packed rule states (one
--              for the identity's named rules, one per Rule.Bucket), all
--              under one {hash tag}; see layout in redis.go.
-- KEYS[m+i]    optional: rule i's key in the previous layout (a hash per
--              rule), read only while rule i has no state of its own here.
-- ARGV[1]      cost (integer > 0); 0 inspects (computes, writes nothing);
--              -1 resets the rules (drops their states and old keys); -2
--              lists the states of KEYS[1] and deletes it (no rules)
-- ARGV[2]      m, the number of containers
-- ARGV[3+7*(i-1) ...] for rule i:
--   name       the rule's bucket: its state's name in its container
--   flags      kind + 4*shadow + 8*(container - 1); kind 0 = token bucket
--              with capacity = limit, 1 = token bucket, 2 = sliding window
--   limit      units per period
--   period     microseconds
--   capacity   token bucket capacity (burst); the limit for sliding window
--   pn, pd     token bucket: period / (limit × 10^6) in lowest terms, the
--              microseconds per micro-token (computed once, in Go)
--
-- Reply (cost > 0): { allowed, r1_allowed, r1_remaining, r1_retry_us,
-- r1_reset_us, ..., now_us } all integers; now_us is the Redis time the
-- rules were checked at. If any non-shadow rule denies, nothing is
-- consumed: the only write is of a state converted to a changed rule (or
-- taken over from the previous layout).
-- Reply (cost 0): { r1_found, r1_remaining, r1_count, r1_previous,
-- r1_reset_us, ..., ttl_ms, now_us }. (-1): { states dropped }. (-2): {
-- name1, kind1, ... } of the states KEYS[1] held.
--
-- A container is a string of records, each struct-packed as name length
-- (1 byte), name, kind (1 byte), then by kind
--   0: micro-tokens I7, last update us I7, limit-1 I4, period us I6
--   1: the same, then capacity-1 I4
--   2: window index I6, count in it I5, count in the one before I5,
--      period us I6
-- so a record remembers the rule it was written under. A record is matched
-- by name and algorithm; records of rules not in this call ride along
-- untouched until they read as full, then are dropped. A written container
-- expires when its last record would read as full anyway, plus a second.
--
-- Time comes from Redis' clock; elapsed time is clamped at zero and a
-- bucket's timestamp never moves back, so a clock step backwards never
-- mints tokens.
--
-- Arithmetic: Lua numbers are doubles, exact for integers up to 2^53.
-- Token buckets count micro-tokens (capacity ≤ 2^32, so ≤ 2^52 of them), so
-- the refill of a few microseconds is not truncated away. The refill
-- elapsed × limit × 10^6 / period is computed with limit × 10^6 / period in
-- lowest terms, so for round rules the product stays below 2^53 and exact;
-- a product that still passes 2^53 is rounded to within one micro-token and
-- then lowered by one, so every rounding is in the limiter's favour. Retry
-- and reset times are likewise raised (by at most 2 us), capped at 2^53 us.
-- Sliding windows compare counts times weights in 1/2^20 (≤ 2^52, exact).
-- memory.go computes the same quantities exactly in 128-bit integers and
-- the sliding window's weights with the very same double expressions.
--
-- A changed rule converts the state: a token bucket refills at its old
-- rate up to now, then a raised capacity adds its difference and a lowered
-- one clamps; a sliding window whose period changed carries what it had
-- used into the current window of the new period. States of the previous
-- layout without these fields (written by an older script still) are read
-- as written under the current rule.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost = tonumber(ARGV[1])
local m = tonumber(ARGV[2])
local n = (#ARGV - 2) / 7
local legacy = #KEYS >= m + n
local MICRO = 1000000
local EXACT = 9007199254740992 -- 2^53
local D = 1048576 -- 2^20, the sliding window's weight resolution
local FMT = {[0] = 'I7I7I4I6', [1] = 'I7I7I4I6I4', [2] = 'I6I5I5I6'}
local SIZE = {[0] = 24, [1] = 28, [2] = 22}

-- b/c in lowest terms, for rules Go did not reduce (converted states)
local function reduce(b, c)
  local x, y = b, c
  while y > 0 do x, y = y, math.fmod(x, y) end
  return b / x, c / x
end

-- floor(a*b/c) for b/c in lowest terms, never above the exact value
local function muldiv_floor(a, b, c)
  local p = a * b
  local q = math.floor(p / c)
  if p > EXACT then q = q - 1 end
  if q < 0 then q = 0 end
  return q
end

-- ceil(a*b/c) for b/c in lowest terms, never below the exact value, capped
-- at 2^53 us
local function wait(a, b, c)
  local p = a * b
  local q = math.ceil(p / c)
  if p > EXACT then q = q + 2 end
  if q > EXACT then q = EXACT end
  return q
end

-- the previous window's weight (in 1/D) when left us of the window remain
local function weight(left, period)
  local k = math.floor(left * D / period) + 1
  if k > D then k = D end
  return k
end

-- the largest weight k with prev*k <= room*D
local function max_weight(prev, room)
  local k = math.floor(room * D / prev)
  if k > D then k = D end
  while k > 0 and prev * k > room * D do k = k - 1 end
  while k < D and prev * (k + 1) <= room * D do k = k + 1 end
  return k
end

-- the most us left in a window at which the weight is at most k (k >= 1)
local function last_left(k, period)
  local l = math.ceil(k * period / D) - 1
  if l > period then l = period end
  while l < period and weight(l + 1, period) <= k do l = l + 1 end
  while l > 0 and weight(l, period) > k do l = l - 1 end
  return l
end

local function ceil_div(a, b) return math.floor((a + b - 1) / b) end

-- the rules
local R, byname = {}, {}
for i = 1, n do
  local b = 3 + 7 * (i - 1)
  local f = tonumber(ARGV[b + 1])
  local r = {name = ARGV[b], kind = f % 4, shadow = math.floor(f / 4) % 2,
    cont = math.floor(f / 8) + 1, limit = tonumber(ARGV[b + 2]),
    period = tonumber(ARGV[b + 3]), cap = tonumber(ARGV[b + 4]),
    pn = tonumber(ARGV[b + 5]), pd = tonumber(ARGV[b + 6])}
  R[i] = r
  byname[r.name] = i
end

-- How long (us) a record of a rule not in this call still needs to be
-- kept, by the rule it was written under; nil once it reads as full.
local function foreign_need(kind, s, p)
  if kind == 2 then
    local w, _, _, P = struct.unpack(FMT[2], s, p)
    local ow = math.floor(now / P)
    if w >= ow then return (w + 2) * P - now end
    if w == ow - 1 then return (ow + 1) * P - now end
    return nil
  end
  local tk, ts, l1, P, c1 = struct.unpack(FMT[kind], s, p)
  local l = l1 + 1
  local ocapu = l * MICRO
  if kind == 1 then ocapu = (c1 + 1) * MICRO end
  local rn, rd = reduce(l * MICRO, P)
  local el = now - ts
  if el < 0 then el = 0 end
  local tokens = tk + muldiv_floor(el, rn, rd)
  if tokens >= ocapu and ts <= now then return nil end
  if tokens > ocapu then tokens = ocapu end
  return wait(ocapu - tokens, rd, rn)
end

-- Read the containers: each rule's stored state (st[i], with raw[i] its
-- bytes), and the records of other rules worth keeping.
local st, raw, keep, kneed, names = {}, {}, {}, {}, {}
for c = 1, m do
  local s = redis.call('GET', KEYS[c])
  keep[c], kneed[c] = {}, 0
  if s then
    local pos, len = 1, #s
    while pos <= len do
      local name, kind, p = struct.unpack('Bc0B', s, pos)
      if not SIZE[kind] then
        return redis.error_reply('limiter: unknown state kind ' .. kind .. ' in ' .. KEYS[c])
      end
      local e = p + SIZE[kind]
      local i = byname[name]
      if cost == -2 then
        names[#names + 1] = name
        names[#names + 1] = kind
      elseif i and R[i].cont == c and (kind == 2) == (R[i].kind == 2) then
        local v = {struct.unpack(FMT[kind], s, p)}
        if kind == 2 then
          st[i] = {w = v[1], c = v[2], p = v[3], P = v[4]}
        else
          local cap = v[3] + 1
          if kind == 1 then cap = v[5] + 1 end
          st[i] = {tk = v[1], ts = v[2], l = v[3] + 1, P = v[4], cap = cap}
        end
        raw[i] = string.sub(s, pos, e - 1)
      else
        local need = foreign_need(kind, s, p)
        if need then
          keep[c][#keep[c] + 1] = string.sub(s, pos, e - 1)
          if need > kneed[c] then kneed[c] = need end
        end
      end
      pos = e
    end
  end
end

if cost == -2 then
  redis.call('DEL', KEYS[1])
  return names
end

if cost == -1 then
  local dropped = 0
  for c = 1, m do
    local had = false
    for i = 1, n do
      if R[i].cont == c and raw[i] then had = true end
    end
    if had then
      if #keep[c] == 0 then
        redis.call('DEL', KEYS[c])
      else
        redis.call('SET', KEYS[c], table.concat(keep[c]), 'KEEPTTL')
      end
    end
  end
  for i = 1, n do
    if raw[i] then dropped = dropped + 1 end
    if legacy then dropped = dropped + redis.call('DEL', KEYS[m + i]) end
  end
  return {dropped}
end

-- Rules without a state here take over their state in the previous layout,
-- converted once: it is written back here whatever the verdict.
local taken = {}
if legacy then
  for i = 1, n do
    if not st[i] then
      local r = R[i]
      if r.kind == 2 then
        local h = redis.call('HMGET', KEYS[m + i], 'w', 'c', 'p', 'P')
        if h[1] then
          st[i] = {w = tonumber(h[1]), c = tonumber(h[2]), p = tonumber(h[3]), P = tonumber(h[4])}
        end
      else
        local h = redis.call('HMGET', KEYS[m + i], 'tk', 'ts', 'l', 'P', 'c')
        if h[1] then
          st[i] = {tk = tonumber(h[1]), ts = tonumber(h[2]), l = tonumber(h[3]) or r.limit,
            P = tonumber(h[4]) or r.period, cap = tonumber(h[5]) or r.cap}
        end
      end
      taken[i] = st[i] ~= nil
    end
  end
end

local writes, converts = {}, {}
local oks, retries, before, after, counts = {}, {}, {}, {}, {}
local all = 1

for i = 1, n do
  local r = R[i]
  local limit, period, cap = r.limit, r.period, r.cap
  local s = st[i]
  local ok, retry, rb, ra

  if r.kind ~= 2 then
    -- token bucket
    local capu = cap * MICRO
    local pn, pd = r.pn, r.pd -- us per micro-token
    local tokens = capu
    local ts = now
    local conv = false
    if s then
      local ocapu = s.cap * MICRO
      local elapsed = now - s.ts
      if elapsed < 0 then elapsed = 0 end
      local rn, rd = pd, pn
      if s.l ~= limit or s.P ~= period then rn, rd = reduce(s.l * MICRO, s.P) end
      local refill = muldiv_floor(elapsed, rn, rd)
      if refill > ocapu then refill = ocapu end
      tokens = s.tk + refill
      if tokens > ocapu then tokens = ocapu end
      if capu > ocapu then tokens = tokens + capu - ocapu end
      if tokens > capu then tokens = capu end
      if s.ts > ts then ts = s.ts end
      conv = s.l ~= limit or s.P ~= period or ocapu ~= capu or taken[i]
    end
    local need = cost * MICRO
    if tokens >= need then
      ok = 1
      retry = 0
    else
      ok = 0
      retry = wait(need - tokens, pn, pd)
    end
    -- before/after: the rule's state if nothing or this request is consumed
    local rest = tokens - need
    rb = {math.floor(tokens / MICRO), wait(capu - tokens, pn, pd)}
    counts[i] = {0, 0}
    local function pack(tk)
      if r.kind == 0 then
        return struct.pack('Bc0BI7I7I4I6', #r.name, r.name, 0, tk, ts, limit - 1, period)
      end
      return struct.pack('Bc0BI7I7I4I6I4', #r.name, r.name, 1, tk, ts, limit - 1, period, cap - 1)
    end
    if ok == 1 and cost > 0 then
      ra = {math.floor(rest / MICRO), wait(capu - rest, pn, pd)}
      writes[i] = pack(rest)
    end
    if conv and cost > 0 then converts[i] = pack(tokens) end
  else
    -- sliding window counter
    local w = math.floor(now / period)
    local into = now - w * period
    local cur, prev = 0, 0
    local conv = false
    if s then
      local sw, sc, sp, sP = s.w, s.c, s.p, s.P
      conv = sP ~= period or taken[i]
      if sP == nil and sw > w then
        -- written by an older script, maybe under another period: carry
        -- all of it rather than freeze the window
        cur = sc + sp
      elseif sP ~= nil and sP ~= period then
        -- the period changed: carry what the old windows had used at now
        local ow = math.floor(now / sP)
        local oleft = sP - (now - ow * sP)
        if sw == ow then
          cur = sc + ceil_div(sp * weight(oleft, sP), D)
        elseif sw == ow - 1 then
          cur = ceil_div(sc * weight(oleft, sP), D)
        elseif sw > ow then
          cur = sc + sp
        end
      elseif sw == w then
        cur, prev = sc, sp
      elseif sw == w - 1 then
        prev = sc
      elseif sw > w then
        -- Redis' clock stepped back across a window: keep the newer counts.
        w = sw
        into = 0
        cur, prev = sc, sp
      end
    end
    local left = period - into
    local k = weight(left, period)
    local function state(c)
      local rem = limit - c - ceil_div(prev * k, D)
      if rem < 0 then rem = 0 end
      local rs = 0
      if c > 0 then rs = left + period elseif prev > 0 then rs = left end
      return {rem, rs}
    end
    local function pack(c)
      return struct.pack('Bc0BI6I5I5I6', #r.name, r.name, 2, w, c, prev, period)
    end
    rb = state(cur)
    counts[i] = {cur, prev}
    local room = limit - cur - cost
    ok, retry = 0, 0
    if room >= 0 and prev * k <= room * D then
      ok = 1
      if cost > 0 then
        ra = state(cur + cost)
        writes[i] = pack(cur + cost)
      end
    end
    if conv and cost > 0 then converts[i] = pack(cur) end
    if ok == 0 and cost <= limit then
      -- (a cost above the limit reaches here only for a shadow rule: no
      -- wait helps, retry stays 0)
      local kw = 0
      if room >= 0 then kw = max_weight(prev, room) end
      if kw >= 1 then
        -- wait until the previous window has decayed enough
        retry = left - last_left(kw, period)
      elseif cur <= limit - cost then
        -- the next window, where cur becomes prev at full weight
        retry = left
      else
        kw = max_weight(cur, limit - cost)
        if kw >= 1 then
          retry = left + period - last_left(kw, period)
        else
          retry = left + period
        end
      end
    end
  end

  if ok == 0 and r.shadow == 0 then all = 0 end
  oks[i], retries[i], before[i], after[i] = ok, retry, rb, ra
end

if cost == 0 then
  local res = {}
  for i = 1, n do
    res[#res + 1] = st[i] and 1 or 0
    res[#res + 1] = before[i][1]
    res[#res + 1] = counts[i][1]
    res[#res + 1] = counts[i][2]
    res[#res + 1] = before[i][2]
  end
  local ttl = 0
  for c = 1, m do
    local p = redis.call('PTTL', KEYS[c])
    if p > ttl then ttl = p end
  end
  res[#res + 1] = ttl
  res[#res + 1] = now
  return res
end

-- Report each rule's state as it is after this call: consumed only if the
-- whole request was allowed and the rule itself admitted it.
local res = {all}
local parts, dirty, need = {}, {}, {}
for c = 1, m do parts[c], need[c] = {}, kneed[c] end
for i = 1, n do
  local s = before[i]
  local c = R[i].cont
  local rec = raw[i]
  if all == 1 and oks[i] == 1 then
    s, rec, dirty[c] = after[i], writes[i], true
  elseif converts[i] then
    -- A state read under another rule is written back converted (nothing
    -- consumed), so the change takes effect once and the retry given holds.
    rec, dirty[c] = converts[i], true
  end
  res[#res + 1] = oks[i]
  res[#res + 1] = s[1]
  res[#res + 1] = retries[i]
  res[#res + 1] = s[2]
  if rec then
    parts[c][#parts[c] + 1] = rec
    if s[2] > need[c] then need[c] = s[2] end
  end
end
res[#res + 1] = now

for c = 1, m do
  if dirty[c] then
    -- expiry: when the last record would read as full anyway, plus a second
    local ttl = math.ceil(need[c] / 1000) + 1000
    redis.call('SET', KEYS[c], table.concat(parts[c]) .. table.concat(keep[c]), 'PX', ttl)
  end
end

return res
