#!/usr/bin/env bash
# Builds the Python package (python/: pyo3 + maturin, an abi3 wheel without libtorch), installs
# it into a private venv with what its tests need, and runs them (pytest, against the real S3
# server and Kafka broker when scripts/services.sh has started them).
#
#   scripts/python.sh            build the wheel (dev profile), install it, run python/tests
#   scripts/python.sh --build    build and install only; prints the venv's python
#   scripts/python.sh --test     run python/tests with what is installed
#   SLUICE_WHEEL_PROFILE=release scripts/python.sh --build   an optimised wheel (benchmarks)
#
# The venv is target/services/venv-python (from PyPI: maturin, pytest, numpy, pyarrow, torch —
# the CUDA build, ~4.7 GB, ~40 s to install on a fast link —, boto3 and confluent-kafka for the
# tests against the S3 server and the Kafka broker; kept between runs, re-made when the list
# below changes). The wheel goes to target/wheels.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
venv="$root/target/services/venv-python"
# safetensors, tensorboard: the Rust suite reads what `sluice train` writes with them; optuna:
# examples/optuna.sh is tested against it; azure-storage-blob creates the Azure tests' containers;
# jsonschema, pyyaml: tests/k8s_schema.py validates `sluice k8s` output against the CRDs.
want="maturin==1.16.0 pytest numpy pyarrow torch==2.13.0 boto3 confluent-kafka safetensors tensorboard optuna azure-storage-blob jsonschema pyyaml"
stamp="$venv/.sluice-python"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    echo "[python] installing $want into $venv" >&2
    # An existing venv keeps what it has (pip adds what is missing); a broken one is rebuilt.
    [[ -x "$venv/bin/pip" ]] || { rm -rf "$venv"; python3 -m venv "$venv"; }
    tmp="$root/target/services/tmp"
    mkdir -p "$tmp"
    # shellcheck disable=SC2086
    TMPDIR="$tmp" "$venv/bin/pip" install --disable-pip-version-check --quiet --no-cache-dir $want
    rm -rf "$tmp"
    echo "$want" > "$stamp"
fi
if [[ "${1:-}" == --test ]]; then
    SLUICE_BIN="${SLUICE_BIN:-$root/target/debug/sluice}" exec "$venv/bin/python" -m pytest -q python/tests
fi
# The dev profile shares the test suite's compiled dependencies (unify/Cargo.toml says how);
# the wheel is abi3 (≥ 3.10).
rm -rf target/wheels
# `--auditwheel skip`: a wheel for this machine, linked to its OpenSSL (librdkafka's TLS),
# not a manylinux wheel bundling it.
"$venv/bin/maturin" build --quiet --profile "${SLUICE_WHEEL_PROFILE:-dev}" --auditwheel skip -m python/Cargo.toml -o target/wheels >&2
"$venv/bin/pip" install --disable-pip-version-check --quiet --force-reinstall --no-deps target/wheels/sluice-*.whl >&2
if [[ "${1:-}" == --build ]]; then
    echo "$venv/bin/python"
    exit 0
fi
SLUICE_BIN="${SLUICE_BIN:-$root/target/debug/sluice}" "$venv/bin/python" -m pytest -q python/tests
