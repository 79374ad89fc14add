#!/usr/bin/env bash
# The quickstart: the bundled digits through configs/quickstart.yaml with the release build —
# `sluice run` (preprocess → Parquet), then `sluice train` (an MLP, two data-parallel workers,
# evaluated on the held-out split). Installs the CPU libtorch the `sluice` binary links
# (scripts/libtorch.sh, cached) first; no servers needed. Extra arguments go to `sluice run`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/libtorch.sh
source scripts/libtorch.sh
cargo run --release -- run configs/quickstart.yaml "$@"
cargo run --release -- train configs/quickstart.yaml
