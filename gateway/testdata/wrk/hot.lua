-- wrk: every request with the same API key.
wrk.headers["X-API-Key"] = "hot-key"
wrk.path = "/items"
