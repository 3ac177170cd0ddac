#!/usr/bin/env python3
"""A truck fleet (after TSBS's IoT use case) on Sluice and on DuckDB, in the same run:
dashboard queries of the kinds IoT users write, timed computed (`cache=off`), answers
compared.

    python3 bench/fleet_bench.py --sluice target/release/sluice [--trucks 1000] [--hours 24]
        [--runs 5] [--only NAME,...] [--hot-cache BYTES]

Data: `trucks` trucks, each a reading and a diagnostic every 10 s for `hours` hours (seed
fixed), as InfluxDB line protocol, two measurements: `readings` (position, velocity, fuel
consumption, ...) and `diagnostics` (fuel state, load, status), tags name, fleet, driver,
model. Sluice takes them over MQTT (QoS 1, 1,000 lines a message, 16 in flight) into a
database whose tables line protocol creates (`mqtt.auto_create_databases`); DuckDB loads
the same rows from CSV into native tables. Each query runs once to warm up, then `runs`
times; best and median are shown. Sluice is timed over one kept-alive HTTP connection with
the rows coming back as CSV, DuckDB in process fetching its rows, so Sluice's figures carry
an HTTP round trip and the encoding. The first run (the query computed once already by the
answer check) is shown apart: Sluice keeps per-chunk partial answers of a filtered
aggregate, so a repeated dashboard query costs less than its first run. Needs the `duckdb`
Python package.
"""

import argparse
import csv
import datetime
import io
import math
import os
import random
import socket
import struct
import sys
import tempfile
import time

import duckdb

from sluice_http import Sluice, timed

FLEETS = ["East", "West", "North", "South"]
MODELS = ["F-150", "G-2000", "H-2", "T-800"]
START = datetime.datetime(2026, 11, 1)

READING_FIELDS = ["latitude", "longitude", "elevation", "velocity", "heading", "grade",
                  "fuel_consumption", "nominal_fuel_consumption", "load_capacity", "fuel_capacity"]
DIAG_FIELDS = ["fuel_state", "current_load", "load_capacity"]

# (name, SQL with {r} = readings, {d} = diagnostics, {end} = the data's last instant).
QUERIES = [
    ("last-loc: newest position of each truck of a fleet",
     "SELECT name, driver, latitude, longitude FROM (SELECT DISTINCT ON (name) name, driver, fleet, "
     "latitude, longitude FROM {r} ORDER BY name, time DESC) AS l WHERE fleet = 'South' ORDER BY name"),
    ("low-fuel: trucks whose newest diagnostic says under 10% fuel",
     "SELECT name, driver, fuel_state FROM (SELECT DISTINCT ON (name) name, driver, fuel_state "
     "FROM {d} ORDER BY name, time DESC) AS l WHERE fuel_state <= 0.1 ORDER BY name"),
    ("high-load: newest load at 90% of capacity or more",
     "SELECT name, driver, current_load / load_capacity AS share FROM (SELECT DISTINCT ON (name) "
     "name, driver, current_load, load_capacity FROM {d} ORDER BY name, time DESC) AS l "
     "WHERE current_load / load_capacity >= 0.9 ORDER BY name"),
    ("stationary: fleet's trucks averaging under 1 km/h over the last 10 minutes",
     "SELECT name, driver FROM {r} WHERE time > TIMESTAMP '{end}' - INTERVAL '10 minutes' "
     "AND fleet = 'West' GROUP BY name, driver HAVING avg(velocity) < 1 ORDER BY name"),
    ("long-driving: driving in more than 22 of the last 24 ten-minute windows",
     "SELECT name, driver FROM (SELECT name, driver, time_bucket(INTERVAL '10 minutes', time) AS w, "
     "avg(velocity) AS v FROM {r} WHERE time > TIMESTAMP '{end}' - INTERVAL '4 hours' "
     "GROUP BY 1, 2, 3) AS t WHERE v > 1 GROUP BY name, driver HAVING count(*) > 22 ORDER BY name"),
    ("fuel: average vs nominal consumption per fleet while moving",
     "SELECT fleet, avg(fuel_consumption) AS fc, avg(nominal_fuel_consumption) AS nominal "
     "FROM {r} WHERE velocity > 1 GROUP BY fleet ORDER BY fleet"),
    ("driving-duration: hours driven per driver per day",
     "SELECT fleet, name, driver, day, count(*) / 6.0 AS hours FROM (SELECT fleet, name, driver, "
     "date_trunc('day', time) AS day, time_bucket(INTERVAL '10 minutes', time) AS w, "
     "avg(velocity) AS v FROM {r} GROUP BY 1, 2, 3, 4, 5) AS t WHERE v > 1 "
     "GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"),
    ("avg-load: load share per fleet and model",
     "SELECT fleet, model, avg(current_load / load_capacity) AS share FROM {d} "
     "GROUP BY fleet, model ORDER BY fleet, model"),
    ("daily-activity: active ten-minute windows per fleet, model and day",
     "SELECT fleet, model, day, count(*) AS windows FROM (SELECT fleet, model, name, "
     "date_trunc('day', time) AS day, time_bucket(INTERVAL '10 minutes', time) AS w, "
     "avg(status) AS s FROM {d} GROUP BY 1, 2, 3, 4, 5) AS t WHERE s < 1 "
     "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"),
    ("breakdowns: status changes to broken per model (lag)",
     "SELECT model, count(*) AS breakdowns FROM (SELECT model, status, lag(status) OVER "
     "(PARTITION BY name ORDER BY time) AS before FROM {d}) AS t WHERE status = 4 "
     "AND before <> 4 GROUP BY model ORDER BY model"),
    ("join: speed and load per truck and hour",
     "SELECT r.name, r.h, r.v, d.l FROM (SELECT name, time_bucket(INTERVAL '1 hour', time) AS h, "
     "avg(velocity) AS v FROM {r} GROUP BY 1, 2) AS r JOIN (SELECT name, time_bucket(INTERVAL "
     "'1 hour', time) AS h, avg(current_load) AS l FROM {d} GROUP BY 1, 2) AS d "
     "ON r.name = d.name AND r.h = d.h WHERE r.name IN ('truck_1', 'truck_7') ORDER BY 1, 2"),
    ("dashboard: per-minute fleet speed over the last hour",
     "SELECT time_bucket(INTERVAL '1 minute', time) AS m, fleet, avg(velocity) AS v, max(velocity) AS top "
     "FROM {r} WHERE time > TIMESTAMP '{end}' - INTERVAL '1 hour' GROUP BY 1, 2 ORDER BY 1, 2"),
]



def generate(trucks, hours, seed):
    """Line protocol (two lists) and CSV rows (two lists) of the fleet."""
    rnd = random.Random(seed)
    lp_r, lp_d, csv_r, csv_d = [], [], [], []
    ticks = hours * 360
    for t in range(trucks):
        name, fleet = f"truck_{t}", FLEETS[t % 4]
        driver, model = f"driver_{rnd.randint(0, trucks // 3)}", MODELS[rnd.randint(0, 3)]
        lat, lon, elev = rnd.uniform(-90, 90), rnd.uniform(-180, 180), rnd.uniform(0, 3000)
        v, heading, fuel, load = 0.0, rnd.uniform(0, 360), rnd.uniform(0.2, 1.0), rnd.uniform(0, 1000)
        cap_load, cap_fuel, nominal = float(rnd.choice([1500, 2000, 5000])), float(rnd.choice([150, 200])), rnd.uniform(10, 20)
        status, moving = 0, rnd.random() < 0.6
        tags = f"name={name},fleet={fleet},driver={driver},model={model}"
        for k in range(ticks):
            ts = START + datetime.timedelta(seconds=10 * k)
            ns = int((ts - datetime.datetime(1970, 1, 1)).total_seconds()) * 1_000_000_000
            if rnd.random() < 0.01:
                moving = not moving
            v = max(0.0, min(100.0, v + rnd.uniform(-5, 5))) if moving else max(0.0, v - 10)
            heading = (heading + rnd.uniform(-5, 5)) % 360
            lat = max(-90.0, min(90.0, lat + rnd.uniform(-0.001, 0.001)))
            lon = max(-180.0, min(180.0, lon + rnd.uniform(-0.001, 0.001)))
            elev = max(0.0, elev + rnd.uniform(-1, 1))
            grade = rnd.uniform(-10, 10)
            consumption = nominal * (0.5 + v / 100) + rnd.uniform(-1, 1)
            fuel = 1.0 if fuel < 0.05 else fuel - v / 100000
            load = max(0.0, min(cap_load, load + rnd.uniform(-20, 20)))
            if rnd.random() < 0.002:
                status = 4 if status != 4 else 0
            elif status != 4 and rnd.random() < 0.05:
                status = rnd.randint(0, 3)
            reading = [lat, lon, elev, v, heading, grade, consumption, nominal, cap_load, cap_fuel]
            diag = [fuel, load, cap_load]
            rf = ",".join(f"{f}={x:.6g}" for f, x in zip(READING_FIELDS, reading))
            df = ",".join(f"{f}={x:.6g}" for f, x in zip(DIAG_FIELDS, diag))
            lp_r.append(f"readings,{tags} {rf} {ns}")
            lp_d.append(f"diagnostics,{tags} {df},status={status}i {ns}")
            stamp = ts.strftime("%Y-%m-%d %H:%M:%S")
            csv_r.append(",".join([stamp, name, fleet, driver, model] + [f"{x:.6g}" for x in reading]))
            csv_d.append(",".join([stamp, name, fleet, driver, model] + [f"{x:.6g}" for x in diag] + [str(status)]))
    return lp_r, lp_d, csv_r, csv_d, START + datetime.timedelta(seconds=10 * (ticks - 1))


def mqtt_publish(port, topic, payloads, window=16):
    """Publishes each payload at QoS 1 over one MQTT 3.1.1 connection, `window` in flight."""
    s = socket.create_connection(("127.0.0.1", port))
    cid = b"fleet-loader"
    var = b"\x00\x04MQTT\x04\x02\x00\x3c"
    body = var + struct.pack(">H", len(cid)) + cid
    s.sendall(bytes([0x10]) + remaining(len(body)) + body)
    reader = s.makefile("rb")
    read_packet(reader)  # CONNACK
    t = topic.encode()
    pending, pid = 0, 0
    for p in payloads:
        pid = pid % 65535 + 1
        body = struct.pack(">H", len(t)) + t + struct.pack(">H", pid) + p
        s.sendall(bytes([0x32]) + remaining(len(body)) + body)
        pending += 1
        while pending >= window:
            kind, data = read_packet(reader)
            if kind == 0x40:
                pending -= 1
    while pending:
        kind, _ = read_packet(reader)
        if kind == 0x40:
            pending -= 1
    s.sendall(b"\xe0\x00")
    s.close()


def remaining(n):
    out = bytearray()
    while True:
        b, n = n % 128, n // 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def read_packet(reader):
    head = reader.read(1)
    if not head:
        raise RuntimeError("the broker closed the connection")
    n, shift = 0, 0
    while True:
        b = reader.read(1)[0]
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return head[0] & 0xF0, reader.read(n)


def norm(v):
    if v is None or v in ("", "None"):
        return ""
    if isinstance(v, datetime.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{float(v):.5g}"
    try:
        return f"{float(v):.5g}"
    except (TypeError, ValueError):
        pass
    try:
        return datetime.datetime.fromisoformat(str(v).replace("T", " ")).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return str(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", required=True)
    ap.add_argument("--trucks", type=int, default=1000)
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", default="")
    ap.add_argument("--hot-cache", type=int, default=0,
                    help="query.hot_cache_bytes (default: Sluice's own, 25%% of the memory)")
    a = ap.parse_args()

    t = time.perf_counter()
    lp_r, lp_d, csv_r, csv_d, end = generate(a.trucks, a.hours, 7)
    print(f"{len(lp_r):,} readings and {len(lp_d):,} diagnostics of {a.trucks:,} trucks generated in {time.perf_counter() - t:.0f} s", flush=True)
    work = tempfile.mkdtemp(prefix="fleet-bench-")
    env = {"SLUICE_MQTT_AUTO_CREATE_DATABASES": "fleet"}
    if a.hot_cache:
        env["SLUICE_QUERY_HOT_CACHE_BYTES"] = str(a.hot_cache)
    s = Sluice(a.sluice, os.path.join(work, "data"), env)
    try:
        s.sql("CREATE DATABASE IF NOT EXISTS fleet")
        t = time.perf_counter()
        for lines in (lp_r, lp_d):
            # Time order, as devices send: all trucks' rows of one instant, then the next.
            order = sorted(range(len(lines)), key=lambda i: (i % (a.hours * 360), i))
            payloads = ["\n".join(lines[i] for i in order[k:k + 1000]).encode()
                        for k in range(0, len(order), 1000)]
            mqtt_publish(s.mqtt, "/fleet/lp", payloads)
        rows = len(lp_r) + len(lp_d)
        took = time.perf_counter() - t
        print(f"Sluice: {rows:,} rows over MQTT in {took:.1f} s ({rows / took:,.0f} rows/s, durable)")
        del lp_r, lp_d
        stored = s.sql("SELECT (SELECT count(*) FROM fleet.readings) + (SELECT count(*) FROM fleet.diagnostics)")
        if int(stored.splitlines()[1]) != rows:
            raise RuntimeError(f"{stored.splitlines()[1]} rows stored of {rows}")
        s.sql("ALTER TABLE fleet.readings SET (last_value_key = 'name')")
        s.sql("ALTER TABLE fleet.diagnostics SET (last_value_key = 'name')")
        con = duckdb.connect()
        t = time.perf_counter()
        for table, rows_, fields, types in (("readings", csv_r, READING_FIELDS, "DOUBLE"),
                                            ("diagnostics", csv_d, DIAG_FIELDS + ["status"], None)):
            path = os.path.join(work, f"{table}.csv")
            with open(path, "w") as f:
                f.write("\n".join(rows_) + "\n")
            cols = {"time": "TIMESTAMP", "name": "VARCHAR", "fleet": "VARCHAR", "driver": "VARCHAR", "model": "VARCHAR"}
            for fld in fields:
                cols[fld] = "BIGINT" if fld == "status" else "DOUBLE"
            spec = "{" + ", ".join(f"'{k}': '{v}'" for k, v in cols.items()) + "}"
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM read_csv('{path}', header=false, columns={spec})")
        threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
        print(f"DuckDB {duckdb.__version__} ({threads} threads): loaded from CSV in {time.perf_counter() - t:.1f} s (in memory, not durable)")
        del csv_r, csv_d
        print(f"Sluice SELECT 1 over HTTP: {timed(lambda: s.sql('SELECT 1'), a.runs)[0]:.3f} ms\n")
        print("| query | Sluice best / median (first) ms | DuckDB best / median (first) ms | ratio (best) | answers |")
        print("|---|---|---|---|---|")
        only = [x for x in a.only.split(",") if x]
        ratios = []
        for name, q in QUERIES:
            key = name.split(":")[0]
            if only and key not in only:
                continue
            stamp = end.strftime("%Y-%m-%d %H:%M:%S")
            sq = q.format(r="fleet.readings", d="fleet.diagnostics", end=stamp)
            dq = q.format(r="readings", d="diagnostics", end=stamp)
            try:
                got = [tuple(norm(v) for v in row) for row in list(csv.reader(io.StringIO(s.sql(sq))))[1:]]
            except RuntimeError as e:
                print(f"| {name} | error: {str(e)[:120]} | | | |")
                continue
            want = [tuple(norm(v) for v in row) for row in con.execute(dq).fetchall()]
            same = got == want
            if not same:
                diff = [(g, w) for g, w in zip(got, want) if g != w][:2]
                print(f"{key}: {len(got)} rows against {len(want)}; {diff}", file=sys.stderr)
            ours = timed(lambda: s.sql(sq), a.runs)
            peer = timed(lambda: con.execute(dq).fetchall(), a.runs)
            ratios.append(ours[0] / peer[0])
            print(f"| {name} ({len(want)} rows) | {ours[0]:.2f} / {ours[1]:.2f} ({ours[2]:.1f}) | "
                  f"{peer[0]:.2f} / {peer[1]:.2f} ({peer[2]:.1f}) | "
                  f"{ours[0] / peer[0]:.2f}x | {'equal' if same else 'DIFFERENT'} |", flush=True)
        if ratios:
            print(f"\ngeometric mean of the ratios: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x")
    finally:
        s.stop()


if __name__ == "__main__":
    sys.exit(main())
