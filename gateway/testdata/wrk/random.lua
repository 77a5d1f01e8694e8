-- wrk: each request from one of 100k client IPs (a trusted proxy's header).
-- The script's one argument (after --) goes before every path: run.sh
-- passes /off for the baseline, the same requests on the exempt route.
math.randomseed(os.time())
local prefix = ""
init = function(args)
  prefix = args[1] or ""
end
request = function()
  local i = math.random(0, 99999)
  local ip = string.format("10.%d.%d.%d", math.floor(i / 65536), math.floor(i / 256) % 256, i % 256)
  return wrk.format("GET", prefix .. "/items", { ["X-Forwarded-For"] = ip })
end
