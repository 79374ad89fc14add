#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this script). Works on a fresh machine
# with a Rust toolchain, a C toolchain and python3: cargo fetches the dependencies (librdkafka
# is built from source and needs OpenSSL headers, installed here with apt-get if missing),
# scripts/libtorch.sh installs a CPU libtorch for tch (from PyPI wheels), scripts/mpi.sh
# OpenMPI (apt-get) for the `mpi` backend,
# scripts/python.sh builds the Python package's wheel and installs it into a venv with torch,
# numpy, pyarrow (also the Python peers `sluice bench` compares with), pytest, boto3 and
# confluent-kafka (~5 GB, kept in target/services: torch from PyPI is the CUDA build),
# scripts/services.sh installs and starts the S3 server (moto) and the Kafka broker (Tansu)
# the integration tests use, and stops them at the end; after the cargo tests the Python
# package's own tests run (pytest) against the same servers.
#
#   scripts/test.sh            formatting, clippy (warnings are errors), the minimal build
#                              (scripts/minimal.sh), every test
#   SLUICE_SKIP_LINT=1 scripts/test.sh   tests only
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says when it starts, counted from the start of the suite: where CI's time goes.
step() { printf '\n==> [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo not found; install Rust from https://rustup.rs" >&2
    exit 1
fi

if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists openssl; } \
    && [[ ! -f /usr/include/openssl/ssl.h ]]; then
    step "installing OpenSSL headers (librdkafka's TLS)"
    if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
        apt-get install -y -q libssl-dev pkg-config >/dev/null
    else
        echo "error: OpenSSL headers not found; install libssl-dev (Debian/Ubuntu) or openssl-devel" >&2
        exit 1
    fi
fi

# A cold run gains nothing from incremental compilation, and its caches cost about as much
# disk as the objects themselves (~0.7 GB already after clippy): off for every cargo below.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# The standard library's debug info is linked into every test binary (~20 MB of ~80 MB each):
# stripped here. Panics still name their file:line (that is not debug info).
export CARGO_PROFILE_DEV_STRIP="${CARGO_PROFILE_DEV_STRIP:-debuginfo}"

step "libtorch (CPU build for tch, from PyPI wheels; cached in target/services/libtorch)"
# shellcheck source=scripts/libtorch.sh
source scripts/libtorch.sh
echo "LIBTORCH=$LIBTORCH"
step "OpenMPI (the mpi all-reduce backend; tests/train_mpi.rs runs mpirun -np 2)"
# shellcheck source=scripts/mpi.sh
source scripts/mpi.sh
FEATURES=(--features mpi)
step "Python package (python/: wheel built with maturin, installed with torch into target/services/venv-python)"
# Before the cargo tests: its venv is also the bench test's Python (numpy, torch, sluice).
SLUICE_BENCH_PYTHON="$(scripts/python.sh --build)"
export SLUICE_BENCH_PYTHON
echo "SLUICE_BENCH_PYTHON=$SLUICE_BENCH_PYTHON"

# Two cores: one intra-op thread per process keeps concurrent tests from oversubscribing.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

if [[ "${SLUICE_SKIP_LINT:-0}" != 1 ]]; then
    step "cargo fmt --check"
    cargo fmt --all -- --check
    step "dependency features: the wheel, the binary and the tests compile each dependency once (scripts/check-features.sh)"
    scripts/check-features.sh
    step "cargo clippy (warnings are errors)"
    cargo clippy --workspace --all-targets --locked "${FEATURES[@]}" -- -D warnings
fi

step "minimal build (--no-default-features): the quickstart pipeline, and what it leaves out refused"
scripts/minimal.sh

step "container recipe: the Dockerfile's build lines run (dev profile) and its images' commands checked (scripts/check-dockerfile.sh)"
scripts/check-dockerfile.sh

step "starting services (S3, Kafka — plain, TLS and SASL —, Azurite, GCS, HTTP and HTTPS)"
SERVICES_STARTED=0
cleanup() { if [[ "$SERVICES_STARTED" == 1 ]]; then scripts/services.sh stop || true; fi; }
trap cleanup EXIT
ALREADY_RUNNING="$(scripts/services.sh env)"
eval "$(scripts/services.sh start)"
# Stop at the end only what this run started.
if [[ -z "$ALREADY_RUNNING" ]]; then SERVICES_STARTED=1; fi

step "unit, integration, CLI, example and bench-smoke tests"
# --all-targets: libraries, binaries, tests/, examples/ (built and run by tests/example.rs)
# and benches (each run once, as a smoke test).
cargo test --workspace --all-targets --locked --no-fail-fast "${FEATURES[@]}"

step "doc tests"
cargo test --workspace --doc --locked --no-fail-fast "${FEATURES[@]}"

step "Python package tests (pytest, against the same servers)"
# After the cargo tests: target/debug/sluice, the Rust side the package is compared with, is built.
scripts/python.sh --test

step "all tests passed"
