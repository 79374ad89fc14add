#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this script). Works on a fresh machine
# with a Rust toolchain: cargo fetches the dependencies; nothing else is needed yet.
#
#   scripts/test.sh            formatting, clippy (warnings are errors), every test
#   SLUICE_SKIP_LINT=1 scripts/test.sh   tests only
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo not found; install Rust from https://rustup.rs" >&2
    exit 1
fi

if [[ "${SLUICE_SKIP_LINT:-0}" != 1 ]]; then
    step "cargo fmt --check"
    cargo fmt --all -- --check
    step "cargo clippy (warnings are errors)"
    cargo clippy --workspace --all-targets --locked -- -D warnings
fi

step "unit, integration, CLI, example and bench-smoke tests"
# --all-targets: libraries, binaries, tests/, examples/ (built and run by tests/example.rs)
# and benches (each run once, as a smoke test).
cargo test --workspace --all-targets --locked

step "doc tests"
cargo test --workspace --doc --locked

step "all tests passed"
