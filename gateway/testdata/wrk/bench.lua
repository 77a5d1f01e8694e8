-- wrk -s bench.lua URL -- MODE [ARG]: the requests of run.sh's cases.
--   proxy [PREFIX]  GET PREFIX/items from one of 100k client IPs, named by a
--                   trusted proxy's X-Forwarded-For (PREFIX /off: the
--                   exempt route, the same requests with no limit check)
--   body            POST /items with a small JSON body from one of the IPs
--                   (the limited route; the gateway reads the body for keys)
--   check [KEY]     POST /v1/check for one of the 100k IPs, or for the raw
--                   API key KEY (the hot keys of gateway.yaml)
--   peer [IP]       POST /json to envoyproxy/ratelimit: the same 3 limits
--                   (peer.yaml) for one of the 100k IPs, or for IP alone
--                   (over its limit: the peer's local cache answers)
-- Each wrk thread seeds its own generator: threads seeded alike would send
-- the same keys in the same order.
local threads = 0
setup = function(thread)
  thread:set("id", threads)
  threads = threads + 1
end

local mode, arg
init = function(args)
  mode, arg = args[1] or "proxy", args[2] or ""
  math.randomseed(os.time() * 1000 + (id or 0))
end

local function ip()
  local i = math.random(0, 99999)
  return string.format("10.%d.%d.%d", math.floor(i / 65536), math.floor(i / 256) % 256, i % 256)
end

local json = { ["Content-Type"] = "application/json" }

request = function()
  if mode == "check" then
    if arg ~= "" then
      return wrk.format("POST", "/v1/check", json, '{"key":"' .. arg .. '"}')
    end
    return wrk.format("POST", "/v1/check", json, '{"ip":"' .. ip() .. '"}')
  elseif mode == "peer" then
    local v = arg ~= "" and arg or ip()
    return wrk.format("POST", "/json", json, string.format(
      '{"domain":"bench","descriptors":[{"entries":[{"key":"ip_minute","value":"%s"}]},' ..
      '{"entries":[{"key":"ip_hour","value":"%s"}]},{"entries":[{"key":"ip_day","value":"%s"}]}]}', v, v, v))
  elseif mode == "body" then
    return wrk.format("POST", "/items", { ["Content-Type"] = "application/json", ["X-Forwarded-For"] = ip() },
      '{"name":"widget","qty":3,"tags":["a","b"],"note":"a small order"}')
  end
  return wrk.format("GET", arg .. "/items", { ["X-Forwarded-For"] = ip() })
end
