#!/usr/bin/env bash
# The test command (README): formats check, lints, then every test of the workspace.
# Installs what the tests need when missing; builds into a target directory outside the
# clone so later runs on the same machine reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sluice-target}"
export CARGO_TERM_COLOR=never
# An S3-compatible store for tests/s3.rs: moto's server, from PyPI.
if ! command -v moto_server >/dev/null 2>&1; then
  python3 -m pip install --quiet 'moto[server]'
fi
# InfluxDB's Python client, for tests/influx.rs.
if ! python3 -c 'import influxdb_client' >/dev/null 2>&1; then
  python3 -m pip install --quiet influxdb-client
fi
# psycopg 3 (with its own libpq), for tests/pg.rs.
if ! python3 -c 'import psycopg' >/dev/null 2>&1; then
  python3 -m pip install --quiet 'psycopg[binary]'
fi
# From Debian: real MQTT clients for tests/mqtt.rs (mosquitto_pub, mosquitto_sub), a real
# broker to bridge from for tests/bridge.rs (mosquitto), and a real browser for
# tests/console.rs (chromium, driven through chromedriver), and the openssl tool that makes
# tests/tls.rs's private CA and certificates, and psql for tests/pg.rs.
missing=()
command -v mosquitto_pub >/dev/null 2>&1 && command -v mosquitto_sub >/dev/null 2>&1 \
  || missing+=(mosquitto-clients)
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || missing+=(mosquitto)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
command -v curl >/dev/null 2>&1 || missing+=(curl)
python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  sudo_=""
  [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The PostgreSQL JDBC driver from Maven Central, for tests/pg.rs (checked against its
# published sha256).
jdbc="$HOME/.cache/sluice-jdbc/postgresql-42.7.14.jar"
if [ ! -f "$jdbc" ]; then
  mkdir -p "$(dirname "$jdbc")"
  url=https://repo1.maven.org/maven2/org/postgresql/postgresql/42.7.14/postgresql-42.7.14.jar
  curl -fsSL --retry 3 -o "$jdbc.part" "$url"
  echo "73914527305a40cce504b0d3d90b23caf565136912d607ae8ae7c5895512332c  $jdbc.part" | sha256sum -c --quiet -
  mv "$jdbc.part" "$jdbc"
fi
# A Sparkplug B client library, for tests/sparkplug.rs: pysparkplug (PyPI) in a venv of its
# own (it needs paho-mqtt 1.x).
spb="$HOME/.cache/sluice-sparkplug"
if ! "$spb/bin/python" -c 'import pysparkplug' >/dev/null 2>&1; then
  python3 -m venv "$spb"
  "$spb/bin/pip" install --quiet 'pysparkplug==0.6.1'
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
log="${CARGO_TARGET_DIR}/last-test.log"
set +e
cargo test --workspace --no-fail-fast 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One closing line for the whole workspace (cargo prints one per test binary, the last
# usually being an empty doc-test run).
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, i }' "$log"
exit "$status"
