#!/usr/bin/env bash
# Installs the Python peers `sluice bench` compares against into a private venv,
# target/services/venv-peers. Benchmarks only: Sluice itself never needs Python.
#
#   scripts/python-peers.sh                 numpy + pyarrow (the numpy peer), print the python
#   scripts/python-peers.sh --with-torch    also PyTorch 2.13.0 (the DataLoader peer)
#   source scripts/python-peers.sh [--with-torch]   same, and export SLUICE_BENCH_PYTHON
#
# numpy + pyarrow: ~60 MB, seconds. torch: PyPI's x86_64 Linux wheel is the CUDA build and
# pulls ~2.7 GB of NVIDIA wheels (~4.7 GB installed, ~2 minutes) — which is why the test
# suite (scripts/test.sh) installs only the light peers, and the DataLoader row of
# `sluice bench` says how to get it when torch is missing.
# Idempotent (a stamp records what was installed). pip's temporary files go under
# target/services/tmp, not /tmp, which is often a small tmpfs.

_sluice_python_peers() {
    local root venv stamp light full want have tmp
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    venv="$root/target/services/venv-peers"
    light="numpy pyarrow"
    full="$light torch==2.13.0"
    case "${1:-}" in
        "") want="$light" ;;
        --with-torch) want="$full" ;;
        *) echo "[python-peers] unknown option $1 (expected --with-torch)" >&2; return 1 ;;
    esac
    stamp="$venv/.sluice-peers"
    have="$(cat "$stamp" 2>/dev/null)"
    # What was asked for, or more (a venv with torch also serves the light peers), is kept.
    if [[ "$have" == "$want" || "$have" == "$full" ]]; then
        echo "$venv/bin/python"
        return 0
    fi
    echo "[python-peers] installing $want into $venv" >&2
    command -v python3 >/dev/null || { echo "[python-peers] python3 is needed" >&2; return 1; }
    rm -rf "$venv"
    python3 -m venv "$venv" >&2 || { echo "[python-peers] python3 -m venv failed (apt install python3-venv)" >&2; return 1; }
    tmp="$root/target/services/tmp"
    mkdir -p "$tmp" || return 1
    # shellcheck disable=SC2086
    TMPDIR="$tmp" "$venv/bin/pip" install --disable-pip-version-check --quiet --no-cache-dir $want >&2 \
        || { echo "[python-peers] pip install $want failed" >&2; rm -rf "$tmp"; return 1; }
    rm -rf "$tmp"
    local imports="import numpy, pyarrow"
    [[ "$want" == *torch* ]] && imports="$imports, torch"
    "$venv/bin/python" -c "$imports" >&2 \
        || { echo "[python-peers] the installed packages do not import" >&2; return 1; }
    echo "$want" > "$stamp" || return 1
    echo "$venv/bin/python"
}

if _sluice_peers_python="$(_sluice_python_peers "$@")"; then
    if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
        export SLUICE_BENCH_PYTHON="$_sluice_peers_python"
    else
        echo "$_sluice_peers_python"
    fi
else
    if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then return 1; else exit 1; fi
fi
