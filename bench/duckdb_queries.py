#!/usr/bin/env python3
"""The peer side of bench/src/bin/query_bench/main.rs: loads the runner's nyct_lite CSV files into
a native DuckDB table (or, with "engine": "chdb", a chDB MergeTree table) and times the
queries the runner sends, the same way the runner times Sluice.

Input, one JSON object on stdin:
  {"engine": "duckdb" | "chdb", "csv_glob": "/tmp/.../csv/*.csv", "work_dir": "/tmp/...",
   "duration_secs": 5.0, "queries": [{"name": "Q1", "sql": "..."}, ...],
   "alert": {"name": "alert", "sql": "..."}}
Output, one JSON object on stdout:
  {"engine": "duckdb", "version": "...", "threads": 2, "load_secs": 1.2, "rows": 10906860,
   "queries": [{"name": "Q1", "ms": 1.5, "rows": [[...], ...], "error": null}, ...],
   "alert": {"qps": 1234.5, "queries": 6172, "error": null}}
Each query runs once to warm up, then three times; "ms" is the best of the three. The alert
query runs back to back from this one thread for duration_secs. Progress goes to stderr.
"""

import datetime
import decimal
import json
import math
import os
import sys
import time

# nyct_lite's columns in table (and CSV) order with DuckDB's and ClickHouse's type names for
# the JoinBase types (String, DateTime, Int8, Float32).
COLUMNS = [
    ("vendor_id", "VARCHAR", "String"),
    ("pickup_datetime", "TIMESTAMP", "DateTime('UTC')"),
    ("dropoff_datetime", "TIMESTAMP", "DateTime('UTC')"),
    ("passenger_count", "TINYINT", "Int8"),
    ("trip_distance", "FLOAT", "Float32"),
    ("pickup_longitude", "FLOAT", "Float32"),
    ("pickup_latitude", "FLOAT", "Float32"),
    ("rate_code", "TINYINT", "Int8"),
    ("dropoff_longitude", "FLOAT", "Float32"),
    ("dropoff_latitude", "FLOAT", "Float32"),
    ("payment_type", "TINYINT", "Int8"),
    ("fare_amount", "FLOAT", "Float32"),
    ("extra", "FLOAT", "Float32"),
    ("mta_tax", "FLOAT", "Float32"),
    ("tip_amount", "FLOAT", "Float32"),
    ("tolls_amount", "FLOAT", "Float32"),
    ("improvement_surcharge", "FLOAT", "Float32"),
    ("total_amount", "FLOAT", "Float32"),
]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def quote(s):
    return "'" + s.replace("'", "''") + "'"


def cell(v):
    """A result value as JSON the runner compares: numbers stay numbers, dates become text."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return None if math.isnan(v) else v
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, datetime.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, datetime.date):
        return v.isoformat()
    return v if v is None else str(v)


class DuckDB:
    def __init__(self, work_dir):
        import duckdb

        self.version = duckdb.__version__
        self.con = duckdb.connect()  # in memory; default threads (one per core)
        self.threads = self.con.execute("SELECT current_setting('threads')").fetchone()[0]

    def load(self, csv_glob):
        cols = ", ".join(f"{n} {t}" for n, t, _ in COLUMNS)
        self.con.execute(f"CREATE TABLE nyct_lite ({cols})")
        types = ", ".join(f"{quote(n)}: {quote(t)}" for n, t, _ in COLUMNS)
        self.con.execute(
            f"INSERT INTO nyct_lite SELECT * FROM read_csv({quote(csv_glob)}, header = false, "
            f"columns = {{{types}}}, timestampformat = '%Y-%m-%d %H:%M:%S')"
        )
        return self.con.execute("SELECT count(*) FROM nyct_lite").fetchone()[0]

    def query(self, sql):
        return [[cell(v) for v in row] for row in self.con.execute(sql).fetchall()]


class ChDB:
    def __init__(self, work_dir):
        import chdb
        from chdb import session

        self.version = chdb.__version__
        self.session = session.Session(os.path.join(work_dir, "chdb"))
        self.session.query("CREATE DATABASE IF NOT EXISTS benchmark")
        self.session.query("USE benchmark")
        self.threads = self._rows("SELECT getSetting('max_threads')")[0][0]

    def _rows(self, sql):
        res = self.session.query(sql, "JSONCompact")
        text = res.bytes() if hasattr(res, "bytes") else bytes(res)
        if not text:
            return []
        doc = json.loads(text)
        # 64-bit integers come quoted; the column types say which.
        ints = [m["type"].removeprefix("Nullable(").startswith(("Int", "UInt")) for m in doc["meta"]]
        return [
            [int(v) if isint and isinstance(v, str) else v for v, isint in zip(row, ints)]
            for row in doc["data"]
        ]

    def load(self, csv_glob):
        cols = ", ".join(f"{n} {t}" for n, _, t in COLUMNS)
        self.session.query(
            f"CREATE TABLE nyct_lite ({cols}) ENGINE = MergeTree ORDER BY pickup_datetime"
        )
        self.session.query(
            f"INSERT INTO nyct_lite SELECT * FROM file({quote(csv_glob)}, 'CSV', {quote(cols)})"
        )
        return self._rows("SELECT count() FROM nyct_lite")[0][0]

    def query(self, sql):
        return [[cell(v) for v in row] for row in self._rows(sql)]


def timed(db, sql):
    t = time.perf_counter()
    rows = db.query(sql)
    return (time.perf_counter() - t) * 1000.0, rows


def main():
    req = json.load(sys.stdin)
    engine = {"duckdb": DuckDB, "chdb": ChDB}[req["engine"]]
    db = engine(req["work_dir"])
    log(f"{req['engine']} {db.version}: loading {req['csv_glob']}")
    t = time.perf_counter()
    rows = db.load(req["csv_glob"])
    load_secs = time.perf_counter() - t
    log(f"{req['engine']}: {rows} rows loaded in {load_secs:.1f} s")

    out = {
        "engine": req["engine"],
        "version": db.version,
        "threads": db.threads,
        "load_secs": load_secs,
        "rows": rows,
        "queries": [],
    }
    for q in req["queries"]:
        entry = {"name": q["name"], "ms": None, "rows": None, "error": None}
        try:
            _, answer = timed(db, q["sql"])  # warm-up
            entry["ms"] = min(timed(db, q["sql"])[0] for _ in range(3))
            entry["rows"] = answer
            log(f"{req['engine']} {q['name']}: {entry['ms']:.2f} ms")
        except Exception as e:  # report the query as failed and go on with the others
            entry["error"] = f"{type(e).__name__}: {e}"
            log(f"{req['engine']} {q['name']}: {entry['error']}")
        out["queries"].append(entry)

    alert = {"qps": None, "queries": 0, "error": None}
    try:
        sql = req["alert"]["sql"]
        db.query(sql)  # warm-up
        n = 0
        start = time.perf_counter()
        deadline = start + float(req["duration_secs"])
        while time.perf_counter() < deadline:
            db.query(sql)
            n += 1
        alert["queries"] = n
        alert["qps"] = n / (time.perf_counter() - start)
        log(f"{req['engine']} alert: {alert['qps']:.0f} q/s")
    except Exception as e:
        alert["error"] = f"{type(e).__name__}: {e}"
    out["alert"] = alert
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
