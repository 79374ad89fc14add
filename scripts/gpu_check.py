"""The GPU checks of Sluice's Python package, run by scripts/gpu-check.sh on a machine with an
NVIDIA GPU (and, as a smoke test, by python/tests/test_examples.py with --device cpu):

1. values: `sluice.torch.Loader` on the GPU with `augment_on: device` (uint8 crosses PCIe;
   crop, flip and normalize run there) equals, bit for bit, the CPU loader with the crop,
   flip and normalize done in the pipeline (`augment_on: host`), for float32 and float16
   output;
2. the copy: bytes per batch and the host-to-device copy time of a uint8 batch and of its
   float32 equivalent, timed by CUDA events, and whether the staged batch is pinned;
3. training: examples/python/train_cifar.py's ResNet-style model on CIFAR-style data, fed by
   Sluice (augmentation on the device, then on the host) and by torch's DataLoader with the
   same number of CPU workers — images/s, the share of time the loop waited for data, data
   readiness, peak host RSS and the GPU's utilisation (nvidia-smi, when present).

Prints a table and writes everything as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "examples/python/train_cifar.py"
MEAN = [0.4914, 0.4822, 0.4465]
STD = [0.2470, 0.2435, 0.2616]


def cifar_like(directory: Path, rows: int, files: int = 8) -> None:
    """CIFAR-style Parquet as a dataset writer leaves it: zstd, 3 row groups per file."""
    rng = np.random.default_rng(0)
    per_file = rows // files
    for f in range(files):
        images = rng.integers(0, 256, (per_file, 3072), dtype=np.uint8)
        table = pa.table({
            "image": pa.FixedSizeBinaryArray.from_buffers(pa.binary(3072), per_file, [None, pa.py_buffer(images.tobytes())]),
            "label": pa.array(rng.integers(0, 10, per_file), pa.int64()),
        })
        pq.write_table(table, directory / f"train-{f:03}.parquet", row_group_size=-(-per_file // 3), compression="zstd")


def config(data: Path, augment_on: str, threads: int, dtype: str = "float32") -> str:
    return f"""
source: {{type: parquet, path: '{data}/*.parquet', columns: [image, label]}}
stages:
  - {{type: shuffle, buffer_rows: 10000, seed: 1}}
  - {{type: batch, size: 256}}
  - {{type: image, column: image, shape: [32, 32, 3], seed: 1, augment_on: {augment_on}, dtype: {dtype},
     ops: [{{random_crop: {{size: [32, 32], padding: 4}}}}, {{horizontal_flip: {{p: 0.5}}}},
           {{normalize: {{mean: {MEAN}, std: {STD}}}}}]}}
runtime: {{threads: {threads}}}
"""


def check_values(data: Path, device: str, threads: int, batches: int = 20) -> dict:
    import sluice.torch as st

    tensors = {"x": {"column": "image", "shape": [3, 32, 32]}, "y": "label"}
    out = {"batches_compared": 0, "batches_equal": 0}
    for dtype in ("float32", "float16"):
        on_device = st.Loader(config(data, "device", threads, dtype), batch_tensors=tensors, device=device)
        on_host = st.Loader(config(data, "host", threads, dtype), batch_tensors=tensors, device="cpu")
        compared = equal = 0
        for _, (d, h) in zip(range(batches), zip(on_device, on_host)):
            assert d["x"].device.type == torch.device(device).type
            assert d["x"].dtype == h["x"].dtype == (torch.float16 if dtype == "float16" else torch.float32)
            compared += 1
            # Bits, not values: +0 and -0 differ.
            same = torch.equal(d["x"].cpu().view(torch.int16 if dtype == "float16" else torch.int32),
                               h["x"].view(torch.int16 if dtype == "float16" else torch.int32))
            equal += same and torch.equal(d["y"].cpu(), h["y"])
        out[dtype] = {"batches_compared": compared, "batches_equal": equal}
        out["batches_compared"] += compared
        out["batches_equal"] += equal
    return out


def check_copy(device: str) -> dict:
    """A 256-image batch as uint8 and as float32: bytes, and copy time by CUDA events."""
    out = {"uint8_bytes": 256 * 3072, "float32_bytes": 256 * 3072 * 4}
    if torch.device(device).type != "cuda":
        return out
    for name, t in (("uint8", torch.zeros(256, 3072, dtype=torch.uint8)), ("float32", torch.zeros(256, 3072))):
        pinned = t.pin_memory()
        out[f"{name}_pinned"] = pinned.is_pinned()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(20):
            start.record()
            pinned.to(device, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        out[f"{name}_copy_ms"] = sorted(times)[len(times) // 2]
    return out


def check_overlap(device: str) -> dict:
    """Copy/compute overlap as the loaders run it: a pinned 64 MiB copy on a side stream while
    matmuls run on the current stream. ``overlap`` is the share of the copy's time hidden
    under the compute (1 = fully hidden, 0 = serialised), from CUDA event timings."""
    if torch.device(device).type != "cuda":
        return {}
    host = torch.zeros(64 << 20, dtype=torch.uint8).pin_memory()
    a = torch.randn(4096, 4096, device=device)
    side = torch.cuda.Stream(device)
    current = torch.cuda.current_stream(device)

    def timed(compute: bool, copy: bool) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record(current)
        side.wait_stream(current)
        if copy:
            with torch.cuda.stream(side):
                host.to(device, non_blocking=True)
        if compute:
            for _ in range(8):
                a @ a
        current.wait_stream(side)
        end.record(current)
        end.synchronize()
        return start.elapsed_time(end)

    def median(compute: bool, copy: bool) -> float:
        return sorted(timed(compute, copy) for _ in range(7))[3]

    timed(True, True)  # warm-up: cuBLAS handles, the allocator
    compute_ms, copy_ms, both_ms = median(True, False), median(False, True), median(True, True)
    hidden = (compute_ms + copy_ms - both_ms) / copy_ms if copy_ms > 0 else 0.0
    return {"compute_ms": compute_ms, "copy_ms": copy_ms, "both_ms": both_ms,
            "overlap": max(0.0, min(1.0, hidden))}


def gpu_utilisation(run) -> tuple[dict, float | None]:
    """Runs `run()` while nvidia-smi samples the GPU's utilisation; returns its result and the
    mean utilisation (None without nvidia-smi)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return run(), None
    with tempfile.TemporaryFile("w+") as log:
        sampler = subprocess.Popen([smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"],
                                   stdout=log, stderr=subprocess.DEVNULL)
        try:
            result = run()
        finally:
            sampler.terminate()
            sampler.wait()
        log.seek(0)
        values = [float(v) for v in log.read().split() if v.strip().replace(".", "").isdigit()]
    return result, (sum(values) / len(values) if values else None)


def train(data: Path, device: str, steps: int, loader: str, workers: int, augment_on: str = "host") -> dict:
    args = [sys.executable, str(TRAIN), "--data", str(data), "--device", device, "--steps", str(steps),
            "--loader", loader, "--workers", str(workers), "--threads", str(workers), "--augment-on", augment_on,
            "--epochs", "100"]

    def run() -> dict:
        out = subprocess.run(args, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(args)} failed:\n{out.stderr}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    result, util = gpu_utilisation(run)
    result["gpu_util_pct"] = util
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--rows", type=int, default=50_000, help="CIFAR-style images to generate")
    p.add_argument("--steps", type=int, default=300, help="training steps per loader")
    p.add_argument("--workers", type=int, default=0, help="loader CPU workers (default: 40%% of the cores)")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for gpu-check.json")
    a = p.parse_args()
    workers = a.workers or max(1, int(0.4 * (os.cpu_count() or 1)))
    report = {"device": a.device, "torch": torch.__version__, "workers": workers, "cores": os.cpu_count()}
    if torch.device(a.device).type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(a.device)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        t = time.perf_counter()
        cifar_like(data, a.rows)
        report["data_s"] = time.perf_counter() - t
        report["values"] = check_values(data, a.device, workers)
        report["copy"] = check_copy(a.device)
        report["overlap"] = check_overlap(a.device)
        report["train"] = [
            train(data, a.device, a.steps, "sluice", workers, "device"),
            train(data, a.device, a.steps, "sluice", workers, "host"),
            train(data, a.device, a.steps, "dataloader", workers),
        ]
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "gpu-check.json").write_text(json.dumps(report, indent=2))
    v = report["values"]
    print(f"values: {v['batches_equal']}/{v['batches_compared']} batches equal (GPU augmentation vs the CPU stage)")
    print(f"copy: {report['copy']}")
    print(f"overlap (side-stream copy under compute): {report['overlap']}")
    print(f"{'loader':<22}{'images/s':>10}{'wait %':>8}{'RSS MiB':>9}{'GPU %':>7}")
    for r in report["train"]:
        name = r["loader"] + (f" ({r['augment_on']})" if r["loader"] == "sluice" else "")
        util = "-" if r["gpu_util_pct"] is None else f"{r['gpu_util_pct']:.0f}"
        print(f"{name:<22}{r['samples_per_s']:>10.0f}{100 * r['data_wait_share']:>8.1f}{r['peak_rss_mib']:>9.0f}{util:>7}")
    if v["batches_equal"] != v["batches_compared"]:
        raise SystemExit("the device augmentation differs from the CPU stage")


if __name__ == "__main__":
    main()
