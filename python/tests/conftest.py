"""What the tests share: the repository, the `sluice` binary (the Rust side the Python
package is compared with), and running Python code in a fresh interpreter."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sluice

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def sluice_bin() -> Path:
    path = Path(os.environ.get("SLUICE_BIN", REPO / "target" / "debug" / "sluice"))
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: build it (cargo build) or set SLUICE_BIN")
    return path


def run_cli(sluice_bin: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The `sluice` command, as a user runs it."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("RUST_LOG", None)
    return subprocess.run([str(sluice_bin), *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=600)


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    """`code` in a new interpreter (a crash there cannot take the test run down)."""
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def read_parts(path: Path) -> pa.Table:
    """A Parquet file, or a directory of part files in name order, as one table."""
    files = sorted(path.glob("part-*.parquet")) if path.is_dir() else [path]
    assert files, f"no output under {path}"
    return pa.concat_tables([pq.read_table(f) for f in files])


def reuse_freed_memory(convert) -> None:
    """Collects what is garbage, then runs another pipeline through `convert` (`to_numpy`,
    `to_torch`): memory freed under an array still in use would be reused by its buffers."""
    gc.collect()
    for other in sluice.Pipeline(REPO / "configs/digits-augmented.yaml"):
        convert(other)
