"""The Python package against the `sluice` command on the same configs: the same rows in the
same order, zero-copy hand-over, exact resume in a new process, and the CLI's errors."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sluice
from conftest import REPO, read_parts, reuse_freed_memory, run_cli, run_python


def table_of(pipe: sluice.Pipeline) -> tuple[pa.Table, int]:
    batches = [b.to_arrow() for b in pipe]
    return pa.Table.from_batches(batches), len(batches)


@pytest.mark.parametrize(
    "config, output",
    [
        ("configs/quickstart.yaml", "digits-train.parquet"),
        ("configs/digits-augmented.yaml", "parts"),
    ],
)
def test_python_iterates_the_rows_sluice_run_writes(tmp_path, sluice_bin, config, output):
    out = run_cli(sluice_bin, "run", config, "--no-report", env={"SLUICE_OUT_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    expected = read_parts(tmp_path / output)
    got, batches = table_of(sluice.Pipeline(REPO / config))
    assert got.num_rows == expected.num_rows > 0
    # The same columns and types (metadata aside), and row i of the run's output is row i of
    # the Python stream, bit for bit.
    assert got.schema.remove_metadata().equals(expected.schema.remove_metadata()), (got.schema, expected.schema)
    assert got.replace_schema_metadata(None).equals(expected.replace_schema_metadata(None))
    assert batches >= 2


def test_numpy_arrays_are_the_pipeline_s_buffers_and_outlive_the_batch():
    pipe = sluice.Pipeline(REPO / "configs/quickstart.yaml")
    next(pipe)
    batch = next(pipe)  # a batch from the middle of the stream
    arrays = batch.to_numpy()
    assert arrays["pixels"].shape == (64, 64) and arrays["pixels"].dtype == np.float32
    assert arrays["label"].shape == (64,)
    rust = dict(batch._raw._value_addresses())
    data = batch.to_arrow()
    for name in ("pixels", "label", "id"):
        values = data.column(name)
        while pa.types.is_fixed_size_list(values.type):
            values = values.flatten()
        arrow_at = values.buffers()[1].address
        # pyarrow holds the very buffer Rust filled, and numpy points into it.
        assert arrow_at == rust[name], name
        numpy_at = arrays[name].__array_interface__["data"][0]
        assert numpy_at == arrow_at + values.offset * arrays[name].itemsize, name
        assert not arrays[name].flags.writeable
    copy = {k: v.copy() for k, v in arrays.items()}
    del batch, data, pipe
    reuse_freed_memory(lambda b: b.to_numpy())
    for name, values in arrays.items():
        np.testing.assert_array_equal(values, copy[name])


RESUME = """
import json, sys
import pyarrow as pa
import sluice
config, k, state_file, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
pipe = sluice.Pipeline(config)
if k < 0:
    pipe.load_state_dict(json.load(open(state_file)))
    batches = [b.to_arrow() for b in pipe]
else:
    batches = [next(pipe).to_arrow() for _ in range(k)]
    json.dump(pipe.state_dict(), open(state_file, "w"))
with pa.ipc.new_file(out, batches[0].schema) as w:
    for b in batches:
        w.write_batch(b)
"""


def test_a_new_process_resumes_a_shuffled_augmented_stream_exactly(tmp_path):
    config = str(REPO / "configs/digits-augmented.yaml")
    state = tmp_path / "state.json"
    whole, _ = table_of(sluice.Pipeline(config))
    first = run_python(RESUME, config, "9", str(state), str(tmp_path / "first.arrow"))
    assert first.returncode == 0, first.stderr
    saved = json.loads(state.read_text())
    assert saved["format"] == "sluice.pipeline_state" and saved["state"]["parquet"]
    rest = run_python(RESUME, config, "-1", str(state), str(tmp_path / "rest.arrow"))
    assert rest.returncode == 0, rest.stderr
    parts = [pa.ipc.open_file(tmp_path / f).read_all() for f in ("first.arrow", "rest.arrow")]
    assert parts[0].num_rows == 9 * 64 and parts[1].num_rows > 0
    # The 9 batches, then the rest from another process: bitwise the uninterrupted stream.
    assert pa.concat_tables(parts).equals(whole)


def test_a_state_from_other_settings_is_refused_naming_what_changed(tmp_path):
    text = (REPO / "configs/digits-augmented.yaml").read_text().replace("../data", str(REPO / "data"))
    config = tmp_path / "p.yaml"
    config.write_text(text)
    pipe = sluice.Pipeline(config)
    for _ in range(3):
        next(pipe)
    state = pipe.state_dict()
    config.write_text(text.replace("seed: 7\n  - type: image", "seed: 8\n  - type: image"))
    other = sluice.Pipeline(config)
    other.load_state_dict(state)
    with pytest.raises(sluice.ResumeError, match="seed"):
        next(other)
    with pytest.raises(sluice.ResumeError, match="not a Sluice pipeline state"):
        sluice.Pipeline(config).load_state_dict({"epoch": 3})


def grey_png(level: int) -> bytes:
    """A 1×1 8-bit grey PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes([0, level]))) + chunk(b"IEND", b"")


ERRORS = """
import sys, sluice
try:
    for _ in sluice.Pipeline(sys.argv[1]):
        pass
except sluice.SluiceError as e:
    print(type(e).__name__)
    print(e)
    sys.exit(3)
"""


def cli_and_python(tmp_path, sluice_bin, yaml: str):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml)
    cli = run_cli(sluice_bin, "run", str(config), "--no-report")
    py = run_python(ERRORS, str(config))
    assert py.returncode == 3, f"not a Sluice exception: {py.returncode}\n{py.stdout}\n{py.stderr}"
    kind, message = py.stdout.split("\n", 1)
    return cli, kind, message.strip()


def test_a_bad_config_raises_config_error_with_the_cli_s_locations(tmp_path, sluice_bin):
    cli, kind, message = cli_and_python(
        tmp_path,
        sluice_bin,
        f"source: {{type: parquet, path: '{REPO}/data/digits/train.parquet'}}\nstages:\n  - {{type: clip, columns: [pixels], min: 0, maxx: 3}}\n  - {{type: batchh, size: 8}}\n",
    )
    assert kind == "ConfigError"
    assert cli.returncode == 1
    for line in message.splitlines():
        assert line in cli.stderr, f"{line!r} not in the CLI's message:\n{cli.stderr}"
    assert "bad.yaml:3:" in message and "bad.yaml:4:" in message and "maxx" in message


@pytest.mark.parametrize("case", ["missing file", "truncated parquet", "undecodable image"])
def test_bad_data_raises_data_error_with_the_cli_s_message(tmp_path, sluice_bin, case):
    data = tmp_path / "data.parquet"
    stages = ""
    if case == "truncated parquet":
        good = (REPO / "data/digits/train.parquet").read_bytes()
        data.write_bytes(good[: len(good) // 2])  # cut short: no footer
    if case == "undecodable image":
        # Row 2 is not a PNG (the others are: 1×1 grey pixels).
        png = grey_png(7)
        pq.write_table(pa.table({"img": [png, png, b"not an image", png]}), data)
        stages = "stages:\n  - {type: image, column: img, format: png, shape: [1, 1, 1]}\n"
    cli, kind, message = cli_and_python(tmp_path, sluice_bin, f"source: {{type: parquet, path: '{data}'}}\n{stages}")
    assert kind == "DataError"
    assert cli.returncode == 1
    assert message and message in cli.stderr, f"{message!r} not in:\n{cli.stderr}"
    assert str(data) in message
    if case == "undecodable image":
        assert "row 2" in message, message


def _features(tmp_path, rows: int = 3000, width: int = 32) -> tuple[str, np.ndarray]:
    """`x: fixed_size_list<float32>[width]`, each feature with its own scale and offset, in one
    file of 3 row groups."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((rows, width)) * np.linspace(0.1, 40, width) + np.linspace(-500, 500, width))
    x = x.astype(np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), width)
    path = tmp_path / "features.parquet"
    pq.write_table(pa.table({"x": column}), path, row_group_size=rows // 3, compression="zstd")
    return str(path), x


def _standardized(path: str, tmp_path, options: str) -> np.ndarray:
    config = tmp_path / "p.yaml"
    config.write_text(f"source: {{type: parquet, path: '{path}'}}\n"
                      f"stages:\n- {{type: standardize, columns: [x]{options}}}\n")
    batches = [b.to_arrow().column("x") for b in sluice.Pipeline(config)]
    values = pa.chunked_array(batches).combine_chunks()
    return values.values.to_numpy().reshape(len(values), -1)


def test_per_element_standardize_equals_numpy(tmp_path):
    path, x = _features(tmp_path)
    # Given per-feature statistics: the same float32 arithmetic as numpy, bit for bit.
    mean, std = x.astype(np.float64).mean(axis=0), x.astype(np.float64).std(axis=0)
    options = f", mean: {json.dumps(mean.tolist())}, std: {json.dumps(std.tolist())}"
    got = _standardized(path, tmp_path, options)
    want = (x - mean.astype(np.float32)) / std.astype(np.float32)
    assert got.dtype == np.float32 and got.shape == x.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # Computed per feature (`per_element: true`): numpy's mean and population std (ddof 0),
    # to float64 rounding, so the output equals numpy's to float32 rounding.
    got = _standardized(path, tmp_path, ", per_element: true")
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
    # Each feature now has mean 0 and std 1, up to float32's resolution of its values (feature
    # 0: ±500 with std 0.1, so ~3e-5 / 0.1 per value).
    np.testing.assert_allclose(got.astype(np.float64).mean(axis=0), 0, atol=1e-3)
    np.testing.assert_allclose(got.astype(np.float64).std(axis=0), 1, rtol=1e-3)
    # One statistic for the whole column (the default) is not per feature.
    whole = _standardized(path, tmp_path, "")
    assert not np.allclose(whole.std(axis=0), 1, rtol=0.1)
