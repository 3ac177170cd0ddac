#!/usr/bin/env bash
# Instructions per stored message of a fleet's sparse messages, counted by valgrind's
# callgrind: a figure that, unlike CPU time on a shared 2-core box, moves by about 0.3%
# between runs, so two builds can be compared one change at a time.
#
#   bash bench/fleet_callgrind.sh SLUICE_BIN [CONNS INTERVAL_S SECS] [OUT]
#
# Starts SLUICE_BIN (`SLUICE_WAL_DURABILITY=none` unless set: the sync is the kernel's
# time, not instructions) on 127.0.0.1:18483/18490 under callgrind with instrumentation off,
# connects CONNS Paho clients (bench/paho, built here; default 500), lets each publish one
# JSON reading every INTERVAL_S seconds (default 5), waits one interval (so that every
# device's last-value entry exists, as in a fleet that has run a while), then counts SECS
# seconds (default 10). Prints the instructions, the messages (calls of `on_publish`) and
# their ratio; OUT (default /tmp/fleet-callgrind.out) is kept for `callgrind_annotate
# --inclusive=yes OUT`. Needs valgrind and Go.
set -euo pipefail
bin=$(realpath "$1"); conns=${2:-500}; interval=${3:-5}; secs=${4:-10}
out=${5:-/tmp/fleet-callgrind.out}
here=$(cd "$(dirname "$0")" && pwd)
d=$(mktemp -d)
(cd "$here/paho" && go build -o "$d/paho-load" .)
rm -f "$out"
SLUICE_WAL_DURABILITY=${SLUICE_WAL_DURABILITY:-none} valgrind --tool=callgrind \
  --instr-atstart=no --dump-instr=no --callgrind-out-file="$out" \
  "$bin" serve --http-listen 127.0.0.1:18490 --mqtt-listen 127.0.0.1:18483 --pg-listen '' \
  --data-dir "$d/data" >"$d/server.log" 2>&1 &
server=$!
client=
cleanup() {
  [ -n "$client" ] && kill "$client" 2>/dev/null
  kill "$server" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$d"
}
trap cleanup EXIT
sql() { curl -fsS -o /dev/null http://127.0.0.1:18490/v1/sql -d "$1"; }
for _ in $(seq 600); do sql 'SELECT 1' 2>/dev/null && break; sleep 0.5; done
sql 'CREATE DATABASE bench'
sql 'CREATE TABLE bench.readings (ts TIMESTAMP, device STRING, seq BIGINT, temp DOUBLE) PARTITION BY ymdh(ts)'
mkfifo "$d/go"
"$d/paho-load" -broker tcp://127.0.0.1:18483 -conns "$conns" -interval "${interval}s" \
  -duration "$((interval + secs + 6))s" <"$d/go" >"$d/client.out" 2>&1 &
client=$!
exec 9>"$d/go"
for _ in $(seq 1200); do grep -q connected "$d/client.out" && break; sleep 0.5; done
echo go >&9
sleep "$((interval + 1))"
callgrind_control -i on "$server" >/dev/null
sleep "$secs"
callgrind_control -i off "$server" >/dev/null
exec 9>&-
wait "$client"
client=
kill "$server"
wait "$server" 2>/dev/null || true
total=$(grep '^totals:' "$out" | cut -d' ' -f2)
msgs=$(callgrind_annotate --tree=calling "$out" 2>/dev/null \
  | awk '!n && /> +\?\?\?:sluice_broker::connection::inbound::on_publish \(/ {print; n=1}' \
  | sed 's/.*(\([0-9,]*\)x).*/\1/' | tr -d ,)
echo "instructions $total, messages $msgs, per message $((total / msgs))"
