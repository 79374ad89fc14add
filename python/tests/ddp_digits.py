"""One rank of the two-process DDP test: the digits MLP written in PyTorch, fed by
`sluice.torch.Loader` (rank and world size from torch.distributed, gloo on the CPU).

    python ddp_digits.py CONFIG TEST_PARQUET OUT_JSON     (RANK, WORLD_SIZE, MASTER_* set)

Writes what the test checks: the batches this rank took, the ids it saw per epoch, and the
held-out accuracy of the trained model (the same on every rank: DDP keeps them equal)."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import sluice
import sluice.torch as st

MEAN, STD = 4.88, 6.02  # of the digits' pixel values (0..16)


def main() -> None:
    config, test_path, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    # From here on rank and world size come only from torch.distributed (the pipeline would
    # read RANK / WORLD_SIZE itself): the Loader must take them from there.
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = st.Loader(config, batch_tensors={"x": "pixels", "y": "label", "id": "id"})
    seen: dict[int, list[int]] = {}
    for batch in loader:
        loss = F.cross_entropy(model(batch["x"]), batch["y"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        ids = batch["id"].tolist()
        at = 0
        for span in loader.last_batch.lineage():
            seen.setdefault(span["epoch"], []).extend(ids[at : at + span["len"]])
            at += span["len"]
    # Held-out accuracy, the test split read by a Sluice pipeline with the same scaling.
    test = sluice.Pipeline(
        f"source: {{type: parquet, path: '{test_path}'}}\n"
        "stages:\n  - {type: cast, columns: {pixels: float32}}\n"
        f"  - {{type: standardize, columns: [pixels], mean: {MEAN}, std: {STD}}}\n"
    )
    right = total = 0
    with torch.no_grad():
        for b in test:
            t = b.to_torch(["pixels", "label"])
            right += int((model(t["pixels"]).argmax(1) == t["label"]).sum())
            total += len(t["label"])
    json.dump(
        {
            "rank": dist.get_rank(),
            "batches": loader.stats.batches,
            "seen": {str(e): ids for e, ids in seen.items()},
            "accuracy": right / total,
            "wait_s": loader.stats.wait_s,
        },
        open(out, "w"),
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
