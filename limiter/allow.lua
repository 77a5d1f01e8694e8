-- allow.lua: checks every rule of one identity at once, all-or-nothing.
--
-- KEYS[1..m]   the containers: string keys holding packed rule states (one
--              for the identity's named rules, one per Rule.Bucket), all
--              under one {hash tag}; see layout in redis.go.
-- KEYS[m+i]    optional: rule i's key in the previous layout (a hash per
--              rule), read only while rule i has no state of its own here.
-- ARGV[1]      cost (integer > 0), charged to every rule without a cost
--              of its own; 0 inspects (computes, writes nothing); -1
--              resets the rules (drops their states and old keys); -2
--              lists the states of KEYS[1] and deletes it (no rules)
-- ARGV[2]      m, the number of containers
-- ARGV[3]      the rules, each struct-packed '<Bc0BI5I6I5I6I7I7', all in one
--              argument (Redis makes a Lua string of every argument):
--   name       the rule's bucket: its state's name in its container
--   flags      kind + 4*shadow + 8*share + 16*(container - 1); kind 0 =
--              token bucket with capacity = limit, 1 = token bucket, 2 =
--              sliding window; share marks a split's share (see below)
--   limit      units per period
--   period     microseconds
--   capacity   token bucket capacity (burst); the limit for sliding window
--   pn, pd     token bucket: period / (limit × 10^6) in lowest terms, the
--              microseconds per micro-token (reduced once, in Go)
--   rcost      what a check charges this rule instead of ARGV[1] when
--              > 0 (at most 2^53); 0 charges ARGV[1]. Only a check (cost
--              > 0) reads it: the modes stay ARGV[1]'s.
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
--   0: micro-tokens i7 (signed: negative while a lowered capacity is
--      overdrawn), last update us I7, limit-1 I4, period us I6
--   1: the same, then capacity-1 I4
--   2: window index I6, count in it I5, count in the one before I5,
--      period us I6
-- so a record remembers the rule it was written under. A record is matched
-- by name and algorithm, else by name alone (its algorithm changed: see
-- below); records of rules not in this call ride along untouched until
-- they read as full, then are dropped. A written container
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
-- rate up to now, then a changed capacity carries what was used: a raised
-- one adds its difference, a lowered one takes it away, which may leave
-- the bucket overdrawn (negative tokens: denied until it refills to the
-- cost, its retry from its own rate). Clamped instead, a key checked
-- under both capacities (gateways mid reload) was held to neither: each
-- raise added back what the lowering had forgotten. A split's share (flag
-- share) is the exception: one that grows keeps the tokens it had (its
-- units moved from another gateway's share, so adding them would mint
-- them on every resize), and one that shrinks clamps (its growth added
-- nothing, so nothing is taken back). From then on it refills at the new
-- rate. A share that reads as full starts full at its new capacity, as it
-- would with no state: a full record is dropped a second later anyway (and
-- the memory store forgets it at once), so the stores agree whatever they
-- kept. A sliding window whose period
-- changed carries what it had used into the current window of the new
-- period; a changed limit keeps its counts (in units). A changed algorithm
-- carries what the old state had used at now, in units, rounded up: into
-- the current window of a sliding window, or out of a full token bucket;
-- the converted record replaces the old one. States of the
-- previous layout without these fields (written by an older script still)
-- are read as written under the current rule.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost = tonumber(ARGV[1])
local m = tonumber(ARGV[2])
local blob = ARGV[3] or ''
local MICRO = 1000000
local EXACT = 9007199254740992 -- 2^53
local D = 1048576 -- 2^20, the sliding window's weight resolution
-- Token bucket records keep micro-tokens signed (i7); one written before
-- was unsigned, but never reached the sign bit (at most 2^52), so it reads
-- the same.
local TB0, TB1, SW = '<i7I7I4I6', '<i7I7I4I6I4', '<I6I5I5I6' -- records by kind
local PTB0, PTB1, PSW = 'Bc0B' .. TB0, 'Bc0B' .. TB1, 'Bc0B' .. SW -- with name and kind

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

-- b/c in lowest terms, for rules Go did not reduce (stored states)
local function reduce(b, c)
  local x, y = b, c
  while y > 0 do x, y = y, math.fmod(x, y) end
  return b / x, c / x
end

-- The rules: R[i] = {name, flags, limit, period, capacity, pn, pd, rcost}.
local R, byname, n = {}, {}, 0
local pos = 1
while pos <= #blob do
  n = n + 1
  local r = {struct.unpack('<Bc0BI5I6I5I6I7I7', blob, pos)}
  pos = r[9]
  R[n] = r
  byname[r[1]] = n
end
local legacy = #KEYS >= m + n

-- How long (us) a record of a rule not in this call still needs to be
-- kept, by the rule it was written under; nil once it reads as full.
local function foreign_need(kind, s, p)
  if kind == 2 then
    local w, _, _, P = struct.unpack(SW, s, p)
    local ow = math.floor(now / P)
    if w >= ow then return (w + 2) * P - now end
    if w == ow - 1 then return (ow + 1) * P - now end
    return nil
  end
  local tk, ts, l1, P, c1 = struct.unpack(kind == 1 and TB1 or TB0, s, p)
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

-- Read the containers: each rule's stored state st[i] (token bucket:
-- {tokens, ts, limit, period, capacity}; sliding window: {window, count,
-- previous, period}), raw[i] its bytes, and the records of other rules
-- still worth keeping.
local st, raw, keep, kneed, names = {}, {}, {}, {}, {}
local other, oraw = {}, {} -- a rule's record under its other algorithm
for c = 1, m do
  local s = redis.call('GET', KEYS[c])
  keep[c], kneed[c] = {}, 0
  if s then
    local p0, len = 1, #s
    while p0 <= len do
      local name, kind, p = struct.unpack('Bc0B', s, p0)
      local e
      if kind == 0 then e = p + 24 elseif kind == 1 then e = p + 28 elseif kind == 2 then e = p + 22 else
        return redis.error_reply('limiter: unknown state kind ' .. kind .. ' in ' .. KEYS[c])
      end
      local i = byname[name]
      local r = R[i]
      if cost == -2 then
        names[#names + 1] = name
        names[#names + 1] = kind
      elseif r and math.floor(r[2] / 16) + 1 == c and (kind == 2) == (r[2] % 4 == 2) then
        if kind == 2 then
          st[i] = {struct.unpack(SW, s, p)}
        else
          local tk, ts, l1, P, c1 = struct.unpack(kind == 1 and TB1 or TB0, s, p)
          st[i] = {tk, ts, l1 + 1, P, (kind == 1 and c1 or l1) + 1}
        end
        raw[i] = string.sub(s, p0, e - 1)
      elseif r and math.floor(r[2] / 16) + 1 == c then
        -- the rule's record under its other algorithm (the algorithm
        -- changed): converted below, never kept beside the rule's own
        other[i], oraw[i] = {kind, s, p}, string.sub(s, p0, e - 1)
      else
        local need = foreign_need(kind, s, p)
        if need then
          keep[c][#keep[c] + 1] = string.sub(s, p0, e - 1)
          if need > kneed[c] then kneed[c] = need end
        end
      end
      p0 = e
    end
  end
end

if cost == -2 then
  redis.call('DEL', KEYS[1])
  return names
end

-- A record of the rule's other algorithm is its state when it has none of
-- its own (and is dropped with the next write when it has).
for i = 1, n do
  if other[i] and not st[i] then raw[i] = oraw[i] else other[i] = nil end
end

if cost == -1 then
  local dropped = 0
  for c = 1, m do
    local had = false
    for i = 1, n do
      if raw[i] and math.floor(R[i][2] / 16) + 1 == c then had = true end
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
  -- One EXISTS for the rules without a record (a new identity: all of
  -- them), and an HMGET only for an old key that is there.
  local missing = {}
  for i = 1, n do
    if not st[i] and not other[i] then missing[#missing + 1] = KEYS[m + i] end
  end
  if #missing == 0 or redis.call('EXISTS', unpack(missing)) == 0 then legacy = false end
end
if legacy then
  for i = 1, n do
    if not st[i] and not other[i] then
      local r = R[i]
      if r[2] % 4 == 2 then
        local h = redis.call('HMGET', KEYS[m + i], 'w', 'c', 'p', 'P')
        if h[1] then
          -- no period: written by an older script still (see below)
          st[i] = {tonumber(h[1]), tonumber(h[2]), tonumber(h[3]), tonumber(h[4]) or false}
        end
      else
        local h = redis.call('HMGET', KEYS[m + i], 'tk', 'ts', 'l', 'P', 'c')
        if h[1] then
          st[i] = {tonumber(h[1]), tonumber(h[2]), tonumber(h[3]) or r[3], tonumber(h[4]) or r[4], tonumber(h[5]) or r[5]}
        end
      end
      taken[i] = st[i] ~= nil
    end
  end
end

-- Sliding window helpers, made only when a sliding window is checked.
local weight, max_weight, last_left

local function sliding_helpers()
  -- the previous window's weight (in 1/D) when left us of the window remain
  weight = function(left, period)
    local k = math.floor(left * D / period) + 1
    if k > D then k = D end
    return k
  end
  -- the largest weight k with prev*k <= room*D
  max_weight = function(prev, room)
    local k = math.floor(room * D / prev)
    if k > D then k = D end
    while k > 0 and prev * k > room * D do k = k - 1 end
    while k < D and prev * (k + 1) <= room * D do k = k + 1 end
    return k
  end
  -- the most us left in a window at which the weight is at most k (k >= 1)
  last_left = function(k, period)
    local l = math.ceil(k * period / D) - 1
    if l > period then l = period end
    while l < period and weight(l + 1, period) <= k do l = l + 1 end
    while l > 0 and weight(l, period) > k do l = l - 1 end
    return l
  end
end

local function ceil_div(a, b) return math.floor((a + b - 1) / b) end

-- What a sliding window state (window sw, counts sc and sp) had used at
-- now, in units, by its own period sP; the counts of a window Redis'
-- clock stepped back across are kept whole. Needs sliding_helpers().
local function window_use(sw, sc, sp, sP)
  local ow = math.floor(now / sP)
  local oleft = sP - (now - ow * sP)
  if sw == ow then return sc + ceil_div(sp * weight(oleft, sP), D) end
  if sw == ow - 1 then return ceil_div(sc * weight(oleft, sP), D) end
  if sw > ow then return sc + sp end
  return 0
end

-- A rule whose algorithm changed carries over what its record under the
-- other one had used at now, in units, by the rule it was written under
-- (rounded up, in the limiter's favour): into the current window of a
-- sliding window, or out of a full token bucket. Started afresh instead,
-- the key would get a whole limit more, and for as long as gateways of the
-- old and the new configuration run side by side, each algorithm its own.
for i = 1, n do
  local o = other[i]
  if o then
    local kind, s, p = o[1], o[2], o[3]
    local used
    if kind == 2 then
      if not weight then sliding_helpers() end
      local sw, sc, sp, sP = struct.unpack(SW, s, p)
      used = window_use(sw, sc, sp, sP)
    else
      local tk, ts, l1, P, c1 = struct.unpack(kind == 1 and TB1 or TB0, s, p)
      local ocapu = ((kind == 1 and c1 or l1) + 1) * MICRO
      local rn, rd = reduce((l1 + 1) * MICRO, P)
      local el = now - ts
      if el < 0 then el = 0 end
      local refill = muldiv_floor(el, rn, rd)
      if refill > ocapu - tk then refill = ocapu - tk end
      local tokens = tk + refill
      if tokens > ocapu then tokens = ocapu end
      used = ceil_div(ocapu - tokens, MICRO)
    end
    local r = R[i]
    if r[2] % 4 == 2 then
      st[i] = {math.floor(now / r[4]), used, 0, r[4]}
    else
      -- (overdrawn when a lowered limit's window had used more)
      st[i] = {(r[5] - used) * MICRO, now, r[3], r[4], r[5]}
    end
    taken[i] = true
  end
end

-- V[6i-5 .. 6i]: rule i's verdict, retry, and its remaining and reset
-- before and after consuming this request.
local V, writes, converts, counts = {}, {}, {}, {}
local all = 1

for i = 1, n do
  local r = R[i]
  local name, f, limit, period, cap = r[1], r[2], r[3], r[4], r[5]
  local kind = f % 4
  -- what this rule is charged: its own cost in a check, else the call's;
  -- either is above the capacity only for a shadow rule (Go answers the
  -- others), so every exact product below stays under 2^53
  local rc = cost
  if cost > 0 and r[8] > 0 then rc = r[8] end
  local s = st[i]
  local ok, retry, brem, breset, arem, areset = 0, 0, 0, 0, 0, 0

  if kind ~= 2 then
    -- token bucket
    local capu = cap * MICRO
    local pn, pd = r[6], r[7] -- us per micro-token
    local tokens = capu
    local ts = now
    local conv = false
    if s then
      local sl, sP, ocapu = s[3], s[4], s[5] * MICRO
      local elapsed = now - s[2]
      if elapsed < 0 then elapsed = 0 end
      local rn, rd = pd, pn
      if sl ~= limit or sP ~= period then rn, rd = reduce(sl * MICRO, sP) end
      -- (refill capped at what fills the bucket, which for an overdrawn
      -- one is more than its capacity)
      local refill = muldiv_floor(elapsed, rn, rd)
      if refill > ocapu - s[1] then refill = ocapu - s[1] end
      tokens = s[1] + refill
      if math.floor(f / 8) % 2 == 0 or (capu > ocapu and tokens >= ocapu) then tokens = tokens + capu - ocapu end
      if tokens > capu then tokens = capu end
      if s[2] > ts then ts = s[2] end
      conv = sl ~= limit or sP ~= period or ocapu ~= capu or taken[i]
    end
    local need = rc * MICRO
    if tokens >= need then
      ok = 1
    elseif rc <= cap then
      retry = wait(need - tokens, pn, pd)
    end
    -- (a cost above the capacity reaches here only for a shadow rule: no
    -- wait helps, retry stays 0, and nothing is written, as in memory.go)
    -- before/after: the rule's state if nothing or this request is consumed
    local rest = tokens - need
    brem, breset = math.floor(tokens / MICRO), wait(capu - tokens, pn, pd)
    if brem < 0 then brem = 0 end
    local fmt, c1 = PTB0, nil
    if kind == 1 then fmt, c1 = PTB1, cap - 1 end
    if cost > 0 then
      if ok == 1 then
        arem, areset = math.floor(rest / MICRO), wait(capu - rest, pn, pd)
        writes[i] = struct.pack(fmt, #name, name, kind, rest, ts, limit - 1, period, c1)
      end
      if conv and rc <= cap then converts[i] = struct.pack(fmt, #name, name, kind, tokens, ts, limit - 1, period, c1) end
    end
  else
    -- sliding window counter
    if not weight then sliding_helpers() end
    local w = math.floor(now / period)
    local into = now - w * period
    local cur, prev = 0, 0
    local conv = false
    if s then
      local sw, sc, sp, sP = s[1], s[2], s[3], s[4]
      conv = sP ~= period or taken[i]
      if not sP and sw > w then
        -- written by an older script, maybe under another period: carry
        -- all of it rather than freeze the window
        cur = sc + sp
      elseif sP and sP ~= period then
        -- the period changed: carry what the old windows had used at now
        cur = window_use(sw, sc, sp, sP)
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
    local pw = ceil_div(prev * k, D)
    -- remaining and reset with c units in the current window
    brem = limit - cur - pw
    if brem < 0 then brem = 0 end
    if cur > 0 then breset = left + period elseif prev > 0 then breset = left end
    counts[i] = {cur, prev}
    local room = limit - cur - rc
    if room >= 0 and prev * k <= room * D then
      ok = 1
      if cost > 0 then
        arem = limit - cur - rc - pw
        if arem < 0 then arem = 0 end
        areset = left + period
        writes[i] = struct.pack(PSW, #name, name, 2, w, cur + rc, prev, period)
      end
    end
    if conv and cost > 0 then converts[i] = struct.pack(PSW, #name, name, 2, w, cur, prev, period) end
    if ok == 0 and rc <= limit then
      -- (a cost above the limit reaches here only for a shadow rule: no
      -- wait helps, retry stays 0)
      local kw = 0
      if room >= 0 then kw = max_weight(prev, room) end
      if kw >= 1 then
        -- wait until the previous window has decayed enough
        retry = left - last_left(kw, period)
      elseif cur <= limit - rc then
        -- the next window, where cur becomes prev at full weight
        retry = left
      else
        kw = max_weight(cur, limit - rc)
        if kw >= 1 then
          retry = left + period - last_left(kw, period)
        else
          retry = left + period
        end
      end
    end
  end

  if ok == 0 and math.floor(f / 4) % 2 == 0 then all = 0 end
  local b = 6 * i - 6
  V[b + 1], V[b + 2], V[b + 3], V[b + 4], V[b + 5], V[b + 6] = ok, retry, brem, breset, arem, areset
end

if cost == 0 then
  local res = {}
  for i = 1, n do
    local b = 6 * i - 6
    local cp = counts[i] or {0, 0}
    res[#res + 1] = st[i] and 1 or 0
    res[#res + 1] = V[b + 3]
    res[#res + 1] = cp[1]
    res[#res + 1] = cp[2]
    res[#res + 1] = V[b + 4]
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
  local b = 6 * i - 6
  local c = math.floor(R[i][2] / 16) + 1
  local rem, reset, rec = V[b + 3], V[b + 4], raw[i]
  if all == 1 and V[b + 1] == 1 then
    rem, reset, rec, dirty[c] = V[b + 5], V[b + 6], writes[i], true
  elseif converts[i] then
    -- A state read under another rule is written back converted (nothing
    -- consumed), so the change takes effect once and the retry given holds.
    rec, dirty[c] = converts[i], true
  end
  res[#res + 1] = V[b + 1]
  res[#res + 1] = rem
  res[#res + 1] = V[b + 2]
  res[#res + 1] = reset
  if rec then
    local pc = parts[c]
    pc[#pc + 1] = rec
    if reset > need[c] then need[c] = reset end
    local o = other[i]
    if o and rec == raw[i] then
      -- kept as it was, under the other algorithm: as long as it needs
      local fn = foreign_need(o[1], o[2], o[3])
      if fn and fn > need[c] then need[c] = fn end
    end
  end
end
res[#res + 1] = now

for c = 1, m do
  if dirty[c] then
    -- expiry: when the last record would read as full anyway, plus a
    -- second; absolute, which Redis propagates as given (it rewrites PX)
    local at = math.ceil((now + need[c]) / 1000) + 1000
    local v = table.concat(parts[c])
    if #keep[c] > 0 then v = v .. table.concat(keep[c]) end
    redis.call('SET', KEYS[c], v, 'PXAT', at)
  end
end

return res
