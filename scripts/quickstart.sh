#!/usr/bin/env bash
# The quickstart: the bundled digits through configs/quickstart.yaml with the release build —
# `sluice run` (preprocess → Parquet), then `sluice train` (an MLP, two data-parallel workers,
# evaluated on the held-out split). Installs the CPU libtorch the `sluice` binary links
# (scripts/libtorch.sh, cached) first; no servers needed. Extra arguments go to `sluice run`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The release build, installed into target/dist as the container image's build stage does
# (scripts/build.sh: the binary, and libtorch's libraries beside it).
scripts/build.sh --prefix target/dist
export LD_LIBRARY_PATH="$PWD/target/dist/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
target/dist/bin/sluice run configs/quickstart.yaml "$@"
target/dist/bin/sluice train configs/quickstart.yaml
