"""Type stubs of the native module `sluice._sluice` (Rust, pyo3). Use the `sluice` package's
own API (`sluice.Pipeline`, `sluice.Batch`, `sluice.torch.Loader`); this layer is what it is
built on."""

from typing import Any, Iterator

__version__: str
__build_profile__: str
"""`"debug"` or `"release"`: how the native module was compiled (`scripts/python.sh` builds a
debug one for the tests; `SLUICE_WHEEL_PROFILE=release` a release one)."""

class SluiceError(Exception):
    """Any error of a Sluice pipeline."""

class ConfigError(SluiceError):
    """The pipeline config has problems; the message lists each as `file:line:column: message`."""

class ResumeError(SluiceError):
    """A saved state does not fit this pipeline; the message names what changed."""

class DataError(SluiceError):
    """Reading or transforming the data failed; the message says where."""

class Batch:
    """A batch of rows (Arrow data, exported through the Arrow PyCapsule interface)."""

    @property
    def num_rows(self) -> int: ...
    @property
    def column_names(self) -> list[str]: ...
    def __len__(self) -> int: ...
    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]: ...
    def lineage(self) -> list[dict[str, Any]]: ...
    def _value_addresses(self) -> list[tuple[str, int]]: ...

class Pipeline:
    """A pipeline, iterated as batches (the interpreter lock released while waiting)."""

    def __init__(
        self,
        config: str,
        *,
        overrides: list[tuple[str, str]] = ...,
        rank: int | None = None,
        world_size: int | None = None,
        prefetch: int | None = None,
    ) -> None: ...
    def __iter__(self) -> Iterator[Batch]: ...
    def __next__(self) -> Batch: ...
    @property
    def loader_section(self) -> str | None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def _rewind(self) -> None: ...
    def _forward(self) -> None: ...
