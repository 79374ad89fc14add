#!/usr/bin/env bash
# The GPU checks (scripts/gpu_check.py) for a machine with an NVIDIA GPU, python3 and torch,
# and no Rust toolchain: the Python package links no libtorch (tensors cross by DLPack), so
# one wheel built here runs against whatever torch the GPU machine has.
#
#   scripts/gpu-check.sh --wheel            here: build the release wheel into target/gpu-check
#                                           (needs scripts/python.sh's venv for maturin)
#   scripts/gpu-check.sh [gpu_check.py options]   there: install that wheel into a venv that
#                                           sees the machine's torch, run the checks; with
#                                           OUT set, gpu-check.json goes there
#
# The wheel is built with `--auditwheel skip`: it links the OpenSSL of the machine that built
# it (libssl.so.3), which the GPU machine must have too.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
wheels="$root/target/gpu-check"
if [[ "${1:-}" == --wheel ]]; then
    maturin="$root/target/services/venv-python/bin/maturin"
    [[ -x "$maturin" ]] || { echo "gpu-check: run scripts/python.sh --build first (it installs maturin)" >&2; exit 1; }
    rm -rf "$wheels"
    "$maturin" build --quiet --release --strip --auditwheel skip -m "$root/python/Cargo.toml" -o "$wheels" >&2
    ls -l "$wheels"
    exit 0
fi
shopt -s nullglob
wheel=("$wheels"/sluice-*.whl)
[[ ${#wheel[@]} == 1 ]] || { echo "gpu-check: no wheel in $wheels: build it with scripts/gpu-check.sh --wheel and bring target/gpu-check along" >&2; exit 1; }
python3 -c 'import torch, numpy, pyarrow' || { echo "gpu-check: python3 needs torch, numpy and pyarrow" >&2; exit 1; }
venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-index "${wheel[0]}"
"$venv/bin/python" "$root/scripts/gpu_check.py" "$@"
