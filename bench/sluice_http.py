"""What the Python benchmark runners share (`latest_bench.py`, `fleet_bench.py`): a Sluice
server started on free 127.0.0.1 ports and spoken to over one kept-alive HTTP connection,
and timing of repeated runs."""

import http.client
import os
import signal
import socket
import statistics
import subprocess
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sluice:
    """`sluice serve` on `data_dir` with extra environment `env` (and a PostgreSQL listener
    on `self.pg` with `pg`); stopped with SIGTERM."""

    def __init__(self, binary, data_dir, env=None, pg=False):
        self.port, self.mqtt = free_port(), free_port()
        self.pg = free_port() if pg else None
        args = [binary, "serve", "--data-dir", data_dir, "--http-listen", f"127.0.0.1:{self.port}",
                "--mqtt-listen", f"127.0.0.1:{self.mqtt}",
                "--pg-listen", f"127.0.0.1:{self.pg}" if pg else ""]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=dict(os.environ, **(env or {})))
        deadline = time.time() + 30
        while True:
            try:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
                self.sql("SELECT 1")
                return
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)

    def request(self, path, body, ctype="text/plain"):
        self.conn.request("POST", path, body=body.encode(), headers={"content-type": ctype})
        r = self.conn.getresponse()
        data = r.read().decode()
        if r.status >= 300:
            raise RuntimeError(f"{path}: HTTP {r.status}: {data[:500]}")
        return data

    def sql(self, q):
        """The answer as CSV, computed (`cache=off`)."""
        return self.request("/v1/sql?format=csv&cache=off", q)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


def timed(f, runs):
    """(best, median, first) in ms of `f`: one run to warm up (the first), then `runs`."""
    t = time.perf_counter()
    f()
    first = (time.perf_counter() - t) * 1000
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1000)
    return min(times), statistics.median(times), first
