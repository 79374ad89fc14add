"""The Python peers of `sluice bench`: the same workload on the same Parquet files, written
the way PyTorch users write it.

- `dataloader`: the idiomatic `torch.utils.data.DataLoader` — a map-style dataset holding the
  decoded column in memory (as torchvision's CIFAR10 does), per-sample transforms in torch
  (torchvision-style: pad + random crop, horizontal flip, normalize; or standardize + Gaussian
  noise), `shuffle=True`, `num_workers=2`, default collate into batches.
- `python`: the `sluice` variant's own pipeline through the Python package
  (`sluice.torch.Loader`), batches taken as torch tensors in a Python loop.
- `numpy`: one process, row groups read with pyarrow, a 10k-row (images) / 100k-row (tabular)
  shuffle buffer, the transforms vectorised over whole batches in numpy, `torch.from_numpy`
  (zero-copy) when torch is installed, else the contiguous numpy batch itself.

Prints one JSON line: rows, seconds, CPU seconds (the process and its workers), peak RSS
(MiB; main process plus the largest worker times the number of workers — an upper estimate
of the sum), and the RSS before loading (MiB; the interpreter with numpy, pyarrow and torch
imported).

Run by `sluice bench`; never needed by Sluice itself.
"""

import argparse
import glob
import json
import os
import resource
import time

import numpy as np
import pyarrow.parquet as pq

try:  # the DataLoader peer needs torch; the numpy peer hands out numpy arrays without it
    import torch
except ImportError:
    torch = None

MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


def files(data):
    return sorted(glob.glob(os.path.join(data, "*.parquet")))


def load_column(data, workload):
    """The whole feature column as one numpy array (and the labels)."""
    xs, ys = [], []
    for f in files(data):
        t = pq.read_table(f)
        col = t.column("image" if workload == "images" else "x").combine_chunks()
        if workload == "images":
            buf = col.buffers()[1]
            xs.append(np.frombuffer(buf, dtype=np.uint8, count=len(col) * 3072).reshape(-1, 32, 32, 3))
        else:
            values = col.flatten().to_numpy(zero_copy_only=False)
            xs.append(values.reshape(-1, 128))
        ys.append(t.column("label").to_numpy())
    return np.concatenate(xs), np.concatenate(ys)


def as_tensor(a):
    return torch.from_numpy(a) if torch is not None else a


class Images:
    def __init__(self, data):
        self.x, self.y = load_column(data, "images")
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        img = torch.from_numpy(self.x[i]).permute(2, 0, 1).float().div_(255.0)  # ToTensor
        img = torch.nn.functional.pad(img, (4, 4, 4, 4))  # RandomCrop(32, padding=4)
        top, left = torch.randint(0, 9, (2,)).tolist()
        img = img[:, top : top + 32, left : left + 32]
        if torch.rand(1).item() < 0.5:  # RandomHorizontalFlip
            img = img.flip(-1)
        img = (img - self.mean) / self.std  # Normalize
        return img, int(self.y[i])


class Tabular:
    def __init__(self, data):
        self.x, self.y = load_column(data, "tabular")

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = torch.from_numpy(self.x[i])
        x = (x - 0.5) / 0.29
        x = x + 0.1 * torch.randn(128)
        return x, int(self.y[i])


def dataloader(data, workload, batch):
    ds = Images(data) if workload == "images" else Tabular(data)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=2)
    rows = 0
    for x, y in loader:
        rows += x.shape[0]
    return rows


def numpy_variant(data, workload, batch, buffer_rows):
    rng = np.random.default_rng(1)
    rows = 0
    held_x, held_y, held = [], [], 0

    def emit(x, y):
        nonlocal rows
        perm = rng.permutation(len(y))
        x, y = x[perm], y[perm]
        for s in range(0, len(y), batch):
            xb = x[s : s + batch]
            if workload == "images":
                n = len(xb)
                f = xb.astype(np.float32) / 255.0
                padded = np.zeros((n, 40, 40, 3), dtype=np.float32)
                padded[:, 4:36, 4:36] = f
                tops = rng.integers(0, 9, n)
                lefts = rng.integers(0, 9, n)
                idx_r = tops[:, None] + np.arange(32)[None, :]
                idx_c = lefts[:, None] + np.arange(32)[None, :]
                out = padded[np.arange(n)[:, None, None], idx_r[:, :, None], idx_c[:, None, :]]
                flip = rng.random(n) < 0.5
                out[flip] = out[flip, :, ::-1]
                out = (out - MEAN) / STD
                t = as_tensor(np.ascontiguousarray(out.transpose(0, 3, 1, 2)))
            else:
                out = (xb - 0.5) / 0.29 + 0.1 * rng.standard_normal(xb.shape, dtype=np.float32)
                t = as_tensor(out.astype(np.float32, copy=False))
            as_tensor(y[s : s + batch])
            rows += t.shape[0]

    order = rng.permutation(sum(pq.ParquetFile(f).num_row_groups for f in files(data)))
    groups = [(f, g) for f in files(data) for g in range(pq.ParquetFile(f).num_row_groups)]
    opened = {}
    for k in order:
        f, g = groups[k]
        pf = opened.setdefault(f, pq.ParquetFile(f))
        t = pf.read_row_group(g)
        col = t.column("image" if workload == "images" else "x").combine_chunks()
        if workload == "images":
            x = np.frombuffer(col.buffers()[1], dtype=np.uint8, count=len(col) * 3072).reshape(-1, 32, 32, 3)
        else:
            x = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, 128)
        held_x.append(x)
        held_y.append(t.column("label").to_numpy())
        held += len(x)
        if held >= buffer_rows:
            emit(np.concatenate(held_x), np.concatenate(held_y))
            held_x, held_y, held = [], [], 0
    if held:
        emit(np.concatenate(held_x), np.concatenate(held_y))
    return rows


def rss_mib():
    """This process's resident memory now (`VmRSS`), or None where /proc has none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def cpu_seconds():
    """User + system CPU time of this process and its finished children (DataLoader workers
    are joined, hence counted, when their iterator ends)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def sluice_loader(config, workload):
    """The `sluice` variant's pipeline through the Python package, as a training loop takes
    it: named torch tensors per batch (zero-copy over the pipeline's buffers). Made before
    the clock starts, as the Rust row's pipeline is (the files are opened on the first batch,
    inside the measurement: the Rust row prepares them before)."""
    import sluice.torch

    shape = {"images": {"x": {"column": "image", "shape": [3, 32, 32]}, "y": "label"},
             "tabular": {"x": "x", "y": "label"}}[workload]
    return sluice.torch.Loader(config, batch_tensors=shape, device="cpu")


def sluice_from_python(loader):
    rows = 0
    for batch in loader:
        rows += batch["x"].shape[0]
        del batch  # like the Rust row's loop, which drops each batch before the next
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--workload", choices=["images", "tabular"], required=True)
    p.add_argument("--variant", choices=["dataloader", "numpy", "python"], required=True)
    p.add_argument("--config", help="the Sluice pipeline (the python variant)")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--buffer-rows", type=int, required=True)
    a = p.parse_args()
    if torch is not None:
        torch.set_num_threads(1)
    elif a.variant == "dataloader":
        raise SystemExit("torch is not installed (scripts/python-peers.sh --with-torch)")
    if a.variant == "python":
        import sluice.torch  # noqa: F401 — loaded before the start RSS, as torch is
    start_rss = rss_mib()
    loader = sluice_loader(a.config, a.workload) if a.variant == "python" else None
    start = time.perf_counter()
    cpu_start = cpu_seconds()
    if a.variant == "python":
        rows = sluice_from_python(loader)
        workers = 0
    elif a.variant == "dataloader":
        rows = dataloader(a.data, a.workload, a.batch)
        workers = 2
    else:
        rows = numpy_variant(a.data, a.workload, a.batch, a.buffer_rows)
        workers = 0
    seconds = time.perf_counter() - start
    cpu = cpu_seconds() - cpu_start
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    print(json.dumps({"rows": rows, "seconds": seconds, "peak_rss_mib": own + workers * child,
                      "start_rss_mib": start_rss, "cpu_seconds": cpu}))


if __name__ == "__main__":
    main()
