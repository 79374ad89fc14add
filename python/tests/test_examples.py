"""examples/python/train_cifar.py, as its docstring tells a user to run it, on a small
CIFAR-style dataset: both loaders train, and a run stopped at step 2 and resumed from its
checkpoint ends with the uninterrupted run's model (the same batches, in the same order)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from conftest import REPO

SCRIPT = REPO / "examples/python/train_cifar.py"


def cifar_like(directory, rows_per_file=300, files=2):
    rng = np.random.default_rng(0)
    for f in range(files):
        images = rng.integers(0, 256, (rows_per_file, 3072), dtype=np.uint8)
        table = pa.table({
            "image": pa.FixedSizeBinaryArray.from_buffers(pa.binary(3072), rows_per_file, [None, pa.py_buffer(images.tobytes())]),
            "label": pa.array(rng.integers(0, 10, rows_per_file), pa.int64()),
        })
        pq.write_table(table, directory / f"train-{f:03}.parquet", row_group_size=100)


def train(*args: str) -> dict:
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_example_trains_with_both_loaders_and_resumes_exactly(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    cifar_like(data)
    common = ["--data", str(data), "--batch", "32", "--seed", "3"]
    with_dataloader = train(*common, "--loader", "dataloader", "--workers", "0", "--steps", "3")
    assert with_dataloader["steps"] == 3 and with_dataloader["samples"] == 96
    whole = train(*common, "--loader", "sluice", "--steps", "4", "--checkpoint", str(tmp_path / "whole.pt"))
    assert whole["steps"] == 4 and whole["samples"] == 128 and np.isfinite(whole["loss"])
    ckpt = str(tmp_path / "ckpt.pt")
    first = train(*common, "--loader", "sluice", "--steps", "2", "--checkpoint", ckpt)
    assert first["steps"] == 2
    resumed = train(*common, "--loader", "sluice", "--steps", "4", "--checkpoint", ckpt, "--resume")
    assert resumed["steps"] == 4 and resumed["samples"] == 64  # the two steps after the saved one
    assert resumed["loss"] == whole["loss"]
    # The same run with crop, flip and normalize as tensor ops after the loader: same batches.
    on_device = train(*common, "--loader", "sluice", "--steps", "4", "--augment-on", "device")
    assert on_device["loss"] == whole["loss"] and on_device["data_wait_share"] <= 1.0
    import torch

    a, b = torch.load(tmp_path / "whole.pt"), torch.load(ckpt)
    assert a["data"] == b["data"]
    for name, value in a["model"].items():
        assert torch.equal(value, b["model"][name]), name


def test_the_gpu_check_script_runs_on_the_cpu(tmp_path):
    """scripts/gpu_check.py (what scripts/gpu-check.sh runs on a GPU machine), small and on the
    CPU: the device augmentation equals the host stage, and all three loaders train."""
    script = REPO / "scripts/gpu_check.py"
    args = ["--device", "cpu", "--rows", "1600", "--steps", "2", "--workers", "1", "--out", str(tmp_path)]
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    values = report["values"]
    assert values["batches_compared"] >= 6 and values["batches_equal"] == values["batches_compared"]
    assert [(r["loader"], r["augment_on"], r["steps"]) for r in report["train"]] == [
        ("sluice", "device", 2), ("sluice", "host", 2), ("dataloader", "host", 2)
    ]
