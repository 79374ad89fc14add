"""Two-process DDP (gloo, CPU) through `sluice.torch.Loader`: the digits MLP written in
PyTorch reaches ≥ 95% held-out accuracy, both ranks take the same number of batches, and each
epoch's rows over both ranks are the training set exactly once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pyarrow.parquet as pq

from conftest import REPO

EPOCHS = 12


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_ddp_trains_the_digits_mlp(tmp_path):
    # 1,436 of the 1,437 rows: an even count, so two equal shares hold every row (with an
    # odd count `shard: redistribute` leaves one row of each epoch out, and says so).
    train = pq.read_table(REPO / "data/digits/train.parquet").slice(0, 1436)
    pq.write_table(train, tmp_path / "train.parquet", row_group_size=512)
    config = tmp_path / "ddp.yaml"
    config.write_text(
        f"source: {{type: parquet, path: train.parquet, columns: [id, label, pixels], epochs: {EPOCHS}}}\n"
        "stages:\n"
        "  - {type: shuffle, buffer_rows: 512, seed: 5}\n"
        "  - {type: cast, columns: {pixels: float32}}\n"
        "  - {type: standardize, columns: [pixels], mean: 4.88, std: 6.02}\n"
        "  - {type: batch, size: 32}\n"
    )
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env.pop("RUST_LOG", None)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(REPO / "python/tests/ddp_digits.py"), str(config),
                 str(REPO / "data/digits/test.parquet"), str(tmp_path / f"rank{rank}.json")],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
        )
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["batches"] == ranks[1]["batches"] > 0
    everything = sorted(train.column("id").to_pylist())
    for epoch in range(EPOCHS):
        shares = [r["seen"].get(str(epoch), []) for r in ranks]
        assert len(shares[0]) == len(shares[1]) == len(everything) // 2, epoch
        assert sorted(shares[0] + shares[1]) == everything, f"epoch {epoch}: not every row exactly once"
    assert set(ranks[0]["seen"]) == {str(e) for e in range(EPOCHS)}
    assert ranks[0]["accuracy"] == ranks[1]["accuracy"]
    assert ranks[0]["accuracy"] >= 0.95, ranks[0]["accuracy"]
    print(f"held-out accuracy {ranks[0]['accuracy']:.4f}, {ranks[0]['batches']} batches per rank")
