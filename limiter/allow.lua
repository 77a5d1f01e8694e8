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

local res = {}
local writes = {}
local all = 1

for i = 1, n do
  local base = 2 + 5 * (i - 1)
  local algo = tonumber(ARGV[base])
  local limit = tonumber(ARGV[base + 1])
  local period = tonumber(ARGV[base + 2])
  local cap = tonumber(ARGV[base + 3])
  local shadow = tonumber(ARGV[base + 4])
  local ok, remaining, retry, reset

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
    local after = tokens
    if tokens >= need then
      ok = 1
      after = tokens - need
      retry = 0
    else
      ok = 0
      retry = math.ceil((need - tokens) * period / (limit * MICRO))
    end
    remaining = math.floor(after / MICRO)
    reset = math.ceil((capu - after) * period / (limit * MICRO))
    if ok == 1 then
      writes[#writes + 1] = {0, KEYS[i], after, reset}
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
    if used + cost * period <= limit * period then
      ok = 1
      cur = cur + cost
      used = used + cost * period
      retry = 0
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
    remaining = math.floor((limit * period - used) / period)
    if remaining < 0 then remaining = 0 end
    if cur > 0 then
      reset = left + period
    elseif prev > 0 then
      reset = left
    else
      reset = 0
    end
    if ok == 1 then
      writes[#writes + 1] = {1, KEYS[i], w, cur, prev, left + period}
    end
  end

  if ok == 0 and shadow == 0 then all = 0 end
  res[#res + 1] = ok
  res[#res + 1] = remaining
  res[#res + 1] = retry
  res[#res + 1] = reset
end

if all == 1 then
  for _, wr in ipairs(writes) do
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

table.insert(res, 1, all)
return res
