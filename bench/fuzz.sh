#!/usr/bin/env bash
# The fuzz harnesses run long (the test command runs them briefly): the MQTT codec and the
# SQL entry with FUZZ_CASES arbitrary inputs each, and the broker's session state
# machine over real sockets with FUZZ_CONNECTIONS connections.
#   bash bench/fuzz.sh [cases] [connections]     (defaults: 200000, 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sluice-target}"
# (Not SLUICE_*: the server refuses environment variables that name no setting.)
export FUZZ_CASES="${1:-200000}" FUZZ_CONNECTIONS="${2:-20000}"
# --workspace everywhere: the same features, so the test build's artifacts are reused.
cargo test --workspace --lib -- codec::fuzz ddl::tests::fuzz
cargo test --workspace --test fuzz
