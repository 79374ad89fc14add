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
    import torch

    a, b = torch.load(tmp_path / "whole.pt"), torch.load(ckpt)
    assert a["data"] == b["data"]
    for name, value in a["model"].items():
        assert torch.equal(value, b["model"][name]), name
