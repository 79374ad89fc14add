"""Batches as torch tensors: zero-copy hand-over (DLPack), `sluice.torch.Loader` against the
pipeline it wraps, exact resume through the loader, overrides, and the uint8 → float helper."""

from __future__ import annotations


import numpy as np
import pyarrow as pa
import pytest
import torch

import sluice
import sluice.torch as st
from conftest import REPO, reuse_freed_memory


def test_torch_tensors_are_the_pipeline_s_buffers_and_outlive_the_batch():
    pipe = sluice.Pipeline(REPO / "configs/quickstart.yaml")
    next(pipe)
    batch = next(pipe)
    tensors = batch.to_torch()
    assert tensors["pixels"].shape == (64, 64) and tensors["pixels"].dtype == torch.float32
    assert tensors["label"].dtype == torch.int64
    rust = dict(batch._raw._value_addresses())
    data = batch.to_arrow()
    for name in ("pixels", "label", "id"):
        values = data.column(name)
        while pa.types.is_fixed_size_list(values.type):
            values = values.flatten()
        # torch's storage starts at the very bytes Rust filled.
        assert tensors[name].data_ptr() == rust[name] + values.offset * tensors[name].element_size(), name
    copy = {k: v.clone() for k, v in tensors.items()}
    del batch, data, pipe
    reuse_freed_memory(lambda b: b.to_torch())
    for name, t in tensors.items():
        assert torch.equal(t, copy[name]), name


def test_to_torch_refuses_columns_a_tensor_cannot_hold():
    text = f"source: {{type: parquet, path: '{REPO}/data/digits/train.parquet'}}\nstages:\n  - {{type: batch, size: 16}}\n"
    batch = next(sluice.Pipeline(text))
    assert set(batch.to_torch(["label"])) == {"label"}
    with pytest.raises(KeyError, match="no column `nope`"):
        batch.to_torch(["nope"])


def test_the_loader_gives_the_pipeline_s_values_as_the_config_s_tensors():
    config = REPO / "configs/digits-augmented.yaml"
    expected = [b.to_numpy() for b in sluice.Pipeline(config)]
    loader = st.Loader(config)  # loader.tensors of the config: x image [1, 8, 8], y label
    got, lineages = [], []
    for t in loader:
        got.append(t)
        lineages.append(loader.last_batch.lineage())  # the batch t came from, until the next
    assert len(got) == len(expected) > 2
    for t, e in zip(got, expected):
        assert t["x"].shape == (len(e["image"]), 1, 8, 8) and t["x"].dtype == torch.float32
        np.testing.assert_array_equal(t["x"].reshape(len(e["image"]), -1).numpy(), e["image"])
        np.testing.assert_array_equal(t["y"].numpy(), e["label"])
    assert loader.stats.batches == len(got)
    assert len(loader.stats.waits) == len(got) and loader.stats.wait_s >= max(loader.stats.waits)
    assert 0.0 <= loader.stats.ready <= 1.0
    assert [sum(s["len"] for s in lin) for lin in lineages] == [len(t["y"]) for t in got]
    assert loader.last_batch is None  # its memory lives on only in the tensors handed out


def test_the_loader_resumes_with_exactly_the_next_batch():
    config = REPO / "configs/digits-augmented.yaml"
    specs = {"x": {"column": "image", "shape": [1, 8, 8]}, "y": "label", "id": {"column": "id", "dtype": "i64"}}
    whole = [b for b in st.Loader(config, batch_tensors=specs, prefetch=4)]
    first = st.Loader(config, batch_tensors=specs, prefetch=4)
    for _ in range(7):
        next(first)
    state = first.state_dict()
    del first  # its prefetched batches are not part of the state
    rest = st.Loader(config, batch_tensors=specs)
    rest.load_state_dict(state)
    tail = list(rest)
    assert len(tail) == len(whole) - 7
    for a, b in zip(tail, whole[7:]):
        for k in specs:
            assert torch.equal(a[k], b[k]), k


def test_overrides_change_settings_and_bad_ones_are_named():
    config = REPO / "configs/digits-augmented.yaml"
    base = next(sluice.Pipeline(config)).to_numpy()["id"]
    same = next(sluice.Pipeline(config, overrides={"stages[0].seed": 7})).to_numpy()["id"]
    other = next(sluice.Pipeline(config, overrides={"stages[0].seed": 8})).to_numpy()["id"]
    np.testing.assert_array_equal(base, same)
    assert not np.array_equal(base, other)
    small = next(sluice.Pipeline(config, overrides={"stages[4].size": 10}))
    assert small.num_rows == 10
    with pytest.raises(sluice.ConfigError, match=r"override stages\[9\]\.seed: `stages\[9\]`: the list has 6 entries"):
        sluice.Pipeline(config, overrides={"stages[9].seed": 1})
    with pytest.raises(sluice.ConfigError, match="unknown field `sed`"):
        sluice.Pipeline(config, overrides={"stages[0].sed": 1})


IMAGES = """
source: {{type: parquet, path: '{repo}/data/digits/train.parquet', columns: [id, pixels]}}
stages:
  - {{type: shuffle, buffer_rows: 256, seed: 4}}
  - {{type: batch, size: 50}}
  - type: image
    column: pixels
    shape: [8, 8, 1]
    seed: 9
    {dtype}
    ops:
      - random_crop: {{size: [8, 8], padding: 2}}
      - horizontal_flip: {{p: 0.5}}
{normalize}
"""


def test_uint8_images_normalized_by_the_helper_equal_the_stage_s_floats():
    mean, std = [0.0191], [0.0236]
    floats = IMAGES.format(repo=REPO, dtype="", normalize=f"      - normalize: {{mean: {mean}, std: {std}}}")
    pixels = IMAGES.format(repo=REPO, dtype="dtype: uint8", normalize="")
    specs = {"x": {"column": "pixels", "shape": [1, 8, 8]}, "id": "id"}
    want = list(st.Loader(floats, batch_tensors=specs))
    got = list(st.Loader(pixels, batch_tensors=specs))
    assert len(got) == len(want) == 29
    for g, w in zip(got, want):
        assert g["x"].dtype == torch.uint8 and w["x"].dtype == torch.float32
        assert torch.equal(g["id"], w["id"])
        assert torch.equal(st.normalize(g["x"], mean, std), w["x"])  # bit for bit
    with pytest.raises(sluice.SluiceError, match="dtype: uint8"):
        next(sluice.Pipeline(IMAGES.format(repo=REPO, dtype="dtype: uint8", normalize=f"      - normalize: {{mean: {mean}, std: {std}}}")))


def test_float16_images_are_the_float32_ones_rounded_by_torch():
    normalize = "      - normalize: {mean: [0.0191], std: [0.0236]}"
    floats = IMAGES.format(repo=REPO, dtype="", normalize=normalize)
    halves = IMAGES.format(repo=REPO, dtype="dtype: float16", normalize=normalize)
    specs = {"x": {"column": "pixels", "shape": [1, 8, 8]}, "id": "id"}
    want = list(st.Loader(floats, batch_tensors=specs))
    got = list(st.Loader(halves, batch_tensors=specs))
    assert len(got) == len(want) == 29
    for g, w in zip(got, want):
        assert g["x"].dtype == torch.float16 and w["x"].dtype == torch.float32
        assert torch.equal(g["id"], w["id"])
        assert torch.equal(g["x"], w["x"].half())  # torch's rounding, bit for bit


def test_normalize_on_the_device_equals_the_image_stage_s_normalize():
    mean, std = [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]
    images = torch.randint(0, 256, (4, 3, 5, 5), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    got = st.normalize(images, mean, std)
    want = (images.double() / 255 - torch.tensor(mean, dtype=torch.float64).view(1, 3, 1, 1)) / torch.tensor(
        std, dtype=torch.float64
    ).view(1, 3, 1, 1)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, atol=1e-5)
    with pytest.raises(TypeError, match="uint8 images"):
        st.normalize(images.float(), mean, std)
    with pytest.raises(ValueError, match="one mean and one std per channel"):
        st.normalize(images, mean[:2], std[:2])


def test_sliced_and_nested_fixed_size_lists_keep_their_rows():
    values = pa.array(np.arange(60, dtype=np.float32))
    inner = pa.FixedSizeListArray.from_arrays(values, 3)  # 20 rows of 3
    nested = pa.FixedSizeListArray.from_arrays(inner, 2)  # 10 rows of 2×3
    for column, shape in ((inner.slice(5, 4), (4, 3)), (nested.slice(2, 3), (3, 2, 3))):
        want = np.array(column.to_pylist(), dtype=np.float32)
        t = sluice._to_torch(torch, column, "c")
        n = sluice._to_numpy(column)
        assert tuple(t.shape) == tuple(n.shape) == shape
        np.testing.assert_array_equal(t.numpy(), want)
        np.testing.assert_array_equal(n, want)
        # Still the array's memory: the first value is where the sliced rows begin.
        assert t.data_ptr() == values.buffers()[1].address + int(want.flat[0]) * 4


def test_a_failed_pipeline_keeps_failing_instead_of_ending(tmp_path):
    data = tmp_path / "d.parquet"
    good = (REPO / "data/digits/train.parquet").read_bytes()
    data.write_bytes(good[: len(good) // 2])
    pipe = sluice.Pipeline(f"source: {{type: parquet, path: '{data}'}}\n")
    with pytest.raises(sluice.DataError) as first:
        next(pipe)
    for _ in range(2):  # a loop that catches the error never sees a (short) end of data
        with pytest.raises(sluice.DataError) as again:
            next(pipe)
        assert str(again.value) == str(first.value)


def test_a_batch_the_loader_could_not_hand_over_comes_again_and_is_not_in_the_state():
    config = REPO / "configs/digits-augmented.yaml"
    specs = {"x": {"column": "image", "shape": [1, 8, 8]}, "id": "id"}
    whole = list(st.Loader(config, batch_tensors=specs))
    loader = st.Loader(config, batch_tensors=specs)
    for _ in range(3):
        next(loader)
    before = loader.state_dict()
    real = loader._tensors

    def failing(batch):  # what a Ctrl-C or an out-of-memory in the copy to the GPU does
        raise KeyboardInterrupt

    loader._tensors = failing
    with pytest.raises(KeyboardInterrupt):
        next(loader)
    assert loader.state_dict() == before  # the 4th batch was never handed over
    loader._tensors = real
    fourth = next(loader)
    assert torch.equal(fourth["id"], whole[3]["id"])
    after = loader.state_dict()
    resumed = st.Loader(config, batch_tensors=specs)
    resumed.load_state_dict(after)
    assert torch.equal(next(resumed)["id"], whole[4]["id"])
    resumed = st.Loader(config, batch_tensors=specs)
    resumed.load_state_dict(before)
    assert torch.equal(next(resumed)["id"], whole[3]["id"])


def test_a_pipeline_refuses_to_run_in_a_forked_child():
    import os

    pipe = sluice.Pipeline(REPO / "configs/quickstart.yaml")
    pid = os.fork()
    if pid == 0:  # the child: the pipeline's threads did not come along
        try:
            next(pipe)
            os._exit(3)
        except RuntimeError as e:
            os._exit(0 if "another process" in str(e) else 4)
        except BaseException:
            os._exit(5)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert next(pipe).num_rows == 64  # the parent's pipeline is unaffected


def test_tensor_specs_refuse_the_rust_loader_s_padding_options():
    with pytest.raises(ValueError, match="pad.*Rust loader"):
        st.Loader(REPO / "configs/quickstart.yaml", batch_tensors={"x": {"column": "pixels", "pad": 0}})
    with pytest.raises(ValueError, match="prefetch=0"):
        sluice.Pipeline(REPO / "configs/quickstart.yaml", prefetch=0)


@pytest.mark.parametrize(
    "ops",
    [
        "[{random_crop: {size: [8, 8], padding: 2, fill: 9}}, {horizontal_flip: {p: 0.5}}, "
        "{normalize: {mean: [0.0191], std: [0.0236]}}]",
        "[{random_crop: {size: [6, 7], padding: 3, padding_mode: reflect}}, {vertical_flip: {p: 0.5}}]",
        "[{center_crop: {size: [10, 5]}}]",
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "uint8", "float16"])
def test_augment_on_device_equals_the_host_image_stage(ops, dtype):
    if dtype == "uint8" and "normalize" in ops:
        ops = ops.replace(", {normalize: {mean: [0.0191], std: [0.0236]}}", "")

    def config(where: str) -> str:
        return (
            f"source: {{type: parquet, path: '{REPO}/data/digits/train.parquet', batch_rows: 100}}\n"
            f"stages:\n  - {{type: image, column: pixels, output: image, shape: [8, 8, 1], seed: 5, "
            f"dtype: {dtype}, augment_on: {where}, ops: {ops}}}\n  - {{type: batch, size: 64}}\n"
        )

    host = list(st.Loader(config("host"), batch_tensors={"x": "image", "y": "label"}, device="cpu"))
    device = list(st.Loader(config("device"), batch_tensors={"x": "image", "y": "label"}, device="cpu"))
    assert len(host) == len(device) == 23
    for h, d in zip(host, device):
        x = d["x"]
        kind = {"uint8": torch.uint8, "float16": torch.float16, "float32": torch.float32}[dtype]
        assert x.dim() == 4 and x.shape[1] == 1 and x.dtype == kind
        assert torch.equal(h["x"].reshape(x.shape), x)
        assert torch.equal(h["y"], d["y"])
    assert not torch.equal(device[0]["x"][0], device[0]["x"][1])
