#!/usr/bin/env bash
# Fails when a build scripts/test.sh runs would compile a dependency with other features than
# `cargo test --workspace` does, which gives that dependency and everything above it a second
# compilation (unify/Cargo.toml says how the features are unified). The builds: the binary as
# the Dockerfile's stages build it (scripts/build.sh), python/ as maturin builds it, an example
# as tests/example.rs builds it, and — for arrow only — the minimal build (scripts/minimal.sh).
# Reads `cargo tree` only; builds nothing. scripts/test.sh runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

# "name version [features]": the feature sets that build compiles each crate with, one a line.
features() { cargo tree --locked "$@" --no-dedupe --prefix none -f '{p} [{f}]' \
    | sed -E 's/ \((proc-macro|\*|\/[^)]*)\)//g' | grep -E '^[^ ]+ v[^ ]+ \[' | sort -u; }
# The feature flags of one of the Dockerfile's build lines, as scripts/build.sh passes them.
build_flags() { scripts/build.sh --dry-run "$@" | head -1 | grep -oE -- '--no-default-features|--features [^ ]+'; }

tests="$(features --workspace --features mpi -e normal,build,dev)"
status=0
# $1: the crates to compare (a regex on "name version"); the rest: the build, as `cargo tree` arguments. The
# `sluice` package itself is compiled per feature set, as it must be.
compare() {
    local crates="$1" missing
    shift
    missing="$(comm -23 <(features "$@" | grep -E "^($crates) " | grep -v '^sluice v') \
        <(printf '%s\n' "$tests"))"
    [[ -z "$missing" ]] && return
    echo "check-features: \`cargo build $*\` compiles these with features that \`cargo test --workspace --features mpi\` does not:" >&2
    while IFS= read -r line; do
        echo "  $line" >&2
        printf '%s\n' "$tests" | grep -E "^${line%% v*} v" | sed 's/^/      the tests: /' >&2 || true
    done <<<"$missing"
    status=1
}
# Assigned first, so that a failing scripts/build.sh stops this script (set -e).
train="$(build_flags --mpi)" fleet="$(build_flags --no-torch)"
# shellcheck disable=SC2086  # the flags are words
compare '[^ ]+ v[^ ]+' -p sluice $train -e normal,build
# shellcheck disable=SC2086
compare '[^ ]+ v[^ ]+' -p sluice $fleet -e normal,build
compare '[^ ]+ v[^ ]+' -p sluice-python -e normal,build
compare '[^ ]+ v[^ ]+' -p sluice --features mpi -e normal,build,dev
# The minimal build leaves out object_store's stores, so it compiles object_store, parquet and
# the members again; arrow, and every crate under it, it shares.
minimal=(-p sluice --no-default-features -e normal,build)
under_arrow="$(cargo tree --locked "${minimal[@]}" --no-dedupe --prefix depth -f '{p}' | awk '
    match($0, /^[0-9]+/) {
        depth = substr($0, 1, RLENGTH) + 0; split(substr($0, RLENGTH + 1), name, " ")
        if (inside && depth <= top) exit
        if (inside || name[1] == "arrow") { if (!inside) top = depth; inside = 1; print name[1] " " name[2] }
    }' | sort -u | paste -sd '|')"
compare "$under_arrow" "${minimal[@]}"
if ((status)); then
    echo "check-features: turn the missing features on in unify/Cargo.toml (or in the root Cargo.toml's [workspace.dependencies], or turn off a dev-dependency's defaults), see its head" >&2
fi
exit "$status"
