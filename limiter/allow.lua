#!lua name=@LIBRARY@
-- allow.lua: checks every rule of one identity at once, all-or-nothing. It
-- is a Redis Functions library (FUNCTION LOAD once: compiled once, its
-- helpers made once, replicated and persisted with the data), and the same
-- source, without its first line, runs by EVALSHA where a server has no
-- functions. Go names the library and its function after a hash of the
-- source (@LIBRARY@, @FUNCTION@), so builds side by side never replace each
-- other's.
--
-- One call (FCALL @FUNCTION@, or EVALSHA) runs q checks, coalesced by the
-- limiter from concurrent requests; each is atomic and all-or-nothing on its
-- own, and all of them see one Redis time.
--
-- KEYS         every check's keys, one check after the other: its m
--              containers, the string keys holding packed rule states (one
--              for the identity's named rules, one per Rule.Bucket), all
--              under one {hash tag} (see layout in redis.go), then,
--              optionally, each rule's key in the previous layout (a hash
--              per rule), read only while the rule has no state of its own.
-- ARGV[1]      q, the number of checks; then per check:
--   nkeys      how many of KEYS are this check's
--   cost       integer > 0, charged to every rule without a cost of its
--              own; 0 inspects (computes, writes nothing); -1 resets the
--              rules (drops their states and old keys); -2 lists the states
--              of its first key and deletes it (no rules); -3 grants each
--              rule (all calendar rules) rcost more units in the window
--              now holds (negative takes back, never below no grant)
--   m          the number of containers
--   seq        bit 1: the check numbers its decision (cost > 0 only) in
--              the sequence record of its first container; bit 2: every
--              charge admits (a settlement: what a request used beyond
--              its reservation, known after its answer), overdrawing a
--              rule past its capacity, its debt capped at one capacity (a
--              token bucket's tokens at minus its capacity, a window's
--              count at twice its limit or limit + grant + limit)
--   rules      the n rules' fields, each struct-packed '<BI5I6I5I6I7i7'
--              (37 bytes), all in one string. They name no state, so one
--              compiled plan serves every identity with the same rules:
--     flags    kind + 4*shadow + 8*share + 16*(container - 1); kind 0 =
--              token bucket with capacity = limit, 1 = token bucket, 2 =
--              sliding window, 3 = calendar (fixed window); share marks a
--              split's share (see below)
--     limit    units per period
--     period   microseconds
--     capacity token bucket capacity (burst); the limit for sliding window
--     pn, pd   token bucket: period / (limit × 10^6) in lowest terms, the
--              microseconds per micro-token (reduced once, in Go)
--     rcost    what a check charges this rule instead of cost when non-zero
--              (|rcost| at most 2^53); negative gives -rcost units back
--              (never above capacity; a sliding window's or a calendar
--              window's current count, never below zero) and always allows.
--              A calendar rule (kind 3) has no rate, and reads period,
--              capacity, pn and pd as the windows Go computed from its own
--              clock in the rule's zone (Lua has no zone database): the
--              current window's length in us (period), the previous one's
--              in ms (capacity), the next one's in us (pn), and the current
--              one's start, us since the epoch (pd). The window holding
--              Redis' time among those three is the one counted, so the
--              boundary falls on Redis' clock and gateways whose clocks
--              differ by seconds agree; a Redis time outside all three is
--              an error. A calendar rule's give-back comes off the window
--              Go named current, or off none once that has ended.
--              An in-flight rule (kind 0 with pn 0) admits at most limit
--              requests of the key at once: a check takes a lease on a
--              slot, lease id pd, for period us (rcost 1; taking a lease
--              the record already holds renews it, admitted whatever the
--              count), and rcost -1 releases it. Its record lists the
--              leases (kind 4); one past its expiry is no lease.
--   prefix     n arguments: each rule's record prefix, its bucket's name
--              length (1 byte), the name, its kind (1 byte), as its
--              record in a container starts (see below). A split's
--              check names each rule twice under one name: its share in
--              the shares' container, its whole in the key's.
--
-- Reply: an array of q replies, each an error, or by the check's cost:
--   > 0: one string, struct-packed '<B' then '<BI5I7I7' per rule then '<I7':
--        allowed, then each rule's allowed, remaining, retry us, reset us,
--        then now_us, the Redis time the rules were checked at; with seq,
--        then '<I7I7': the sequence's epoch (the Redis time, us, of its
--        first decision) and this decision's number in it (1, 2, ...),
--        allowed or denied alike. If any
--        non-shadow rule denies, nothing is consumed: the only write is of
--        a state converted to a changed rule (or taken over from the
--        previous layout).
--   0:   { r1_found, r1_remaining, r1_count, r1_previous, r1_reset_us, ...,
--        ttl_ms, now_us }; a calendar rule's previous is its grant
--   -3:  { r1_granted, r1_count, r1_remaining, r1_start_us, r1_end_us, ...,
--        now_us }
--   -1:  { states dropped }
--   -2:  { name1, kind1, ... } of the states the key held.
--
-- A container is a string of records, each struct-packed as name length
-- (1 byte), name, kind (1 byte), then by kind
--   0: micro-tokens i7 (signed: negative while a lowered capacity is
--      overdrawn), last update us I7, limit-1 I4, period us I6
--   1: the same, then capacity-1 I4
--   2: window index I6, count in it I5, count in the one before I5,
--      period us I6
--   3: window start us I7, window length us I6, count in it I5, units
--      granted in it I5
--   4: leases I2, then per lease its id I7 and expiry us I7
-- so a record remembers the rule it was written under. A record with an
-- empty name and kind 3 is no rule's: it is the sequence record, last in
-- the first container of a numbered check, its "window" the sequence's
-- epoch and how long it lasts (as long as the container: it keeps no
-- container alive), its count the number of the last decision. Shaped as
-- a calendar record, a script of an earlier build keeps it as a rule's
-- not in its call while its window runs; one that ended, or a container
-- gone, starts a new epoch. Most checks find
-- exactly their own records, in their order, under the rules they were
-- written with: the fast path reads them with one unpack and writes them
-- back from pieces made once per rule set. Anything else takes the general
-- path: a record is matched by name and algorithm, else by name alone (its
-- algorithm changed: see below); records of rules not in this call ride
-- along untouched until they read as full, then are dropped. A written
-- container expires when its last record would read as full anyway, plus
-- a second.
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
-- under both capacities (gateways mid reload) would be held to neither. A
-- split's share (flag share) is the exception: one that grows keeps the
-- tokens it had (its units moved from another gateway's share), and one
-- that shrinks clamps. From then on it refills at the new rate. A share
-- that reads as full starts full at its new capacity, as it would with no
-- state: a full record is dropped a second later anyway (and the memory
-- store forgets it at once), so the stores agree whatever they kept. A
-- sliding window whose period changed carries what it had used into the
-- current window of the new period; a changed limit keeps its counts (in
-- units). A changed algorithm carries what the old state had used at now,
-- in units, rounded up: into the current window of a sliding window or a
-- calendar rule, or out of a full token bucket; the converted record
-- replaces the old one. A calendar window is keyed by its start: a record
-- of an earlier window that has ended is no state; one of a later window
-- (Redis' clock stepped back across the boundary) is kept as the window;
-- one of an earlier window still running by its own length (the rule's
-- calendar changed: zone, start or unit) carries its count and grant into
-- the window that holds now.
-- States of the previous layout without these fields (written by an older
-- script still) are read as written under the current rule.

local MICRO = 1000000
local EXACT = 9007199254740992 -- 2^53
local D = 1048576 -- 2^20, the sliding window's weight resolution
local TB0, TB1, SW, CAL = '<i7I7I4I6', '<i7I7I4I6I4', '<I6I5I5I6', '<I7I6I5I5' -- records by kind
local PTB0, PTB1, PSW, PCAL = 'Bc0B' .. TB0, 'Bc0B' .. TB1, 'Bc0B' .. SW, 'Bc0B' .. CAL -- with name and kind
local GRANTMAX = 4294967296 -- 2^32, the most units a window's grant holds
local RULE, RULESIZE = '<BI5I6I5I6I7i7', 37
-- The sequence record (see the header): empty name, kind 3, epoch us,
-- length us, count, 0; SEQSIZE bytes, starting SEQHEAD.
local SEQREC, SEQHEAD, SEQSIZE = '<BBI7I6I5I5', '\0\3', 25
-- A record's size after its name and kind, by kind; an in-flight record's
-- (kind 4) by its leases (recsize).
local SIZES = {[0] = 24, [1] = 28, [2] = 22, [3] = 23}
-- The standard libraries, read at the first call: a library's code runs
-- at FUNCTION LOAD without them.
local floor, ceil, fmod, pack, unpack_s, sub, rep, unpack_t, concat
local function init()
  floor, ceil, fmod = math.floor, math.ceil, math.fmod
  pack, unpack_s, sub, rep = struct.pack, struct.unpack, string.sub, string.rep
  unpack_t, concat = unpack, table.concat
end

-- floor(a*b/c) for b/c in lowest terms, never above the exact value
local function muldiv_floor(a, b, c)
  local p = a * b
  local q = floor(p / c)
  if p > EXACT then q = q - 1 end
  if q < 0 then q = 0 end
  return q
end

-- ceil(a*b/c) for b/c in lowest terms, never below the exact value, capped
-- at 2^53 us
local function wait(a, b, c)
  local p = a * b
  local q = ceil(p / c)
  if p > EXACT then q = q + 2 end
  if q > EXACT then q = EXACT end
  return q
end

-- b/c in lowest terms, for rules Go did not reduce (stored states)
local function reduce(b, c)
  local x, y = b, c
  while y > 0 do x, y = y, fmod(x, y) end
  return b / x, c / x
end

local function ceil_div(a, b) return floor((a + b - 1) / b) end

-- the size of a record of kind at p (after its name and kind) in s
local function recsize(kind, s, p)
  if kind == 4 then return 2 + 14 * unpack_s('<I2', s, p) end
  return SIZES[kind]
end

-- the leases of an in-flight record at p in s still running at now: a
-- list of {id, expiry}
local function leases(s, p, now)
  local n, q = unpack_s('<I2', s, p)
  local out = {}
  for _ = 1, n do
    local id, exp
    id, exp, q = unpack_s('<I7I7', s, q)
    if exp > now then out[#out + 1] = {id, exp} end
  end
  return out
end

-- the previous window's weight (in 1/D) when left us of the window remain
local function weight(left, period)
  local k = floor(left * D / period) + 1
  if k > D then k = D end
  return k
end

-- the largest weight k with prev*k <= room*D
local function max_weight(prev, room)
  local k = floor(room * D / prev)
  if k > D then k = D end
  while k > 0 and prev * k > room * D do k = k - 1 end
  while k < D and prev * (k + 1) <= room * D do k = k + 1 end
  return k
end

-- the most us left in a window at which the weight is at most k (k >= 1)
local function last_left(k, period)
  local l = ceil(k * period / D) - 1
  if l > period then l = period end
  while l < period and weight(l + 1, period) <= k do l = l + 1 end
  while l > 0 and weight(l, period) > k do l = l - 1 end
  return l
end

-- How long a sliding window denial of rc units waits, with cur and prev
-- units in the current and previous window, left us of the window to go.
local function window_retry(cur, prev, limit, rc, left, period)
  local room = limit - cur - rc
  local kw = 0
  if room >= 0 then kw = max_weight(prev, room) end
  if kw >= 1 then
    -- until the previous window has decayed enough
    return left - last_left(kw, period)
  elseif cur <= limit - rc then
    -- the next window, where cur becomes prev at full weight
    return left
  end
  kw = max_weight(cur, limit - rc)
  if kw >= 1 then return left + period - last_left(kw, period) end
  return left + period
end

-- What a sliding window state (window sw, counts sc and sp) had used at
-- now, in units, by its own period sP; the counts of a window Redis'
-- clock stepped back across are kept whole.
local function window_use(now, sw, sc, sp, sP)
  local ow = floor(now / sP)
  local oleft = sP - (now - ow * sP)
  if sw == ow then return sc + ceil_div(sp * weight(oleft, sP), D) end
  if sw == ow - 1 then return ceil_div(sc * weight(oleft, sP), D) end
  if sw > ow then return sc + sp end
  return 0
end

-- How long (us) a record of a rule not in this call still needs to be
-- kept, by the rule it was written under; nil once it reads as full.
local function foreign_need(now, kind, s, p)
  if kind == 4 then
    local need = nil
    for _, l in ipairs(leases(s, p, now)) do
      if not need or l[2] - now > need then need = l[2] - now end
    end
    return need
  end
  if kind == 3 then
    local ws, wl = unpack_s(CAL, s, p)
    if ws + wl > now then return ws + wl - now end
    return nil
  end
  if kind == 2 then
    local w, _, _, P = unpack_s(SW, s, p)
    local ow = floor(now / P)
    if w >= ow then return (w + 2) * P - now end
    if w == ow - 1 then return (ow + 1) * P - now end
    return nil
  end
  local tk, ts, l1, P, c1 = unpack_s(kind == 1 and TB1 or TB0, s, p)
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

-- A container's expiry: when its last record would read as full anyway
-- (need us from now), plus a second; absolute, which Redis propagates as
-- given (it rewrites PX).
local function expiry(now, need) return ceil((now + need) / 1000) + 1000 end

-- algorithm families: a record of another family is the rule's state under
-- its other algorithm
local function family(kind)
  if kind == 1 then return 0 end
  return kind
end

-- a rule's family, by its fields R[i] (see general): an in-flight rule's
-- records are kind 4
local function rfamily(r)
  if r.inflight then return 4 end
  return family(r[2] % 4)
end

-- The calendar window holding now, from the windows in rule r's fields
-- (see the header): its start and length; nil when now is in none of them.
local function calendar_window(r, now)
  local s, len = r[7], r[4]
  if now < s then
    local pl = r[5] * 1000
    if now < s - pl then return nil end
    return s - pl, pl
  end
  if now < s + len then return s, len end
  if now < s + len + r[6] then return s + len, r[6] end
  return nil
end

-- A calendar rule's state in window ws (wl long) at now, from its record
-- st ({start, length, count, grant}; nil: none): the window counted (a
-- later one when Redis' clock stepped back across a boundary), its count
-- and grant, and whether the record must be rewritten for this window.
local function calendar_state(st, ws, wl, now)
  if not st then return ws, wl, 0, 0, false end
  local ss, sl, sc, sg = st[1], st[2], st[3], st[4]
  if ss == ws then return ws, wl, sc, sg, sl ~= wl end
  if ss > ws then return ss, sl, sc, sg, false end
  if ss + sl > now then return ws, wl, sc, sg, true end
  return ws, wl, 0, 0, false
end

-- general checks one call's rules the long way (see the header); keys[k0 +
-- 1 .. k0 + nk] are its keys, got (when the fast path already read them)
-- its containers' values, false where absent.
local function general(keys, k0, nk, cost, m, blob, args, a, now, got, over)
  -- The rules: R[i] = {name, flags, limit, period, capacity, pn, pd, rcost},
  -- byname[c][name] their indexes by container: a split's check names each
  -- rule twice, its share in the shares' container and its whole in the
  -- key's (see withWholes in directive.go).
  local R, byname, n = {}, {}, #blob / RULESIZE
  for i = 1, n do
    local pre = args[a + i]
    local name = sub(pre, 2, #pre - 1)
    local r = {name, unpack_s(RULE, blob, RULESIZE * (i - 1) + 1)}
    r.inflight = r[2] % 4 == 0 and r[6] == 0
    R[i] = r
    local c = floor(r[2] / 16) + 1
    if not byname[c] then byname[c] = {} end
    byname[c][name] = i
  end
  local legacy = nk >= m + n

  -- Each calendar rule's window at Redis' time: CW[i] = {start, length}.
  local CW = {}
  if cost >= 0 or cost == -3 then
    for i = 1, n do
      local r = R[i]
      if r[2] % 4 == 3 then
        local ws, wl = calendar_window(r, now)
        if not ws then
          return redis.error_reply('limiter: calendar rule ' .. r[1] .. ': Redis time ' .. now ..
            ' us is in none of the windows the gateway sent (is its clock a day off?)')
        end
        CW[i] = {ws, wl}
      end
    end
  end

  -- Read the containers: each rule's stored state st[i] (token bucket:
  -- {tokens, ts, limit, period, capacity}; sliding window: {window, count,
  -- previous, period}), raw[i] its bytes, and the records of other rules
  -- still worth keeping.
  local st, raw, keep, kneed, names = {}, {}, {}, {}, {}
  local other, oraw = {}, {} -- a rule's record under its other algorithm
  for c = 1, m do
    local s
    if got then s = got[c] or nil else s = redis.call('GET', keys[k0 + c]) end
    keep[c], kneed[c] = {}, 0
    if s then
      local p0, len = 1, #s
      while p0 <= len do
        local name, kind, p = unpack_s('Bc0B', s, p0)
        local size = SIZES[kind]
        if kind == 4 then size = recsize(kind, s, p) end
        if not size then
          return redis.error_reply('limiter: unknown state kind ' .. kind .. ' in ' .. keys[k0 + c])
        end
        local e = p + size
        local i = byname[c] and byname[c][name]
        local r = R[i]
        if cost == -2 then
          names[#names + 1] = name
          names[#names + 1] = kind
        elseif r and floor(r[2] / 16) + 1 == c and family(kind) == rfamily(r) then
          if kind == 4 then
            st[i] = leases(s, p, now)
          elseif kind == 3 then
            st[i] = {unpack_s(CAL, s, p)}
          elseif kind == 2 then
            st[i] = {unpack_s(SW, s, p)}
          else
            local tk, ts, l1, P, c1 = unpack_s(kind == 1 and TB1 or TB0, s, p)
            st[i] = {tk, ts, l1 + 1, P, (kind == 1 and c1 or l1) + 1}
          end
          raw[i] = sub(s, p0, e - 1)
        elseif r and floor(r[2] / 16) + 1 == c then
          -- the rule's record under its other algorithm (the algorithm
          -- changed): converted below, never kept beside the rule's own;
          -- leases and counts do not convert: the rule starts afresh
          if kind ~= 4 and not r.inflight then other[i], oraw[i] = {kind, s, p}, sub(s, p0, e - 1) end
        else
          local need = foreign_need(now, kind, s, p)
          if need then
            keep[c][#keep[c] + 1] = sub(s, p0, e - 1)
            if need > kneed[c] then kneed[c] = need end
          end
        end
        p0 = e
      end
    end
  end

  if cost == -2 then
    redis.call('DEL', keys[k0 + 1])
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
        if raw[i] and floor(R[i][2] / 16) + 1 == c then had = true end
      end
      if had then
        if #keep[c] == 0 then
          redis.call('DEL', keys[k0 + c])
        else
          redis.call('SET', keys[k0 + c], concat(keep[c]), 'KEEPTTL')
        end
      end
    end
    for i = 1, n do
      if raw[i] then dropped = dropped + 1 end
      if legacy then dropped = dropped + redis.call('DEL', keys[k0 + m + i]) end
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
      if not st[i] and not other[i] and R[i][2] % 4 ~= 3 and not R[i].inflight then missing[#missing + 1] = keys[k0 + m + i] end
    end
    if #missing == 0 or redis.call('EXISTS', unpack_t(missing)) == 0 then legacy = false end
  end
  if legacy then
    for i = 1, n do
      if not st[i] and not other[i] and R[i][2] % 4 ~= 3 and not R[i].inflight then
        local r = R[i]
        if r[2] % 4 == 2 then
          local h = redis.call('HMGET', keys[k0 + m + i], 'w', 'c', 'p', 'P')
          if h[1] then
            -- no period: written by an older script still (see below)
            st[i] = {tonumber(h[1]), tonumber(h[2]), tonumber(h[3]), tonumber(h[4]) or false}
          end
        else
          local h = redis.call('HMGET', keys[k0 + m + i], 'tk', 'ts', 'l', 'P', 'c')
          if h[1] then
            st[i] = {tonumber(h[1]), tonumber(h[2]), tonumber(h[3]) or r[3], tonumber(h[4]) or r[4], tonumber(h[5]) or r[5]}
          end
        end
        taken[i] = st[i] ~= nil
      end
    end
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
      if kind == 3 then
        local ws, wl, cnt = unpack_s(CAL, s, p)
        used = 0
        if ws + wl > now then used = cnt end
      elseif kind == 2 then
        local sw, sc, sp, sP = unpack_s(SW, s, p)
        used = window_use(now, sw, sc, sp, sP)
      else
        local tk, ts, l1, P, c1 = unpack_s(kind == 1 and TB1 or TB0, s, p)
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
      if r[2] % 4 == 3 then
        st[i] = {CW[i][1], CW[i][2], used, 0}
      elseif r[2] % 4 == 2 then
        st[i] = {floor(now / r[4]), used, 0, r[4]}
      else
        -- (overdrawn when a lowered limit's window had used more)
        st[i] = {(r[5] - used) * MICRO, now, r[3], r[4], r[5]}
      end
      taken[i] = true
    end
  end

  if cost == -3 then
    -- A grant: rcost more units (or fewer, never below none) for the
    -- window now holds; it ends with the window, whose record it rides in.
    local res, parts, need = {}, {}, {}
    for c = 1, m do parts[c], need[c] = {}, kneed[c] end
    for i = 1, n do
      local r = R[i]
      if r[2] % 4 ~= 3 then
        return redis.error_reply('limiter: rule ' .. r[1] .. ' is not a calendar rule: only a calendar window takes a grant')
      end
      local ws, wl, cur, grant = calendar_state(st[i], CW[i][1], CW[i][2], now)
      grant = grant + r[8]
      if grant < 0 then grant = 0 elseif grant > GRANTMAX then grant = GRANTMAX end
      local rem = r[3] + grant - cur
      if rem < 0 then rem = 0 end
      local c = floor(r[2] / 16) + 1
      local pc = parts[c]
      pc[#pc + 1] = pack(PCAL, #r[1], r[1], 3, ws, wl, cur, grant)
      if ws + wl - now > need[c] then need[c] = ws + wl - now end
      local q = #res
      res[q + 1], res[q + 2], res[q + 3], res[q + 4], res[q + 5] = grant, cur, rem, ws, ws + wl
    end
    res[#res + 1] = now
    for c = 1, m do
      if #parts[c] > 0 then
        local v = concat(parts[c])
        if #keep[c] > 0 then v = v .. concat(keep[c]) end
        redis.call('SET', keys[k0 + c], v, 'PXAT', expiry(now, need[c]))
      end
    end
    return res
  end

  -- V[6i-5 .. 6i]: rule i's verdict, retry, and its remaining and reset
  -- before and after consuming this request.
  local V, writes, converts, counts, life = {}, {}, {}, {}, {}
  local all = 1

  for i = 1, n do
    local r = R[i]
    local name, f, limit, period, cap = r[1], r[2], r[3], r[4], r[5]
    local kind = f % 4
    -- what this rule is charged: its own cost in a check, else the call's;
    -- either is above the capacity only for a shadow rule (Go answers the
    -- others), so every exact product below stays under 2^53
    local rc = cost
    if cost > 0 and r[8] ~= 0 then rc = r[8] end
    local s = st[i]
    local ok, retry, brem, breset, arem, areset = 0, 0, 0, 0, 0, 0

    if r.inflight then
      -- in flight: the leases running at now (s), this check's lease pd
      local live, mine, lease = s or {}, nil, r[7]
      local last, first = 0, nil
      for j, l in ipairs(live) do
        if l[1] == lease then mine = j end
        if l[2] - now > last then last = l[2] - now end
        if not first or l[2] < first then first = l[2] end
      end
      brem, breset = limit - #live, last
      if brem < 0 then brem = 0 end
      counts[i] = {#live, 0}
      if rc < 0 then
        ok = 1
        if mine then table.remove(live, mine) end
      elseif mine then
        -- a renewal: admitted whatever the count
        ok = 1
        live[mine] = {lease, now + period}
      elseif #live < limit then
        ok = 1
        live[#live + 1] = {lease, now + period}
      else
        -- a slot frees when an answer ends, or at the first lease's
        -- expiry: a second at most
        retry = first - now
        if retry > MICRO then retry = MICRO end
      end
      if ok == 1 and cost > 0 then
        arem, areset = limit - #live, 0
        if arem < 0 then arem = 0 end
        local rec = {pack('Bc0B<I2', #name, name, 4, #live)}
        for _, l in ipairs(live) do
          rec[#rec + 1] = pack('<I7I7', l[1], l[2])
          if l[2] - now > areset then areset = l[2] - now end
        end
        writes[i] = concat(rec)
      end
    elseif kind == 3 then
      -- calendar: a fixed window, limit plus its grant
      local ws, wl, cur, grant, conv = calendar_state(s, CW[i][1], CW[i][2], now)
      conv = conv or taken[i]
      local room = limit + grant
      local left = ws + wl - now
      life[i] = left
      brem = room - cur
      if brem < 0 then brem = 0 end
      if cur > 0 then breset = left end
      counts[i] = {cur, grant}
      local after = cur + rc
      if rc < 0 then
        ok = 1
        -- a give-back comes off the window Go named (pd: see giveBackArgs),
        -- or off none once that is history
        if ws ~= r[7] then after = cur end
        if after < 0 then after = 0 end
      elseif after <= room then
        ok = 1
      elseif over then
        ok = 1
        if after > room + limit then after = cur > room + limit and cur or room + limit end
      elseif rc <= limit then
        -- the next window admits a cost up to the limit
        retry = left
      end
      if ok == 1 and cost > 0 then
        arem = room - after
        if arem < 0 then arem = 0 end
        if after > 0 then areset = left end
        writes[i] = pack(PCAL, #name, name, 3, ws, wl, after, grant)
      end
      if conv and cost > 0 then converts[i] = pack(PCAL, #name, name, 3, ws, wl, cur, grant) end
    elseif kind ~= 2 then
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
        if floor(f / 8) % 2 == 0 or (capu > ocapu and tokens >= ocapu) then tokens = tokens + capu - ocapu end
        if tokens > capu then tokens = capu end
        if s[2] > ts then ts = s[2] end
        conv = sl ~= limit or sP ~= period or ocapu ~= capu or taken[i]
      end
      local need = rc * MICRO
      if rc < 0 or tokens >= need or over then
        ok = 1
      elseif rc <= cap then
        retry = wait(need - tokens, pn, pd)
      end
      -- (a cost above the capacity reaches here only for a shadow rule: no
      -- wait helps, retry stays 0, and nothing is written, as in memory.go)
      -- before/after: the rule's state if nothing or this request is consumed
      local rest = tokens - need
      if rest > capu then rest = capu end
      -- (a settlement's debt stops at one capacity, or where it already was)
      if over and rest < -capu then rest = tokens < -capu and tokens or -capu end
      brem, breset = floor(tokens / MICRO), wait(capu - tokens, pn, pd)
      if brem < 0 then brem = 0 end
      local fmt, c1 = PTB0, nil
      if kind == 1 then fmt, c1 = PTB1, cap - 1 end
      if cost > 0 then
        if ok == 1 then
          arem, areset = floor(rest / MICRO), wait(capu - rest, pn, pd)
          if arem < 0 then arem = 0 end
          writes[i] = pack(fmt, #name, name, kind, rest, ts, limit - 1, period, c1)
        end
        if conv and rc <= cap then converts[i] = pack(fmt, #name, name, kind, tokens, ts, limit - 1, period, c1) end
      end
    else
      -- sliding window counter
      local w = floor(now / period)
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
          cur = window_use(now, sw, sc, sp, sP)
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
      local after, pafter = cur + rc, prev
      if rc < 0 then
        ok = 1
        -- a give-back naming the window it was charged in (pn, see
        -- giveBackArgs) comes off that window, or off none once it is
        -- history
        local gw = r[6]
        if gw > 0 and gw ~= w then
          after = cur
          if gw == w - 1 then pafter = prev + rc end
          if pafter < 0 then pafter = 0 end
        end
        if after < 0 then after = 0 end
      else
        local room = limit - after
        if room >= 0 and prev * k <= room * D then
          ok = 1
        elseif over then
          ok = 1
          if after > 2 * limit then after = cur > 2 * limit and cur or 2 * limit end
        end
      end
      if ok == 1 and cost > 0 then
        arem = limit - after - ceil_div(pafter * k, D)
        if arem < 0 then arem = 0 end
        if after > 0 then areset = left + period elseif pafter > 0 then areset = left end
        writes[i] = pack(PSW, #name, name, 2, w, after, pafter, period)
      end
      if conv and cost > 0 then converts[i] = pack(PSW, #name, name, 2, w, cur, prev, period) end
      if ok == 0 and rc <= limit then
        -- (a cost above the limit reaches here only for a shadow rule: no
        -- wait helps, retry stays 0)
        retry = window_retry(cur, prev, limit, rc, left, period)
      end
    end

    if ok == 0 and floor(f / 4) % 2 == 0 then all = 0 end
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
      local p = redis.call('PTTL', keys[k0 + c])
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
    local c = floor(R[i][2] / 16) + 1
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
      -- a calendar record holds its window's grant until the window ends
      if life[i] and life[i] > need[c] then need[c] = life[i] end
      local o = other[i]
      if o and rec == raw[i] then
        -- kept as it was, under the other algorithm: as long as it needs
        local fn = foreign_need(now, o[1], o[2], o[3])
        if fn and fn > need[c] then need[c] = fn end
      end
    end
  end
  res[#res + 1] = now

  for c = 1, m do
    if dirty[c] then
      local v = concat(parts[c])
      if #keep[c] > 0 then v = v .. concat(keep[c]) end
      redis.call('SET', keys[k0 + c], v, 'PXAT', expiry(now, need[c]))
    end
  end

  return pack('<B' .. rep('BI5I7I7', n) .. 'I7', unpack_t(res))
end

-- Compiled rule sets, by their packed rules (which hold no names, so one
-- plan serves every identity and every descriptor value): what the fast
-- path needs of each rule. A library keeps them from call to call (a
-- script by EVALSHA makes them anew each time); a few hundred rule sets
-- are all a fleet's plans, and the table starts afresh past that.
local plans, nplans = {}, 0

local function compile(blob, m)
  local n = #blob / RULESIZE
  local P = {n = n, m = m, rules = {}}
  for i = 1, n do
    local f, limit, period, cap, pn, pd, rc = unpack_s(RULE, blob, RULESIZE * (i - 1) + 1)
    local kind, c = f % 4, floor(f / 16) + 1
    -- (a give-back into a named window, a calendar rule and an in-flight
    -- rule are general's)
    if c > m or kind == 3 or (kind == 2 and rc < 0 and pn > 0) or (kind == 0 and pn == 0) then return nil end
    local r = {kind = kind, enforced = floor(f / 4) % 2 == 0, limit = limit, period = period,
      cap = cap, capu = cap * MICRO, pn = pn, pd = pd, rc = rc, c = c}
    -- size: the record after its name and kind; suf: its rule fields
    if kind == 2 then
      r.fmt, r.suf, r.size = SW, pack('<I6', period), 22
    elseif kind == 1 then
      r.fmt, r.suf, r.size = TB1, pack('<I4I6I4', limit - 1, period, cap - 1), 28
    else
      r.fmt, r.suf, r.size = TB0, pack('<I4I6', limit - 1, period), 24
    end
    P.rules[i] = r
  end
  P.reply = '<B' .. rep('BI5I7I7', n) .. 'I7'
  return P
end

-- fast checks a call whose containers hold exactly its rules' records,
-- in its order, each under the rule it is checked with (or are absent:
-- a new identity), and a sequence record last in any of them (or none):
-- no conversion, nothing foreign to keep. With num it numbers the decision
-- in the first container's record, writing that container whatever the
-- verdict; another container's record (a sequence of checks that have it
-- first) rides along unchanged. args[a + i] is
-- rule i's record prefix (name length, name, kind). It returns the reply,
-- or nil and the containers it read for general.
-- The fast path's scratch tables, kept by a library from call to call
-- (each fast call writes every entry it reads), so a check makes no
-- table of its own but the MGET's.
local GOT, LEN, OFF, X, Y, RES, PARTS, NEED, DIRTY, TAIL = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}

local function fast(P, keys, k0, nk, cost, args, a, now, num, over)
  local m, n, rules = P.m, P.n, P.rules
  local got, len, off = GOT, LEN, OFF
  for c = 1, m do len[c] = 0 end
  for i = 1, n do
    local r = rules[i]
    local c = r.c
    off[i] = len[c] + 1
    len[c] = len[c] + #args[a + i] + r.size
  end
  if m == 1 then
    got[1] = redis.call('GET', keys[k0 + 1])
  else
    got = redis.call('MGET', unpack_t(keys, k0 + 1, k0 + m))
  end
  local epoch, cnt = now, 1
  local tail = TAIL
  for c = 1, m do
    local s = got[c]
    tail[c] = false
    if s then
      local l = len[c]
      if #s == l + SEQSIZE and sub(s, l + 1, l + 2) == SEQHEAD then
        if c == 1 and num then
          local e0, wl, n0 = unpack_s('<I7I6I5', s, l + 3)
          if e0 + wl > now then epoch, cnt = e0, n0 + 1 end
        else
          tail[c] = sub(s, l + 1)
        end
      elseif #s ~= l then
        return nil, got
      end
    elseif nk > m then
      -- the previous layout's keys came along: general reads them
      return nil, got
    end
  end

  -- X[6i-5 .. 6i]: rule i's verdict, retry, and its state before and
  -- after this request (token bucket: tokens, tokens after, timestamp;
  -- sliding window: count, count after, window; its previous count and
  -- us left in the window in Y)
  local X, Y = X, Y
  local all = 1
  for i = 1, n do
    local r = rules[i]
    local s = got[r.c]
    local x1, x2, x3, x4, x5
    if s then
      local pre, p = args[a + i], off[i]
      if sub(s, p, p + #pre - 1) ~= pre then return nil, got end
      x1, x2, x3, x4, x5 = unpack_s(r.fmt, s, p + #pre)
      if r.kind == 2 then
        if x4 ~= r.period then return nil, got end
      elseif x3 ~= r.limit - 1 or x4 ~= r.period or (r.kind == 1 and x5 ~= r.cap - 1) then
        return nil, got
      end
    end
    local rc = cost
    if r.rc ~= 0 then rc = r.rc end
    local ok, retry = 0, 0
    local b = 6 * i - 6
    if r.kind ~= 2 then
      local capu, pn, pd = r.capu, r.pn, r.pd
      local tokens, ts = capu, now
      if s then
        local el = now - x2
        if el < 0 then el = 0 end
        local refill = muldiv_floor(el, pd, pn)
        if refill > capu - x1 then refill = capu - x1 end
        tokens = x1 + refill
        if x2 > ts then ts = x2 end
      end
      local need = rc * MICRO
      local rest = tokens - need
      if rest > capu then rest = capu end
      -- (a settlement's debt stops at one capacity, or where it already was)
      if over and rest < -capu then rest = tokens < -capu and tokens or -capu end
      if rc < 0 or tokens >= need or over then
        ok = 1
      elseif rc <= r.cap then
        retry = wait(need - tokens, pn, pd)
      end
      X[b + 3], X[b + 4], X[b + 5] = tokens, rest, ts
    else
      local period, limit = r.period, r.limit
      local w = floor(now / period)
      local into = now - w * period
      local cur, prev = 0, 0
      if s then
        if x1 == w then
          cur, prev = x2, x3
        elseif x1 == w - 1 then
          prev = x2
        elseif x1 > w then
          -- Redis' clock stepped back across a window: keep the newer counts.
          w, into, cur, prev = x1, 0, x2, x3
        end
      end
      local left = period - into
      local k = weight(left, period)
      local after = cur + rc
      if rc < 0 then
        ok = 1
        if after < 0 then after = 0 end
      elseif after <= limit and prev * k <= (limit - after) * D then
        ok = 1
      elseif over then
        ok = 1
        if after > 2 * limit then after = cur > 2 * limit and cur or 2 * limit end
      elseif rc <= limit then
        retry = window_retry(cur, prev, limit, rc, left, period)
      end
      X[b + 3], X[b + 4], X[b + 5] = cur, after, w
      Y[2 * i - 1], Y[2 * i] = prev, left
    end
    X[b + 1], X[b + 2] = ok, retry
    if ok == 0 and r.enforced then all = 0 end
  end

  local res, parts, need, dirty = RES, PARTS, NEED, DIRTY
  res[1] = all
  for c = 1, m do parts[c], need[c], dirty[c] = false, 0, false end
  for i = 1, n do
    local r = rules[i]
    local b = 6 * i - 6
    local ok = X[b + 1]
    local used = all == 1 and ok == 1
    local c = r.c
    local rem, reset, rec
    if r.kind ~= 2 then
      local st = X[b + 3]
      if used then st = X[b + 4] end
      rem = floor(st / MICRO)
      if rem < 0 then rem = 0 end
      reset = wait(r.capu - st, r.pn, r.pd)
      if used then rec = args[a + i] .. pack('<i7I7', st, X[b + 5]) .. r.suf end
    else
      local cnt, prev, left = X[b + 3], Y[2 * i - 1], Y[2 * i]
      if used then cnt = X[b + 4] end
      local pw = ceil_div(prev * weight(left, r.period), D)
      rem = r.limit - cnt - pw
      if rem < 0 then rem = 0 end
      reset = 0
      if cnt > 0 then reset = left + r.period elseif prev > 0 then reset = left end
      if used then rec = args[a + i] .. pack('<I6I5I5', X[b + 5], cnt, prev) .. r.suf end
    end
    if used then
      dirty[c] = true
    elseif got[c] then
      -- not consumed (a shadow rule's denial): kept as it was
      local p = off[i]
      rec = sub(got[c], p, p + #args[a + i] + r.size - 1)
    end
    if rec then
      local pc = parts[c]
      if pc then parts[c] = pc .. rec else parts[c] = rec end
      if reset > need[c] then need[c] = reset end
    end
    local q = 4 * i - 2
    res[q], res[q + 1], res[q + 2], res[q + 3] = ok, rem, X[b + 2], reset
  end
  res[4 * n + 2] = now
  for c = 1, m do
    if tail[c] and dirty[c] then parts[c] = parts[c] .. tail[c] end
  end
  if num then
    -- the record lasts as long as the container (expiry's second too)
    local sr = pack(SEQREC, 0, 3, epoch, now + need[1] + MICRO - epoch, cnt, 0)
    local pc = parts[1]
    if pc then parts[1] = pc .. sr else parts[1] = sr end
    dirty[1] = true
  end
  for c = 1, m do
    if dirty[c] then
      redis.call('SET', keys[k0 + c], parts[c], 'PXAT', expiry(now, need[c]))
    end
  end
  local out = pack(P.reply, unpack_t(res, 1, 4 * n + 2))
  if num then out = out .. pack('<I7I7', epoch, cnt) end
  return out
end

-- decide runs the rules of one check: fast when it can, else general;
-- and whether fast numbered the decision (num, see check).
local function decide(keys, k0, nk, cost, m, blob, args, a, now, num, over)
  if cost > 0 then
    local P = plans[blob]
    if not P then
      P = compile(blob, m)
      if nplans >= 512 then plans, nplans = {}, 0 end
      if P then plans[blob], nplans = P, nplans + 1 end
    end
    if P and P.m == m then
      local res, got = fast(P, keys, k0, nk, cost, args, a, now, num, over)
      if res then return res, true end
      return general(keys, k0, nk, cost, m, blob, args, a, now, got, over), false
    end
  end
  return general(keys, k0, nk, cost, m, blob, args, a, now, nil, over), false
end

-- renumber counts one more decision in the sequence record of container
-- key after general wrote it (or left it), and returns the epoch and
-- number, packed: the record moves to the end, where fast finds it, and
-- lasts as long as the container.
local function renumber(key, now)
  local s = redis.call('GET', key)
  local rest, epoch, n = {}, now, 1
  if s then
    local p0, len = 1, #s
    while p0 <= len do
      local name, kind, p = unpack_s('Bc0B', s, p0)
      local e = p + recsize(kind, s, p)
      if name == '' and kind == 3 then
        local e0, wl, n0 = unpack_s('<I7I6I5', s, p)
        if e0 + wl > now then epoch, n = e0, n0 + 1 end
      else
        rest[#rest + 1] = sub(s, p0, e - 1)
      end
      p0 = e
    end
  end
  local pt = -1
  if s then pt = redis.call('PTTL', key) end
  if pt < 0 then pt = 1000 end -- a new container (a denial wrote none): a second
  rest[#rest + 1] = pack(SEQREC, 0, 3, epoch, now + pt * 1000 - epoch, n, 0)
  if s then
    redis.call('SET', key, concat(rest), 'KEEPTTL')
  else
    redis.call('SET', key, concat(rest), 'PX', pt)
  end
  return pack('<I7I7', epoch, n)
end

-- check runs one check of the call and numbers its decision when asked:
-- fast does in its own write, general is followed by renumber.
local function check(keys, k0, nk, cost, m, seq, blob, args, a, now)
  local num = seq % 2 == 1 and cost > 0
  local over = seq >= 2 and cost > 0
  local res, numbered = decide(keys, k0, nk, cost, m, blob, args, a, now, num, over)
  if num and not numbered and type(res) == 'string' then
    res = res .. renumber(keys[k0 + 1], now)
  end
  return res
end

-- allow runs the call's checks, each on its own: one that fails answers
-- its error and leaves the others be. Check j is decided at the call's
-- TIME plus j-1 us: the checks run one after the other, each for longer
-- than a microsecond, so none is dated later than it ran, and each has a
-- microsecond of its own, as checks by calls of their own would.
local function allow(keys, args)
  if not floor then init() end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * MICRO + tonumber(t[2])
  local q = tonumber(args[1])
  local out = {}
  local k0, a = 0, 1
  for j = 1, q do
    local nk, blob = tonumber(args[a + 1]), args[a + 5] or ''
    local ok, res = pcall(check, keys, k0, nk, tonumber(args[a + 2]), tonumber(args[a + 3]), tonumber(args[a + 4]),
      blob, args, a + 5, now + j - 1)
    if not ok and type(res) ~= 'table' then res = redis.error_reply(tostring(res)) end
    out[j] = res
    k0, a = k0 + nk, a + 5 + #blob / RULESIZE
  end
  return out
end

if redis.register_function then
  redis.register_function('@FUNCTION@', allow)
else
  return allow(KEYS, ARGV)
end
