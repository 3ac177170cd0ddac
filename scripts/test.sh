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
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --no-fail-fast 2>&1 | tee "${CARGO_TARGET_DIR}/last-test.log"
exit "${PIPESTATUS[0]}"
