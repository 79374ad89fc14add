#!/usr/bin/env bash
# Hyperparameter search with Optuna's ask/tell CLI driving `sluice train` (docs/sweep.md):
#
#   examples/optuna.sh job.yaml [trials] [storage]
#
# Needs `optuna` and `python3` on PATH (pip install optuna) and `sluice` (or $SLUICE). Each
# trial is one `sluice train` of the job with the asked learning rate as a --set; its final
# held-out accuracy (--metric-json) is told back, a failed run is told as failed. The study
# lives in the storage (SQLite by default), so running the script again adds trials to it.
# A job with `trainer.checkpoint` needs a path per trial: add
# --set "trainer.checkpoint.path=trials/$number.ckpt" below.
set -euo pipefail
job="$1"
trials="${2:-8}"
storage="${3:-sqlite:///optuna-sluice.db}"
sluice="${SLUICE:-sluice}"
study=sluice-lr
space='{"lr": {"name": "FloatDistribution", "attributes": {"low": 0.001, "high": 0.5, "log": true}}}'
field() { python3 -c "import json, sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])$1)"; }

optuna create-study --storage "$storage" --study-name "$study" --direction maximize \
    --skip-if-exists >/dev/null 2>&1
for _ in $(seq "$trials"); do
    asked="$(optuna ask --storage "$storage" --study-name "$study" --search-space "$space" -f json 2>/dev/null)"
    number="$(printf '%s\n' "$asked" | field '["number"]')"
    lr="$(printf '%s\n' "$asked" | field '["params"]["lr"]')"
    if line="$("$sluice" -q train "$job" --set "trainer.optimizer.lr=$lr" --metric-json --no-report --progress never)"; then
        accuracy="$(printf '%s\n' "$line" | field '["eval_accuracy"]')"
        optuna tell --storage "$storage" --study-name "$study" --trial-number "$number" \
            --values "$accuracy" >/dev/null 2>&1
        echo "trial $number: lr $lr -> accuracy $accuracy"
    else
        optuna tell --storage "$storage" --study-name "$study" --trial-number "$number" \
            --state fail >/dev/null 2>&1
        echo "trial $number: lr $lr failed" >&2
    fi
done
optuna best-trial --storage "$storage" --study-name "$study" -f json 2>/dev/null
