"""The PostgreSQL protocol against HTTP on one server: an alert query's rate from one client
(psycopg 3, text and binary, prepared; http.client on one kept-alive connection), computed
(`SET sluice.cache = off` / `cache=off`) and with the result cache as shipped; then a
1M-row result read as a stream by each (psycopg's `Cursor.stream`, HTTP CSV in chunks), with
the server's peak memory (VmHWM) before and after, to show that it is not held whole.

  python3 bench/pg_bench.py --sluice ~/.cache/sluice-target/release/sluice \
      [--rows 1000000] [--seconds 5] [--rounds 3]
"""

import argparse
import http.client
import shutil
import statistics
import tempfile
import time

import psycopg

from sluice_http import Sluice

# Readings above a threshold in the last minute: one row, as alerts are.
ALERT = ("SELECT count(*) AS n, max(temp) AS t FROM bench.readings "
         "WHERE time >= TIMESTAMP '{since}' AND temp > 31")


def status_kib(pid, field="VmHWM"):
    """A memory figure of /proc/PID/status, in KiB (VmHWM: the peak; VmRSS: now)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def rate(f, seconds):
    """Calls of `f` per second over `seconds` (after 50 to warm up)."""
    for _ in range(50):
        f()
    n, t = 0, time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        f()
        n += 1
    return n / (time.perf_counter() - t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sluice", required=True)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    root = tempfile.mkdtemp(prefix="pg-bench-")
    s = Sluice(a.sluice, root, pg=True)
    try:
        s.sql("CREATE TABLE bench.readings (time TIMESTAMP NOT NULL, device TEXT, temp DOUBLE, "
              "hum BIGINT) PARTITION BY yyyymmdd(time)")
        base = 1767225600
        chunk = 50_000
        for start in range(0, a.rows, chunk):
            lines = []
            for i in range(start, min(start + chunk, a.rows)):
                t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(base + i // 1000))
                lines.append(f"{t}Z,d{i % 1000:04},{20 + (i % 113) * 0.1:.1f},{i % 100}")
            s.request("/v1/write/bench/readings", "\n".join(lines) + "\n", "text/csv")
        last = base + (a.rows - 1) // 1000
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(last - 60))
        q = ALERT.format(since=since)
        http_rows = s.sql(q).strip().split("\n")[1:]
        dsn = f"host=127.0.0.1 port={s.pg} user=bench dbname=bench"
        conn = psycopg.connect(dsn, autocommit=True)
        pg_rows = conn.execute(q).fetchall()
        assert len(pg_rows) == len(http_rows) > 0, (len(pg_rows), len(http_rows))
        hc = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)

        def over_http(cache):
            path = "/v1/sql?format=csv" + ("" if cache else "&cache=off")

            def f():
                hc.request("POST", path, body=q.encode())
                r = hc.getresponse()
                r.read()
                assert r.status == 200
            return f

        def over_pg(cache, binary):
            conn.execute(f"SET sluice.cache = {'on' if cache else 'off'}")
            cur = conn.cursor(binary=binary)

            def f():
                cur.execute(q, prepare=True)
                cur.fetchall()
            return f

        modes = {
            "http computed": lambda: over_http(False),
            "pg text computed": lambda: over_pg(False, False),
            "pg binary computed": lambda: over_pg(False, True),
            "http cached": lambda: over_http(True),
            "pg text cached": lambda: over_pg(True, False),
            "pg binary cached": lambda: over_pg(True, True),
        }
        got = {m: [] for m in modes}
        for rnd in range(a.rounds):
            for m, make in modes.items():
                r = rate(make(), a.seconds)
                got[m].append(r)
                print(f"round {rnd + 1} {m}: {r:,.0f} q/s", flush=True)
        med = {m: statistics.median(v) for m, v in got.items()}
        print(f"\nalert query ({len(http_rows)} row), one client, medians of {a.rounds} rounds:")
        for m, r in med.items():
            print(f"  {m:20} {r:10,.0f} q/s")
        for kind in ("computed", "cached"):
            for fmt in ("text", "binary"):
                print(f"  pg {fmt} / http, {kind}: "
                      f"{med[f'pg {fmt} {kind}'] / med[f'http {kind}']:.2f}x")

        # A whole table, streamed: the server's memory while the client pauses after its
        # first 1,000 rows (a server that held the result would hold it all by then), and
        # its peak after each protocol read it all.
        big = "SELECT time, device, temp, hum FROM bench.readings"
        pid = s.proc.pid
        rss_before = status_kib(pid, "VmRSS")
        before = status_kib(pid)
        t = time.perf_counter()
        n = 0
        paused = 0.0
        for _ in conn.cursor().stream(big):
            n += 1
            if n == 1000:
                p0 = time.perf_counter()
                time.sleep(1)
                rss_paused = status_kib(pid, "VmRSS")
                paused = time.perf_counter() - p0
        pg_secs = time.perf_counter() - t - paused
        after_pg = status_kib(pid)
        assert n == a.rows, n
        t = time.perf_counter()
        hc.request("POST", "/v1/sql?format=csv&cache=off", body=big.encode())
        r = hc.getresponse()
        size = 0
        while chunk := r.read(1 << 16):
            size += len(chunk)
        http_secs = time.perf_counter() - t
        after_http = status_kib(pid)
        print(f"\n{a.rows:,} rows ({size / 2**20:.0f} MiB as CSV) streamed: server RSS "
              f"{rss_before / 1024:.0f} MiB before, {rss_paused / 1024:.0f} MiB while the pg "
              f"client pauses at row 1,000; peak {before / 1024:.0f} -> {after_pg / 1024:.0f} "
              f"MiB after pg ({a.rows / pg_secs:,.0f} rows/s into psycopg), -> "
              f"{after_http / 1024:.0f} MiB after HTTP CSV ({a.rows / http_secs:,.0f} rows/s)")
        conn.close()
    finally:
        s.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
