"""Sluice from Python: a Sluice pipeline as an iterator of batches.

The pipeline runs in Rust on its own threads (I/O, then decoding and stages on a bounded CPU
pool) and reads ahead while Python works; each batch arrives as Arrow data without a copy,
and ``to_numpy()`` keeps it that way wherever the layout allows. ``state_dict()`` /
``load_state_dict()`` resume a pipeline exactly — in another process, after a crash — with
the batch after the last one taken::

    import sluice
    pipe = sluice.Pipeline("configs/quickstart.yaml")
    for batch in pipe:
        arrays = batch.to_numpy()          # {"column": numpy array}, zero-copy
        ...
        saved = pipe.state_dict()          # JSON-serialisable
    # later, anywhere:
    pipe = sluice.Pipeline("configs/quickstart.yaml")
    pipe.load_state_dict(saved)            # continues with exactly the next batch
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from . import _sluice
from ._sluice import ConfigError, DataError, ResumeError, SluiceError, __version__

if TYPE_CHECKING:
    import torch as _torch

__all__ = [
    "Batch",
    "ConfigError",
    "DataError",
    "Pipeline",
    "ResumeError",
    "SluiceError",
    "__version__",
]


class Batch:
    """A batch of rows: Arrow data, and the lineage of every row."""

    __slots__ = ("_raw", "_arrow")

    def __init__(self, raw: _sluice.Batch) -> None:
        self._raw = raw
        self._arrow: pa.RecordBatch | None = None

    @property
    def num_rows(self) -> int:
        """Rows in the batch."""
        return self._raw.num_rows

    def __len__(self) -> int:
        return self._raw.num_rows

    @property
    def column_names(self) -> list[str]:
        """Column names, in order."""
        return self._raw.column_names

    def to_arrow(self) -> pa.RecordBatch:
        """The batch as a ``pyarrow.RecordBatch`` over the buffers the pipeline filled
        (the Arrow C data interface: nothing is copied)."""
        if self._arrow is None:
            self._arrow = pa.record_batch(self._raw)
        return self._arrow

    def to_numpy(self) -> dict[str, np.ndarray]:
        """Each column as a numpy array, zero-copy where the layout allows: numbers without
        nulls, and fixed-size lists of them (``float32[784]`` → shape ``(rows, 784)``,
        nested lists → more dimensions). Other columns (text, nulls, variable-length
        lists, booleans) are converted with pyarrow's ``to_numpy`` (a copy). Zero-copy
        arrays are read-only views that keep the batch's memory alive."""
        data = self.to_arrow()
        return {name: _to_numpy(data.column(i)) for i, name in enumerate(data.schema.names)}

    def to_torch(self, columns: Sequence[str] | None = None) -> dict[str, _torch.Tensor]:
        """Each column (or those in ``columns``) as a CPU ``torch.Tensor`` over the batch's own
        memory (DLPack: nothing is copied): numbers without nulls, and fixed-size lists of
        them (``float32[3072]`` → shape ``(rows, 3072)``). DLPack has no read-only flag: the
        tensors are writable, and an in-place op (``x.sub_()``) changes the batch's own memory
        — which nothing else reads once the batch is handed out. Booleans are copied (Arrow
        packs them in bits). Other columns (text, nulls, variable-length lists) raise
        ``TypeError``: leave them out with ``columns``. Torch is imported here, so the rest
        of Sluice works without it."""
        import torch

        data = self.to_arrow()
        names = data.schema.names if columns is None else list(columns)
        out = {}
        for name in names:
            index = data.schema.get_field_index(name)
            if index < 0:
                raise KeyError(f"no column `{name}` in the batch; there are: {', '.join(data.schema.names)}")
            out[name] = _to_torch(torch, data.column(index), name)
        return out

    def lineage(self) -> list[dict[str, Any]]:
        """Where the rows came from, in order: runs of consecutive rows, each
        ``{"origin", "first", "len", "epoch"}`` plus ``url``/``row_group`` (Parquet) or
        ``topic``/``partition`` (Kafka)."""
        return self._raw.lineage()

    def __repr__(self) -> str:
        return f"sluice.Batch({self.num_rows} rows: {', '.join(self.column_names)})"


def _to_numpy(column: pa.Array) -> np.ndarray:
    shape = [len(column)]
    values = column
    while pa.types.is_fixed_size_list(values.type) and values.null_count == 0:
        size = values.type.list_size  # the child values of these rows, as in _to_torch
        shape.append(size)
        values = values.values.slice(values.offset * size, len(values) * size)
    is_number = pa.types.is_integer(values.type) or pa.types.is_floating(values.type)
    if is_number and values.null_count == 0:
        return values.to_numpy(zero_copy_only=True).reshape(shape)
    if len(shape) > 1:
        return values.to_numpy(zero_copy_only=False).reshape(shape)
    return column.to_numpy(zero_copy_only=False)


def _to_torch(torch: Any, column: pa.Array, name: str) -> _torch.Tensor:
    shape = [len(column)]
    values = column
    while pa.types.is_fixed_size_list(values.type) and values.null_count == 0:
        # The child values of these rows: what `flatten()` gives, without its compute call
        # (measured: ~100 µs of a 256-image batch's hand-over in a training loop).
        size = values.type.list_size
        shape.append(size)
        values = values.values.slice(values.offset * size, len(values) * size)
    if values.null_count:
        raise TypeError(
            f"column `{name}` has nulls, which a tensor cannot hold: fill them in the pipeline "
            "or leave the column out (columns=[...])"
        )
    if pa.types.is_boolean(values.type):
        return torch.from_numpy(values.to_numpy(zero_copy_only=False)).reshape(shape)
    if pa.types.is_integer(values.type) or pa.types.is_floating(values.type):
        return torch.from_dlpack(values).reshape(shape)
    raise TypeError(
        f"column `{name}` is {column.type}, which has no tensor type: leave it out (columns=[...]) "
        "or turn it into numbers in the pipeline"
    )


def _overrides(overrides: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    # JSON is YAML: every JSON-serialisable value is a setting's value.
    return [(str(k), json.dumps(v)) for k, v in (overrides or {}).items()]


class Pipeline:
    """A Sluice pipeline, iterated as :class:`Batch` objects.

    ``config`` is a path to a pipeline YAML file (relative paths in it resolve against its
    directory) or the YAML text itself. ``rank``/``world_size`` override ``runtime.rank`` /
    ``world_size`` and the environment (``RANK``, ``WORLD_SIZE``, …): each rank reads its own
    share, every rank the same number of batches per epoch. ``overrides`` sets values on top
    of the file, by path: ``{"stages[0].seed": 3, "source.path": "s3://bucket/*.parquet"}``
    (a path that is not in the file, or a value a setting refuses, raises
    :class:`ConfigError` naming it). ``prefetch``: batches the pipeline keeps ready ahead of
    Python, in Rust threads (at most 64; default: the config's ``loader.prefetch``, else 2).

    Problems raise :class:`ConfigError` (every problem of the file at once, each
    ``file:line:column: message``), :class:`ResumeError` or :class:`DataError`, with the
    messages of the ``sluice`` command. Ctrl-C while waiting for a batch raises
    ``KeyboardInterrupt``.
    """

    def __init__(
        self,
        config: str | os.PathLike[str],
        *,
        overrides: Mapping[str, Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        prefetch: int | None = None,
    ) -> None:
        self._inner = _sluice.Pipeline(
            os.fspath(config),
            overrides=_overrides(overrides),
            rank=rank,
            world_size=world_size,
            prefetch=prefetch,
        )

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        return Batch(next(self._inner))

    def state_dict(self) -> dict[str, Any]:
        """The state just past the last batch returned: a JSON-serialisable dict (save it
        with ``json``, ``torch.save`` or a trainer's checkpoint)."""
        return self._inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a :meth:`state_dict` — before the first batch only. A state taken
        under other files or order-deciding settings is refused with :class:`ResumeError`
        naming what changed, never continued at other rows."""
        self._inner.load_state_dict(state)

    @property
    def loader_section(self) -> dict[str, Any] | None:
        """The config's ``loader:`` section (``tensors``, ``device``, ``prefetch``), if any."""
        text = self._inner.loader_section
        return None if text is None else json.loads(text)


def __getattr__(name: str) -> Any:
    # `sluice.torch` on first use: `import sluice` never imports torch.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'sluice' has no attribute {name!r}")
