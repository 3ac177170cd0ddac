"""InfluxDB's write API: line protocol over HTTP, Sluice against QuestDB 9 (its ILP over
HTTP, the same `/api/v2/write` route), in alternating rounds on this machine.

Each round starts both servers afresh on free 127.0.0.1 ports, then each client thread
POSTs requests of `--lines` lines (a readings measurement: two tags, a float, an integer and
a boolean field, nanosecond timestamps) over one kept-alive connection. Sluice answers 204
once the rows are durable (fdatasync); QuestDB is measured as shipped (commits without
fsync) and with `cairo.commit.mode=sync` (fsync on commit). Prints rows/s and server CPU
per row (from /proc) for each, and the ratios; the rows are counted back afterwards.

  python3 bench/influx_bench.py --sluice ~/.cache/sluice-target/release/sluice \
      [--questdb questdb-9.3.4.jar] [--lines 5000] [--requests 100] [--clients 1] [--rounds 3]

The QuestDB jar comes from Maven Central (org.questdb:questdb) when not given; it needs a
Java 17 runtime.
"""

import argparse
import http.client
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

from sluice_http import Sluice, free_port

QUESTDB = "https://repo1.maven.org/maven2/org/questdb/questdb/9.3.4/questdb-9.3.4.jar"


def cpu_seconds(pid):
    """utime + stime of a process and its threads, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def body(request, lines):
    """Request `request`'s lines: 1,000 devices, a reading per device every 10 s."""
    out = []
    base = 1767225600 * 10**9
    for k in range(lines):
        i = request * lines + k
        d = i % 1000
        ts = base + (i // 1000) * 10 * 10**9 + d * 1000
        out.append(f"readings,device=d{d:04},site=s{d % 10} temp={20 + (i % 97) * 0.1:.1f},"
                   f"hum={i % 100}i,ok={'true' if i % 7 else 'false'} {ts}")
    return ("\n".join(out) + "\n").encode()


class QuestDB:
    def __init__(self, jar, root, sync):
        self.port = free_port()
        env = dict(os.environ,
                   QDB_HTTP_BIND_TO=f"127.0.0.1:{self.port}",
                   QDB_HTTP_MIN_NET_BIND_TO=f"127.0.0.1:{free_port()}",
                   QDB_PG_NET_BIND_TO=f"127.0.0.1:{free_port()}",
                   QDB_LINE_TCP_NET_BIND_TO=f"127.0.0.1:{free_port()}",
                   QDB_LINE_UDP_ENABLED="false",
                   QDB_TELEMETRY_ENABLED="false")
        if sync:
            env["QDB_CAIRO_COMMIT_MODE"] = "sync"
        self.proc = subprocess.Popen(
            ["java", "-p", jar, "-m", "io.questdb/io.questdb.ServerMain", "-d", root],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.time() + 60
        while True:
            try:
                self.count()
                return
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)

    def count(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("GET", "/exec?query=" + urllib.request.quote("select count() from readings"))
        r = c.getresponse()
        data = r.read().decode()
        if "does not exist" in data:
            return 0
        import json
        return json.loads(data)["dataset"][0][0]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def load(port, path, bodies, clients):
    """POSTs the bodies from `clients` threads (each its own connection); returns seconds."""
    errors = []

    def run(mine):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        for b in mine:
            c.request("POST", path, body=b, headers={"content-type": "text/plain"})
            r = c.getresponse()
            data = r.read()
            if r.status != 204:
                errors.append(f"HTTP {r.status}: {data[:300]!r}")
                return

    threads = [threading.Thread(target=run, args=(bodies[i::clients],)) for i in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise RuntimeError(errors[0])
    return time.perf_counter() - t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sluice", required=True)
    p.add_argument("--questdb")
    p.add_argument("--lines", type=int, default=5000)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    jar = a.questdb or os.path.expanduser("~/.cache/sluice-bench/questdb-9.3.4.jar")
    if not os.path.exists(jar):
        os.makedirs(os.path.dirname(jar), exist_ok=True)
        urllib.request.urlretrieve(QUESTDB, jar + ".part")
        os.rename(jar + ".part", jar)
    bodies = [body(r, a.lines) for r in range(a.requests)]
    rows = a.lines * a.requests
    path = "/api/v2/write?org=bench&bucket=bench&precision=ns"
    results = {"sluice": [], "questdb": [], "questdb-sync": []}
    for rnd in range(a.rounds):
        for name in results:
            root = tempfile.mkdtemp(prefix=f"influx-{name}-")
            try:
                if name == "sluice":
                    s = Sluice(a.sluice, root, {"SLUICE_MQTT_AUTO_CREATE_DATABASES": "bench"})
                    s.sql("CREATE DATABASE bench")
                    port, pid, count = s.port, s.proc.pid, lambda: int(
                        s.sql("SELECT count(*) FROM bench.readings").split()[-1])
                else:
                    s = QuestDB(jar, root, name == "questdb-sync")
                    port, pid, count = s.port, s.proc.pid, s.count
                cpu = cpu_seconds(pid)
                secs = load(port, path, bodies, a.clients)
                cpu = cpu_seconds(pid) - cpu
                deadline = time.time() + 60
                while (n := count()) < rows and time.time() < deadline:
                    time.sleep(0.2)  # QuestDB applies WAL tables in the background
                assert n == rows, f"{name}: {n} rows of {rows}"
                results[name].append((rows / secs, cpu / rows * 1e6))
                print(f"round {rnd + 1} {name}: {rows / secs:,.0f} rows/s, "
                      f"{cpu / rows * 1e6:.2f} µs CPU per row", flush=True)
                s.stop()
            finally:
                shutil.rmtree(root, ignore_errors=True)
    med = {k: (statistics.median(r for r, _ in v), statistics.median(c for _, c in v))
           for k, v in results.items()}
    print(f"\n{a.requests} requests x {a.lines} lines, {a.clients} client(s), medians of "
          f"{a.rounds} rounds")
    for k, (r, c) in med.items():
        print(f"{k:13} {r:12,.0f} rows/s {c:8.2f} µs CPU/row")
    for peer in ("questdb", "questdb-sync"):
        print(f"sluice / {peer}: {med['sluice'][0] / med[peer][0]:.2f}x rows/s, "
              f"{med['sluice'][1] / med[peer][1]:.2f}x CPU per row")


if __name__ == "__main__":
    main()
