#!/usr/bin/env bash
# Fails when `cargo test --workspace` would compile a dependency with other features than the
# `sluice` binary's own builds (scripts/build.sh, as the Dockerfile's stages run it) or
# maturin's build of python/, which gives that dependency and everything above it a second
# compilation in scripts/test.sh (unify/Cargo.toml says how the features are unified). Reads `cargo tree` only;
# builds nothing. scripts/test.sh runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

# "name version" -> the feature sets that build compiles it with, one line each.
features() { cargo tree --locked "$@" --no-dedupe --prefix none -f '{p} [{f}]' \
    | sed -E 's/ \((proc-macro|\*|\/[^)]*)\)//g' | grep -E '^[^ ]+ v[^ ]+ \[' | sort -u; }

tests="$(features --workspace --features mpi -e normal,build,dev)"
status=0
# The binary as the Dockerfile's two stages build it, python/ as maturin builds it, and an
# example as tests/example.rs builds it (with the dev-dependencies).
for build in "-p sluice --features mpi -e normal,build" \
    "-p sluice --no-default-features --features kafka,s3,gcs,azure,http,image -e normal,build" \
    "-p sluice-python -e normal,build" "-p sluice --features mpi -e normal,build,dev"; do
    # The `sluice` package itself is compiled per feature set, as it must be.
    # shellcheck disable=SC2086
    missing="$(comm -23 <(features $build | grep -v '^sluice v') \
        <(printf '%s\n' "$tests"))"
    if [[ -n "$missing" ]]; then
        echo "check-features: \`cargo build $build\` compiles these with features that \`cargo test --workspace --features mpi\` does not:" >&2
        while IFS= read -r line; do
            name="${line%% v*}"
            echo "  $line" >&2
            printf '%s\n' "$tests" | grep -E "^$name v" | sed 's/^/      the tests: /' >&2 || true
        done <<<"$missing"
        status=1
    fi
done
# The minimal build (scripts/minimal.sh) leaves out object_store's stores, so it compiles
# object_store, parquet and the members again; arrow it shares.
missing="$(comm -23 <(features -p sluice --no-default-features -e normal,build | grep '^arrow') \
    <(printf '%s\n' "$tests"))"
if [[ -n "$missing" ]]; then
    echo "check-features: the minimal build (\`cargo build -p sluice --no-default-features\`) compiles arrow again:" >&2
    printf '  %s\n' "$missing" >&2
    status=1
fi
if ((status)); then
    echo "check-features: turn the missing features on in unify/Cargo.toml (or in the root Cargo.toml's [workspace.dependencies], or turn off a dev-dependency's defaults), see its head" >&2
fi
exit "$status"
