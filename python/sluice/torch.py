"""Sluice batches as PyTorch tensors: :class:`Loader`, and :func:`normalize` for images that
leave the pipeline as ``uint8``.

A :class:`Loader` is what a training loop iterates. The pipeline runs in Rust threads and
keeps ``prefetch`` batches ready with the interpreter lock released; each batch becomes named
tensors over the pipeline's own memory (DLPack, no copy), optionally staged in pinned memory
and copied to the GPU without blocking. Rank and world size come from ``torch.distributed``
(or ``RANK``/``WORLD_SIZE``); every rank gets the same number of batches per epoch, so an
all-reduce never waits for a rank that ran out. ``state_dict()``/``load_state_dict()`` resume
exactly, the protocol of torchdata's ``StatefulDataLoader``::

    loader = sluice.torch.Loader("configs/digits-augmented.yaml", device="cuda")
    for step, batch in enumerate(loader):
        loss = F.cross_entropy(model(batch["x"]), batch["y"])
        ...
        if step % 500 == 0:
            torch.save({"model": model.state_dict(), "data": loader.state_dict()}, "ckpt.pt")
    # after a crash: a new Loader, loader.load_state_dict(ckpt["data"]), then the next batch
"""

from __future__ import annotations

import collections
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import torch

from . import Batch, Pipeline

__all__ = ["Loader", "LoaderStats", "TensorSpec", "normalize"]

_DTYPES = {
    "f32": torch.float32,
    "f64": torch.float64,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i64": torch.int64,
    "i32": torch.int32,
    "i16": torch.int16,
    "i8": torch.int8,
    "u8": torch.uint8,
    "bool": torch.bool,
}


@dataclass(frozen=True)
class TensorSpec:
    """Where a tensor comes from: a ``column``, converted to ``dtype`` (``f32``, ``i64``, …,
    or a ``torch.dtype``; default: the column's) and reshaped to ``shape`` per row
    (``[3, 32, 32]``; default: the column's). The same keys as the YAML ``loader.tensors``."""

    column: str
    dtype: torch.dtype | None = None
    shape: tuple[int, ...] | None = None

    @staticmethod
    def of(name: str, spec: str | Mapping[str, Any] | TensorSpec) -> TensorSpec:
        if isinstance(spec, TensorSpec):
            return spec
        if isinstance(spec, str):
            return TensorSpec(spec)
        rust_only = {"pad", "nulls"} & set(spec)
        if rust_only:
            raise ValueError(
                f"tensor `{name}`: {', '.join(sorted(rust_only))} (variable-length lists, null masks) "
                "are the Rust loader's; from Python, give a column of numbers or fixed-size lists without nulls"
            )
        unknown = set(spec) - {"column", "dtype", "shape"}
        if unknown or "column" not in spec:
            raise ValueError(
                f"tensor `{name}`: give a column name or {{column, dtype, shape}}"
                + (f"; unknown keys: {', '.join(sorted(unknown))}" if unknown else "; `column` is missing")
            )
        dtype = spec.get("dtype")
        if isinstance(dtype, str):
            if dtype not in _DTYPES:
                raise ValueError(f"tensor `{name}`: dtype `{dtype}` is not one of {', '.join(_DTYPES)}")
            dtype = _DTYPES[dtype]
        shape = spec.get("shape")
        return TensorSpec(spec["column"], dtype, None if shape is None else tuple(int(d) for d in shape))


@dataclass
class LoaderStats:
    """What the loop waited for data: ``batches`` taken, ``wait_s`` in total, ``last_wait_s``
    for the last batch (the data stall of that step), ``waits`` for the last 10,000 batches,
    and ``ready`` — the share of batches that were already waiting when asked for (≥ 0.99: the
    loader is ahead of the model)."""

    batches: int = 0
    wait_s: float = 0.0
    last_wait_s: float = 0.0
    ready_batches: int = 0
    waits: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=10_000), repr=False)

    @property
    def ready(self) -> float:
        return self.ready_batches / self.batches if self.batches else 1.0


# A batch handed over in less than this was waiting ready (the hand-over itself takes ~10 µs).
_READY_S = 0.0005


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int | None, int | None]:
    if rank is not None or world_size is not None:
        return rank, world_size
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None, None  # the pipeline reads RANK / WORLD_SIZE itself


def _device(device: str | torch.device | None) -> torch.device:
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class Loader:
    """A Sluice pipeline as named torch tensors, one dict per batch.

    ``batch_tensors`` maps tensor names to columns: ``{"x": "image", "y": {"column": "label",
    "dtype": "i64"}}``; default: the config's ``loader.tensors``, else every column as is.
    ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (default: the config's
    ``loader.device``, else auto). ``pin_memory`` (default: on when the device is CUDA) stages
    each batch in page-locked memory so the copy to the GPU runs asynchronously
    (``non_blocking``). ``prefetch``: batches kept ready in Rust threads. ``overrides``,
    ``rank`` and ``world_size`` are :class:`sluice.Pipeline`'s; rank and world size default to
    ``torch.distributed``'s when it is initialized.

    On the CPU, tensors are the pipeline's own memory (no copy) unless a ``dtype`` or ``shape``
    asks for a conversion the layout cannot give as a view. ``stats`` says how long the loop
    waited for data; ``last_batch`` is the last :class:`sluice.Batch` (its lineage), until the
    next is asked for.
    """

    def __init__(
        self,
        config: str | os.PathLike[str],
        *,
        batch_tensors: Mapping[str, str | Mapping[str, Any] | TensorSpec] | None = None,
        device: str | torch.device | None = None,
        prefetch: int | None = None,
        pin_memory: bool | None = None,
        non_blocking: bool = True,
        overrides: Mapping[str, Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        rank, world_size = _rank_world(rank, world_size)
        self.pipeline = Pipeline(config, overrides=overrides, rank=rank, world_size=world_size, prefetch=prefetch)
        section = self.pipeline.loader_section or {}
        specs = batch_tensors if batch_tensors is not None else section.get("tensors")
        self._specs = None if specs is None else {n: TensorSpec.of(n, s) for n, s in specs.items()}
        # The columns the tensors read, settled once rather than per batch.
        self._columns = None if self._specs is None else sorted({s.column for s in self._specs.values()})
        self.device = _device(device if device is not None else section.get("device"))
        if self.device.type == "cuda" and self.device.index is None:
            # Fixed now: a later `torch.cuda.set_device` (DDP sets it per rank) must not move
            # the copies to another device than the side stream's.
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.pin_memory = self.device.type == "cuda" if pin_memory is None else pin_memory
        self.non_blocking = non_blocking
        # Copies (and device-side image ops) run on a side stream, so they overlap with the
        # training step queued on the caller's stream; the caller's stream waits for them
        # by an event when the batch is handed over (see `_tensors`).
        self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.stats = LoaderStats()
        self.last_batch: Batch | None = None
        self._retry: Batch | None = None
        # Columns of `augment_on: device` image stages (their specs), found in the first batch.
        self._images: dict[str, dict[str, Any]] | None = None

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        # The last batch's memory stays alive only through the tensors the caller holds.
        self.last_batch = None
        batch = self._retry
        if batch is None:
            start = time.perf_counter()
            batch = next(self.pipeline)  # StopIteration ends the loop
            waited = time.perf_counter() - start
            s = self.stats
            s.batches += 1
            s.wait_s += waited
            s.last_wait_s = waited
            s.ready_batches += waited < _READY_S
            s.waits.append(waited)
        else:
            self._retry = None
            self.pipeline._inner._forward()
        try:
            tensors = self._tensors(batch)
        except BaseException:
            # Not handed over (Ctrl-C, out of GPU memory during the copy): the next call
            # tries this batch again, and a state_dict() taken meanwhile is the one before it.
            self._retry = batch
            self.pipeline._inner._rewind()
            raise
        self.last_batch = batch
        return tensors

    def _tensors(self, batch: Batch) -> dict[str, torch.Tensor]:
        specs = self._specs
        if self._images is None:
            self._images = _device_images(batch)
            if self._columns is not None:
                wanted = [self._images[c]["index"] for c in self._columns if c in self._images]
                self._columns = sorted(set(self._columns) | set(wanted))
        cpu = batch.to_torch(self._columns)
        if specs is None:
            specs = {name: TensorSpec(name) for name in cpu}
        if self._copy_stream is None:
            return self._convert(cpu, specs)
        consumer = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._copy_stream):
            out = self._convert(cpu, specs)
        consumer.wait_stream(self._copy_stream)
        for t in out.values():
            # Made on the side stream, used on the caller's: the caching allocator must not
            # reuse the memory before the caller's kernels on it are done.
            t.record_stream(consumer)
        return out

    def _convert(self, cpu: dict[str, torch.Tensor], specs: Mapping[str, TensorSpec]) -> dict[str, torch.Tensor]:
        out = {}
        for name, spec in specs.items():
            t = cpu[spec.column]
            image = self._images.get(spec.column)
            if image is not None:
                # uint8 pixels and the drawn indices cross; the ops run where the tensor is.
                t = _device_image(self._move(t), self._move(cpu[image["index"]]), image)
            if spec.shape is not None:
                t = t.reshape((t.shape[0], *spec.shape))
            if spec.dtype is not None and t.dtype != spec.dtype:
                t = t.to(spec.dtype)
            out[name] = t if image is not None else self._move(t)
        return out

    def _move(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cpu":
            if self.pin_memory:
                t = t.pin_memory()
            t = t.to(self.device, non_blocking=self.non_blocking)
        return t

    def state_dict(self) -> dict[str, Any]:
        """The state just past the last batch returned (JSON-serialisable)."""
        return self.pipeline.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from :meth:`state_dict` — before the first batch; refused by name when the
        files or order-deciding settings changed."""
        self.pipeline.load_state_dict(state)


_DEVICE_IMAGE_KEY = b"sluice.image.device"


def _device_images(batch: Batch) -> dict[str, dict[str, Any]]:
    """The image columns of ``augment_on: device`` stages in ``batch``: column → the spec the
    stage stored in the field's metadata."""
    out = {}
    for f in batch.to_arrow().schema:
        meta = f.metadata or {}
        if _DEVICE_IMAGE_KEY in meta:
            out[f.name] = json.loads(meta[_DEVICE_IMAGE_KEY])
    return out


def _device_image(pixels: torch.Tensor, index: torch.Tensor, spec: Mapping[str, Any]) -> torch.Tensor:
    """An ``augment_on: device`` image column as ``[batch, C, H, W]`` images, computed where
    ``pixels`` (``uint8`` HWC rows) and ``index`` (each row's source rows, then columns; -1:
    the fill) are — the Rust loader's ops (``loader/src/device_image.rs``): one gather for
    the crop, flips and padding, the fill, then ``v * scale + bias`` in float32 (a multiply and
    an add, each rounded, as the stage computes; ``dtype: float16`` then rounds it to
    float16) — bit for bit the host stage's output."""
    n = pixels.shape[0]
    h, w, c = spec["shape"]
    oh, ow = spec["out"]
    x = pixels.reshape(n, h, w, c)
    rows, cols = index[:, :oh], index[:, oh:]
    valid = (rows >= 0).view(n, oh, 1, 1) & (cols >= 0).view(n, 1, ow, 1)
    b = torch.arange(n, device=x.device).view(n, 1, 1)
    cut = x[b, rows.clamp(min=0).long().view(n, oh, 1), cols.clamp(min=0).long().view(n, 1, ow)]
    fill, scale, bias = _image_constants(spec, x.device)
    if spec["dtype"] == "uint8":
        out = torch.where(valid, cut, fill)
    else:
        out = torch.where(valid, cut.to(torch.float32), fill) * scale + bias
        if spec["dtype"] == "float16":
            out = out.half()  # rounded to nearest even, as the host stage rounds
    return out.permute(0, 3, 1, 2).contiguous()


def _image_constants(spec: dict[str, Any], device: torch.device) -> tuple[torch.Tensor, ...]:
    """The fill, scale and bias of an image spec as tensors on ``device``, made once (a small
    pageable copy per batch would wait for the GPU's stream)."""
    key = f"_constants_{device}"
    if key not in spec:
        if spec["dtype"] == "uint8":
            # Rounded half away from zero, as the host path rounds its float pass (fill 0–255).
            fill = torch.tensor([math.floor(f + 0.5) for f in spec["fill"]], dtype=torch.uint8)
        else:
            fill = torch.tensor(spec["fill"], dtype=torch.float32)
        scale = torch.tensor(spec["scale"], dtype=torch.float32)
        bias = torch.tensor(spec["bias"], dtype=torch.float32)
        spec[key] = tuple(t.to(device) for t in (fill, scale, bias))
    return spec[key]


def normalize(
    images: torch.Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """uint8 images ``[batch, C, H, W]`` (the ``image`` stage with ``dtype: uint8``) as
    normalized floats, computed where the tensor is — on the GPU after the copy, so a quarter
    of the bytes cross PCIe and the float work runs on the device: ``(x / 255 - mean) / std``,
    per channel, in the stage's own arithmetic. After crops, padding and flips the result is
    bit for bit what the stage's ``normalize`` gives; after a resize or colour op the uint8
    image was rounded to whole pixel values, so it differs by at most half a level
    (0.5 / (255 · std))."""
    if images.dtype != torch.uint8 or images.dim() != 4:
        raise TypeError(f"normalize takes uint8 images [batch, C, H, W], not {images.dtype} {list(images.shape)}")
    channels = images.shape[1]
    if len(mean) != channels or len(std) != channels:
        raise ValueError(f"normalize: give one mean and one std per channel ({channels})")
    if not all(s > 0 and s != float("inf") for s in std):
        raise ValueError(f"normalize: every std must be positive and finite, not {list(std)}")
    # The stage's own arithmetic: scale and bias worked out in double precision, rounded to
    # float32, then one multiply and one add per value in float32 — bitwise its output.
    scale = torch.tensor([1.0 / (255.0 * s) for s in std], dtype=torch.float32, device=images.device)
    bias = torch.tensor([-m / s for m, s in zip(mean, std)], dtype=torch.float32, device=images.device)
    x = images.to(torch.float32) * scale.view(1, -1, 1, 1)
    return (x + bias.view(1, -1, 1, 1)).to(dtype)
