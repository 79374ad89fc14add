"""A complete PyTorch training loop on CIFAR-style data (32×32×3 uint8 images, int labels in
Parquet), fed either by Sluice or by the idiomatic `torch.utils.data.DataLoader` — the same
model, the same augmentation (random crop with 4 pixels of padding, horizontal flip,
normalize), the same loop — so the two can be compared line for line and by the numbers.

    # data: `sluice bench images --data /tmp/cifar-like --rows 50000` writes such files
    python examples/python/train_cifar.py --data /tmp/cifar-like --loader sluice
    python examples/python/train_cifar.py --data /tmp/cifar-like --loader dataloader
    # on a GPU, crop/flip/normalize as tensor ops there (uint8 crosses PCIe):
    python examples/python/train_cifar.py --data /tmp/cifar-like --device cuda --augment-on device

With Sluice the decode, shuffle, crop, flip and normalize run in Rust threads outside the
interpreter and each batch arrives as tensors over the pipeline's memory; the loop saves the
data position with the model, so a restarted run continues with exactly the next batch
(`--resume`). Prints one JSON line: samples/s, the time the loop waited for data, the loss.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

MEAN = [0.4914, 0.4822, 0.4465]
STD = [0.2470, 0.2435, 0.2616]


def model() -> torch.nn.Module:
    """A small ResNet-style convolutional net for 32×32 images."""

    def block(cin: int, cout: int) -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False), torch.nn.BatchNorm2d(cout), torch.nn.ReLU()
        )

    return torch.nn.Sequential(
        block(3, 32), torch.nn.MaxPool2d(2), block(32, 64), torch.nn.MaxPool2d(2), block(64, 128),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10),
    )


def sluice_loader(data: str, batch: int, epochs: int, seed: int, device: str = "cpu", augment_on: str = "host",
                  threads: int = 2):
    import sluice.torch

    config = f"""
source: {{type: parquet, path: '{os.path.abspath(data)}/*.parquet', columns: [image, label], epochs: {epochs}}}
stages:
  - {{type: shuffle, buffer_rows: 10000, seed: {seed}}}
  - {{type: batch, size: {batch}}}
  - type: image
    column: image
    shape: [32, 32, 3]
    seed: {seed}
    augment_on: {augment_on}
    ops:
      - random_crop: {{size: [32, 32], padding: 4}}
      - horizontal_flip: {{p: 0.5}}
      - normalize: {{mean: {MEAN}, std: {STD}}}
runtime: {{threads: {threads}}}
"""
    tensors = {"x": {"column": "image", "shape": [3, 32, 32]}, "y": "label"}
    return sluice.torch.Loader(config, batch_tensors=tensors, device=device)


class CifarLike(torch.utils.data.Dataset):
    """The map-style dataset a DataLoader user writes (as torchvision's CIFAR10 does: the
    decoded images in memory, per-sample transforms)."""

    def __init__(self, data: str) -> None:
        tables = [pq.read_table(os.path.join(data, f)) for f in sorted(os.listdir(data)) if f.endswith(".parquet")]
        images = [np.frombuffer(t.column("image").combine_chunks().buffers()[1], np.uint8) for t in tables]
        self.x = np.concatenate(images).reshape(-1, 32, 32, 3)
        self.y = np.concatenate([t.column("label").to_numpy() for t in tables])
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        img = torch.from_numpy(self.x[i]).permute(2, 0, 1).float().div_(255.0)
        img = F.pad(img, (4, 4, 4, 4))
        top, left = torch.randint(0, 9, (2,)).tolist()
        img = img[:, top : top + 32, left : left + 32]
        if torch.rand(1).item() < 0.5:
            img = img.flip(-1)
        return (img - self.mean) / self.std, int(self.y[i])


def dataloader(data: str, batch: int, epochs: int, workers: int, device: str = "cpu"):
    cuda = torch.device(device).type == "cuda"
    loader = torch.utils.data.DataLoader(CifarLike(data), batch_size=batch, shuffle=True, num_workers=workers,
                                         pin_memory=cuda, persistent_workers=workers > 0)
    for _ in range(epochs):
        for x, y in loader:
            yield {"x": x.to(device, non_blocking=cuda), "y": y.to(device, non_blocking=cuda)}


def peak_rss_mib() -> float:
    """Peak resident memory of this process plus its largest finished child (DataLoader workers
    are children), in MiB."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="directory of Parquet files: image (3,072 bytes HWC), label")
    p.add_argument("--loader", choices=["sluice", "dataloader"], default="sluice")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: all epochs)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--checkpoint", help="save model and data position here every 50 steps and at the end")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    p.add_argument("--augment-on", choices=["host", "device"], default="host",
                   help="Sluice: crop, flip and normalize in the pipeline (host) or on --device")
    p.add_argument("--threads", type=int, default=2, help="Sluice's CPU threads")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    net = model().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    if a.loader == "sluice":
        loader = sluice_loader(a.data, a.batch, a.epochs, a.seed, a.device, a.augment_on, a.threads)
        batches = iter(loader)
    else:
        loader, batches = None, dataloader(a.data, a.batch, a.epochs, a.workers, a.device)
    step = 0
    if a.resume:
        saved = torch.load(a.checkpoint, map_location=device)
        net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        step = saved["step"]
        if loader is not None:
            loader.load_state_dict(saved["data"])  # exactly the batch after the saved step

    def save() -> None:
        if a.checkpoint and loader is not None:
            state = {"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step, "data": loader.state_dict()}
            torch.save(state, a.checkpoint)

    start, samples, waited, loss = time.perf_counter(), 0, 0.0, float("nan")
    while a.steps == 0 or step < a.steps:
        t = time.perf_counter()
        batch = next(batches, None)
        waited += time.perf_counter() - t
        if batch is None:
            break
        out = F.cross_entropy(net(batch["x"]), batch["y"])
        opt.zero_grad()
        out.backward()
        opt.step()
        loss, step, samples = out.item(), step + 1, samples + len(batch["y"])
        if step % 50 == 0:
            save()
    save()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    print(json.dumps({"loader": a.loader, "device": str(device), "augment_on": a.augment_on, "steps": step,
                      "samples": samples, "samples_per_s": samples / seconds, "data_wait_s": waited,
                      "data_wait_share": waited / seconds, "peak_rss_mib": peak_rss_mib(), "loss": loss}))


if __name__ == "__main__":
    main()
