-- wrk: each request from one of 100k client IPs (a trusted proxy's header).
math.randomseed(os.time())
request = function()
  local i = math.random(0, 99999)
  local ip = string.format("10.%d.%d.%d", math.floor(i / 65536), math.floor(i / 256) % 256, i % 256)
  return wrk.format("GET", "/items", { ["X-Forwarded-For"] = ip })
end
