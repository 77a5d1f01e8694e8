-- wrk: every request with the same API key, far over its 100/min.
wrk.headers["X-API-Key"] = "hot-denied"
wrk.path = "/items"
