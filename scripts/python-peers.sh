#!/usr/bin/env bash
# Installs the Python peers `sluice bench` compares against — PyTorch 2.13.0 (DataLoader),
# numpy and pyarrow — into a private venv, target/services/venv-peers. Benchmarks only:
# Sluice itself never needs Python.
#
#   scripts/python-peers.sh          install if missing, print the venv's python
#   source scripts/python-peers.sh   same, and export SLUICE_BENCH_PYTHON
#
# Idempotent (a stamp records the versions). ~2.7 GB download (PyPI's torch wheel for x86_64
# Linux is the CUDA build; it runs on CPU), ~2 minutes.

_sluice_python_peers() {
    local root venv stamp want
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    venv="$root/target/services/venv-peers"
    want="torch==2.13.0 numpy pyarrow"
    stamp="$venv/.sluice-peers"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        echo "$venv/bin/python"
        return 0
    fi
    echo "[python-peers] installing $want into $venv" >&2
    command -v python3 >/dev/null || { echo "[python-peers] python3 is needed" >&2; return 1; }
    rm -rf "$venv"
    python3 -m venv "$venv" >&2 || { echo "[python-peers] python3 -m venv failed (apt install python3-venv)" >&2; return 1; }
    # shellcheck disable=SC2086
    "$venv/bin/pip" install --disable-pip-version-check --quiet --no-cache-dir $want >&2 \
        || { echo "[python-peers] pip install failed" >&2; return 1; }
    "$venv/bin/python" -c "import torch, numpy, pyarrow" >&2 \
        || { echo "[python-peers] the installed packages do not import" >&2; return 1; }
    echo "$want" > "$stamp" || return 1
    echo "$venv/bin/python"
}

if _sluice_peers_python="$(_sluice_python_peers)"; then
    if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
        export SLUICE_BENCH_PYTHON="$_sluice_peers_python"
    else
        echo "$_sluice_peers_python"
    fi
else
    if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then return 1; else exit 1; fi
fi
