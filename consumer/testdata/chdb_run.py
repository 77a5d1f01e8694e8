"""Runs SQL statements on chdb (current ClickHouse, in process) for
consumer's TestCurrentClickHouse: reads a JSON list of {"name", "sql"} on
stdin, runs them in order in one session, and prints a JSON list of
{"name", "error", "result"} (result: the first CSV line)."""
import json
import sys
import tempfile

from chdb import session

steps = json.load(sys.stdin)
out = []
# Mutations the steps started may still write to d when it is removed.
with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as d:
    s = session.Session(d)
    s.query("CREATE DATABASE IF NOT EXISTS edgelimit")
    s.query("USE edgelimit")
    for st in steps:
        try:
            r = s.query(st["sql"], "CSV")
            text = r.bytes().decode() if hasattr(r, "bytes") else str(r)
            out.append({"name": st["name"], "error": "", "result": text.split("\n", 1)[0]})
        except Exception as e:  # noqa: BLE001 - every failure is reported
            out.append({"name": st["name"], "error": str(e)[:2000], "result": ""})
    s.close()
json.dump(out, sys.stdout)
