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
-- Reply: { allowed, r1_allowed, r1_remaining, r1_retry_us, r1_reset_us, ... }
-- all integers. If any non-shadow rule denies, nothing is written.
--
-- Time comes from Redis' clock; elapsed time is clamped at zero so a clock
-- step backwards never mints tokens. Token buckets count micro-tokens so the
-- refill of a few microseconds is not truncated away; a call loses at most
-- one micro-token to rounding, and only in the limiter's favour.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost = tonumber(ARGV[1])
local n = #KEYS
local MICRO = 1000000

local writes = {}
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
    -- token bucket: hash {tk = micro-tokens, ts = last update in us}
    local capu = cap * MICRO
    local st = redis.call('HMGET', KEYS[i], 'tk', 'ts')
    local tokens = capu
    if st[1] then
      local elapsed = now - tonumber(st[2])
      if elapsed < 0 then elapsed = 0 end
      tokens = tonumber(st[1]) + math.floor(elapsed * limit * MICRO / period)
      if tokens > capu then tokens = capu end
    end
    local need = cost * MICRO
    if tokens >= need then
      ok = 1
      retry = 0
    else
      ok = 0
      retry = math.ceil((need - tokens) * period / (limit * MICRO))
    end
    -- before/after: the rule's state if nothing or this request is consumed
    local rest = tokens - need
    local rate = limit * MICRO
    rb = {math.floor(tokens / MICRO), math.ceil((capu - tokens) * period / rate)}
    if ok == 1 then
      ra = {math.floor(rest / MICRO), math.ceil((capu - rest) * period / rate)}
      writes[i] = {0, KEYS[i], rest, ra[2]}
    end
  else
    -- sliding window counter: hash {w = window index, c = count in it,
    -- p = count in the window before}
    local w = math.floor(now / period)
    local into = now - w * period
    local st = redis.call('HMGET', KEYS[i], 'w', 'c', 'p')
    local cur, prev = 0, 0
    if st[1] then
      local sw = tonumber(st[1])
      if sw == w then
        cur, prev = tonumber(st[2]), tonumber(st[3])
      elseif sw == w - 1 then
        prev = tonumber(st[2])
      elseif sw > w then
        -- Redis' clock stepped back across a window: keep the newer counts.
        w = sw
        into = 0
        cur, prev = tonumber(st[2]), tonumber(st[3])
      end
    end
    -- weighted = prev*(period-into)/period + cur, compared times period
    local left = period - into
    local used = prev * left + cur * period
    local function state(c, u)
      local rem = math.floor((limit * period - u) / period)
      if rem < 0 then rem = 0 end
      local rs = 0
      if c > 0 then rs = left + period elseif prev > 0 then rs = left end
      return {rem, rs}
    end
    rb = state(cur, used)
    if used + cost * period <= limit * period then
      ok = 1
      retry = 0
      ra = state(cur + cost, used + cost * period)
      writes[i] = {1, KEYS[i], w, cur + cost, prev, left + period}
    else
      ok = 0
      if cur + cost <= limit then
        -- wait until the previous window has decayed enough
        local need = prev * left - (limit - cur - cost) * period
        retry = math.ceil(need / prev)
      else
        -- wait for the next window, where cur becomes prev
        local extra = 0
        if cur > 0 then
          extra = period - math.floor((limit - cost) * period / cur)
          if extra < 0 then extra = 0 end
        end
        retry = left + extra
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

if all == 1 then
  for _, wr in pairs(writes) do
    -- expiry: when the state would read as fresh anyway, plus a second
    local ttl = math.ceil(wr[#wr] / 1000) + 1000
    if wr[1] == 0 then
      redis.call('HSET', wr[2], 'tk', wr[3], 'ts', now)
    else
      redis.call('HSET', wr[2], 'w', wr[3], 'c', wr[4], 'p', wr[5])
    end
    redis.call('PEXPIRE', wr[2], ttl)
  end
end

return res
