#!/usr/bin/env python3
"""Latest row per device: Sluice (its last-value cache, computed answers: cache=off) against
DuckDB (in process, same rows), in the same run, answers compared.

    python3 bench/latest_bench.py --sluice target/release/sluice [--devices 10000]
        [--readings 100] [--runs 7]

A fleet of `devices` devices, `readings` readings each, 10 s apart, written over HTTP as CSV
in shuffled order (late rows included); DuckDB loads the same CSV. Each query form runs once
to warm up (Sluice fills its cache then), then `runs` times; the best and the median are
shown. Sluice is timed over one kept-alive HTTP connection (request to last byte), DuckDB
in process, so Sluice's figures carry an HTTP round trip (`SELECT 1` is shown for scale).
"after a write": each run of the Sluice query follows a one-row write (the cache's batch is
then made again for that row). Needs the `duckdb` Python package.
"""

import argparse
import csv
import datetime
import io
import os
import random
import statistics
import sys
import tempfile
import time

import duckdb

from sluice_http import Sluice, timed

FORMS = [
    ("DISTINCT ON",
     "SELECT DISTINCT ON (device) device, ts, temp, load FROM {t} ORDER BY device, ts DESC"),
    # DuckDB has no ordered last_value aggregate: arg_max is its form.
    ("last_value / max",
     "SELECT device, last_value(temp ORDER BY ts) AS temp, max(ts) AS ts FROM {t} GROUP BY device ORDER BY device",
     "SELECT device, arg_max(temp, ts) AS temp, max(ts) AS ts FROM {t} GROUP BY device ORDER BY device"),
    ("row_number() = 1",
     "SELECT device, ts, temp, load FROM (SELECT device, ts, temp, load, row_number() OVER "
     "(PARTITION BY device ORDER BY ts DESC) AS rn FROM {t}) WHERE rn = 1 ORDER BY device"),
    ("count of DISTINCT ON",
     "SELECT count(*) AS n, max(temp) AS m FROM (SELECT DISTINCT ON (device) device, temp FROM {t} ORDER BY device, ts DESC)"),
    ("3 devices",
     "SELECT DISTINCT ON (device) device, ts, temp FROM {t} WHERE device IN ('d1', 'd77', 'd999') ORDER BY device, ts DESC"),
]



def rows_of(text):
    """CSV text (header first) as sorted tuples of normalized strings."""
    out = []
    for row in list(csv.reader(io.StringIO(text)))[1:]:
        out.append(tuple(norm(v) for v in row))
    return sorted(out)


def norm(v):
    if v in ("", "None", "NULL"):
        return ""
    try:
        return f"{float(v):.6g}"
    except ValueError:
        pass
    try:
        return datetime.datetime.fromisoformat(v.replace("T", " ")).strftime("%Y-%m-%d %H:%M:%S.%f")
    except ValueError:
        return v


def duck_rows(con, q):
    out = []
    for row in con.execute(q).fetchall():
        out.append(tuple(norm("" if v is None else (v.isoformat(sep=" ") if isinstance(v, datetime.datetime) else str(v))) for v in row))
    return sorted(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", required=True)
    ap.add_argument("--devices", type=int, default=10000)
    ap.add_argument("--readings", type=int, default=100)
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()

    rnd = random.Random(42)
    start = datetime.datetime(2026, 11, 1)
    lines = []
    for r in range(a.readings):
        for d in range(a.devices):
            ts = start + datetime.timedelta(seconds=10 * r, milliseconds=rnd.randint(0, 9999))
            lines.append(f"{ts:%Y-%m-%d %H:%M:%S.%f},d{d},{rnd.uniform(-10, 40):.3f},{rnd.randint(0, 100)}")
    rnd.shuffle(lines)
    work = tempfile.mkdtemp(prefix="latest-bench-")
    path = os.path.join(work, "fleet.csv")
    with open(path, "w") as f:
        f.write("ts,device,temp,load\n" + "\n".join(lines) + "\n")

    s = Sluice(a.sluice, os.path.join(work, "data"))
    try:
        s.sql("CREATE DATABASE IF NOT EXISTS fleet")
        s.sql("CREATE TABLE fleet.r (ts TIMESTAMP, device VARCHAR, temp DOUBLE, load BIGINT) PARTITION BY ymdh(ts)")
        t = time.perf_counter()
        for i in range(0, len(lines), 100_000):
            s.request("/v1/write/fleet/r", "\n".join(lines[i:i + 100_000]) + "\n", "text/csv")
        print(f"{len(lines):,} rows, {a.devices:,} devices; Sluice loaded in {time.perf_counter() - t:.1f} s")
        con = duckdb.connect()
        con.execute(f"CREATE TABLE r AS SELECT * FROM read_csv('{path}', header=true, "
                    "columns={'ts': 'TIMESTAMP', 'device': 'VARCHAR', 'temp': 'DOUBLE', 'load': 'BIGINT'})")
        print(f"DuckDB {duckdb.__version__}, {con.execute('SELECT current_setting(' + chr(39) + 'threads' + chr(39) + ')').fetchone()[0]} threads")
        base = timed(lambda: s.sql("SELECT 1"), a.runs)
        print(f"Sluice SELECT 1 over HTTP: best {base[0]:.3f} ms, median {base[1]:.3f} ms\n")
        print(f"| query | Sluice best / median ms | DuckDB best / median ms | ratio (best) | answers |")
        print("|---|---|---|---|---|")
        seq = 0
        for name, q, *peer_q in FORMS:
            sq, dq = q.format(t="fleet.r"), (peer_q or [q])[0].format(t="r")
            got, want = rows_of(s.sql(sq)), duck_rows(con, dq)
            same = got == want
            if not same:
                diff = [(g, w) for g, w in zip(got, want) if g != w][:3]
                print(f"{name}: {len(got)} rows against {len(want)}; first differences {diff}", file=sys.stderr)
            # Filled in the background by the first run; wait for it.
            deadline = time.time() + 60
            while "from_cache=1" not in s.sql("EXPLAIN ANALYZE " + sq) and time.time() < deadline:
                time.sleep(0.05)
            ours = timed(lambda: s.sql(sq), a.runs)
            peer = timed(lambda: con.execute(dq).fetchall(), a.runs)
            print(f"| {name} | {ours[0]:.3f} / {ours[1]:.3f} | {peer[0]:.3f} / {peer[1]:.3f} | "
                  f"{ours[0] / peer[0]:.2f}x | {'equal' if same else 'DIFFERENT'} |")

            def after_write():
                nonlocal seq
                seq += 1
                ts = start + datetime.timedelta(days=1, seconds=seq)
                row = f"{ts:%Y-%m-%d %H:%M:%S},d{seq % a.devices},1.0,{seq}"
                s.request("/v1/write/fleet/r", row + "\n", "text/csv")
                # The same row in DuckDB, so that answers stay comparable.
                con.execute("INSERT INTO r VALUES (?, ?, 1.0, ?)", [ts, f"d{seq % a.devices}", seq])
                t = time.perf_counter()
                s.sql(sq)
                return (time.perf_counter() - t) * 1000
            after = [after_write() for _ in range(a.runs)]
            print(f"| {name}, after a write | {min(after):.3f} / {statistics.median(after):.3f} | | | |")
    finally:
        s.stop()


if __name__ == "__main__":
    sys.exit(main())
