-- allow.lua: checks every rule of one key at once, all-or-nothing.
--
-- KEYS[i]   state of rule i; all keys share one {hash tag}.
-- ARGV[1]   cost (integer > 0)
-- ARGV[2+5*(i-1) ...] for rule i:
--   algo      0 = token bucket, 1 = sliding window
--   limit     units per period
--   period    microseconds
--   capacity  token bucket capacity (burst); the limit for sliding window
--   shadow    1 when the rule never denies
--
-- Reply: { allowed, r1_allowed, r1_remaining, r1_retry_us, r1_reset_us, ...,
-- now_us } all integers; now_us is the Redis time the rules were checked at.
-- If any non-shadow rule denies, nothing is consumed: the only write is of
-- a state converted to a changed rule.
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
-- Each state records the rule it was written under, so a changed rule
-- converts it: a token bucket refills at its old rate up to now, then a
-- raised capacity adds its difference and a lowered one clamps; a sliding
-- window whose period changed carries what it had used into the current
-- window of the new period. States without these fields (written by an
-- older script) are read as written under the current rule.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost = tonumber(ARGV[1])
local n = #KEYS
local MICRO = 1000000
local EXACT = 9007199254740992 -- 2^53
local D = 1048576 -- 2^20, the sliding window's weight resolution

-- b/c in lowest terms, so that for round periods and limits the products
-- below stay exact
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

local writes, converts = {}, {}
local oks, retries, before, after = {}, {}, {}, {}
local all = 1

for i = 1, n do
  local base = 2 + 5 * (i - 1)
  local algo = tonumber(ARGV[base])
  local limit = tonumber(ARGV[base + 1])
  local period = tonumber(ARGV[base + 2])
  local cap = tonumber(ARGV[base + 3])
  local shadow = tonumber(ARGV[base + 4])
  local ok, retry, rb, ra

  if algo == 0 then
    -- token bucket: hash {tk = micro-tokens, ts = last update in us,
    -- l, P, c = the limit, period and capacity it was written under}
    local capu = cap * MICRO
    local st = redis.call('HMGET', KEYS[i], 'tk', 'ts', 'l', 'P', 'c')
    local pn, pd = reduce(period, limit * MICRO) -- us per micro-token
    local tokens = capu
    local ts = now
    local conv = false
    if st[1] then
      local sts = tonumber(st[2])
      local ol = tonumber(st[3]) or limit
      local op = tonumber(st[4]) or period
      local ocapu = (tonumber(st[5]) or cap) * MICRO
      local elapsed = now - sts
      if elapsed < 0 then elapsed = 0 end
      local rn, rd = pd, pn
      if ol ~= limit or op ~= period then rn, rd = reduce(ol * MICRO, op) end
      local refill = muldiv_floor(elapsed, rn, rd)
      if refill > ocapu then refill = ocapu end
      tokens = tonumber(st[1]) + refill
      if tokens > ocapu then tokens = ocapu end
      if capu > ocapu then tokens = tokens + capu - ocapu end
      if tokens > capu then tokens = capu end
      if sts > ts then ts = sts end
      conv = ol ~= limit or op ~= period or ocapu ~= capu or st[3] == false
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
    if ok == 1 then
      ra = {math.floor(rest / MICRO), wait(capu - rest, pn, pd)}
      writes[i] = {0, KEYS[i], rest, ts, limit, period, cap, not st[1] or conv, ra[2]}
    end
    if conv then
      converts[i] = {0, KEYS[i], tokens, ts, limit, period, cap, true, rb[2]}
    end
  else
    -- sliding window counter: hash {w = window index, c = count in it,
    -- p = count in the window before, P = the period they count in}
    local w = math.floor(now / period)
    local into = now - w * period
    local st = redis.call('HMGET', KEYS[i], 'w', 'c', 'p', 'P')
    local cur, prev = 0, 0
    local conv = false
    if st[1] then
      local sw, sc, sp = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
      local sP = tonumber(st[4])
      conv = sP ~= period
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
    rb = state(cur)
    local room = limit - cur - cost
    ok, retry = 0, 0
    if room >= 0 and prev * k <= room * D then
      ok = 1
      ra = state(cur + cost)
      writes[i] = {1, KEYS[i], w, cur + cost, prev, period, not st[1] or conv, left + period}
    end
    if conv then
      converts[i] = {1, KEYS[i], w, cur, prev, period, true, left + period}
    end
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

  if ok == 0 and shadow == 0 then all = 0 end
  oks[i], retries[i], before[i], after[i] = ok, retry, rb, ra
end

-- Report each rule's state as it is after this call: consumed only if the
-- whole request was allowed and the rule itself admitted it.
local res = {all}
for i = 1, n do
  local st = before[i]
  if all == 1 and oks[i] == 1 then st = after[i] end
  res[#res + 1] = oks[i]
  res[#res + 1] = st[1]
  res[#res + 1] = retries[i]
  res[#res + 1] = st[2]
end
res[#res + 1] = now

local function put(wr)
  -- expiry: when the state would read as fresh anyway, plus a second
  local ttl = math.ceil(wr[#wr] / 1000) + 1000
  -- the rule's fields only when they change (a new or converted state)
  if wr[1] == 0 and wr[8] then
    redis.call('HSET', wr[2], 'tk', wr[3], 'ts', wr[4], 'l', wr[5], 'P', wr[6], 'c', wr[7])
  elseif wr[1] == 0 then
    redis.call('HSET', wr[2], 'tk', wr[3], 'ts', wr[4])
  elseif wr[7] then
    redis.call('HSET', wr[2], 'w', wr[3], 'c', wr[4], 'p', wr[5], 'P', wr[6])
  else
    redis.call('HSET', wr[2], 'w', wr[3], 'c', wr[4], 'p', wr[5])
  end
  redis.call('PEXPIRE', wr[2], ttl)
end

for i = 1, n do
  if all == 1 and oks[i] == 1 then
    put(writes[i])
  elseif converts[i] then
    -- A state read under another rule is written back converted (nothing
    -- consumed), so the change takes effect once and the retry given holds.
    put(converts[i])
  end
end

return res
