#!/usr/bin/env bash
# The minimal build (`cargo build --no-default-features`: no librdkafka, no cloud SDKs, no
# image codecs, no libtorch) runs the quickstart pipeline on local disk and refuses what it
# left out, naming the cargo feature to enable. scripts/test.sh runs this; it needs no
# LIBTORCH and no servers.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --no-default-features --bin sluice --locked
bin="$(mktemp -d)/sluice-minimal"
cp target/debug/sluice "$bin"
work="$(mktemp -d)"
trap 'rm -rf "$work" "$(dirname "$bin")"' EXIT

fail() { echo "minimal build: $*" >&2; exit 1; }

# What it builds without: no libtorch in the binary.
if ldd "$bin" 2>/dev/null | grep -q libtorch; then fail "links libtorch"; fi

# The quickstart pipeline, every row of it.
SLUICE_OUT_DIR="$work/out" "$bin" run configs/quickstart.yaml --summary-json "$work/summary.json" \
    > "$work/run.log" 2>&1 || { cat "$work/run.log" >&2; fail "the quickstart pipeline failed"; }
grep -q '"rows_written": *1437' "$work/summary.json" \
    || { cat "$work/summary.json" >&2; fail "the quickstart did not write 1437 rows"; }
[[ -s "$work/out/digits-train.parquet" ]] || fail "no output file"

# Components left out are refused, naming their feature; nothing is written.
refused() { # feature, yaml
    local feature="$1" yaml="$work/$1.yaml"
    printf '%s\n' "$2" > "$yaml"
    if "$bin" run "$yaml" > "$work/$feature.log" 2>&1; then
        fail "a config needing \`$feature\` ran"
    fi
    grep -q "needs the \`$feature\` cargo feature" "$work/$feature.log" \
        || { cat "$work/$feature.log" >&2; fail "the refusal does not name \`$feature\`"; }
    grep -q panicked "$work/$feature.log" && fail "panicked"
    echo "refused, naming \`$feature\`: $(head -1 "$work/$feature.log")"
}
digits="$PWD/data/digits/train.parquet"
refused kafka "source: {type: kafka, brokers: 'localhost:9092', topic: t, format: json, schema: {id: int64}}
sink: {type: null}"
refused s3 "source: {type: parquet, path: 's3://bucket/x.parquet'}
sink: {type: null}"
refused gcs "source: {type: parquet, path: 'gs://bucket/x.parquet'}
sink: {type: null}"
refused azure "source: {type: parquet, path: 'az://container/x.parquet'}
sink: {type: null}"
refused http "source: {type: parquet, path: 'https://example.com/x.parquet'}
sink: {type: null}"
refused image "source: {type: parquet, path: '$digits'}
stages: [{type: image, column: pixels, format: png, shape: [8, 8, 1]}]
sink: {type: null}"
"$bin" train configs/quickstart.yaml > "$work/train.log" 2>&1 && fail "train ran without torch"
grep -q "torch" "$work/train.log" || { cat "$work/train.log" >&2; fail "train's refusal does not name torch"; }
echo "minimal build: quickstart pipeline ok (1437 rows); kafka, s3, gcs, azure, http, image and train refused naming their features"
