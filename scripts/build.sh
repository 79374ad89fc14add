#!/usr/bin/env bash
# Builds the `sluice` binary and installs it with the shared libraries it needs into a prefix
# — what the container image (Dockerfile) and the quickstart run.
#
#   scripts/build.sh [--prefix DIR] [--profile release|dev] [--mpi] [--no-torch] [--dry-run]
#
#   --prefix DIR   install DIR/bin/sluice and (with libtorch) DIR/lib/*.so*; default target/dist
#                  (a relative DIR is relative to the repository's root)
#   --profile P    cargo profile (default release)
#   --mpi          the `mpi` all-reduce backend (needs OpenMPI: scripts/mpi.sh)
#   --no-torch     no libtorch, no `train`: `sluice run` with Kafka and every object store
#                  (the preprocessing-fleet image)
#   --dry-run      print the cargo command and the files it would install, build nothing
#
# With libtorch (default) it installs the CPU libtorch first (scripts/libtorch.sh, cached)
# and copies its shared libraries next to the binary: DIR/lib is what LD_LIBRARY_PATH names
# where the binary runs (the binary's own rpath points at the build machine's libtorch).
set -euo pipefail
cd "$(dirname "$0")/.."

prefix="target/dist" profile="release" mpi=0 torch=1 dry=0
while (($#)); do
    case "$1" in
        --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
        --profile) profile="${2:?--profile needs release or dev}"; shift 2 ;;
        --mpi) mpi=1; shift ;;
        --no-torch) torch=0; shift ;;
        --dry-run) dry=1; shift ;;
        *) echo "build.sh: unknown argument $1 (see the head of scripts/build.sh)" >&2; exit 2 ;;
    esac
done
case "$profile" in release | dev) ;; *) echo "build.sh: --profile is release or dev, not $profile" >&2; exit 2 ;; esac
if ((mpi && !torch)); then echo "build.sh: --mpi needs libtorch (it is the trainer's backend): drop --no-torch" >&2; exit 2; fi

if ((torch)); then
    features=(--features "$( ((mpi)) && echo mpi || echo torch)")
else
    features=(--no-default-features --features kafka,s3,gcs,azure,http,image)
fi
cargo_cmd=(cargo build --locked --profile "$profile" --bin sluice "${features[@]}")
out_dir="${CARGO_TARGET_DIR:-target}/$([[ "$profile" == dev ]] && echo debug || echo release)"

if ((dry)); then
    echo "${cargo_cmd[*]}"
    echo "$prefix/bin/sluice"
    if ((torch)); then echo "$prefix/lib/"; fi
    exit 0
fi

if ((torch)); then
    # shellcheck source=scripts/libtorch.sh
    source scripts/libtorch.sh
fi
if ((mpi)); then
    # shellcheck source=scripts/mpi.sh
    source scripts/mpi.sh
fi
"${cargo_cmd[@]}"
mkdir -p "$prefix/bin"
cp -f "$out_dir/sluice" "$prefix/bin/sluice"
if ((torch)); then
    mkdir -p "$prefix/lib"
    # Hard links where the prefix shares the file system (the test's), copies elsewhere.
    for so in "$LIBTORCH"/lib/*.so*; do
        ln -f "$so" "$prefix/lib/" 2>/dev/null || cp -f "$so" "$prefix/lib/"
    done
fi
echo "[build] $prefix/bin/sluice$( ((torch)) && echo " and $prefix/lib (libtorch)")" >&2
