#!/usr/bin/env python3
"""Regenerates data/digits/{train,test}.parquet from scikit-learn's bundled `digits` dataset.

The committed Parquet files are the output of this script; it only needs re-running if the
layout changes. Requires: pip install scikit-learn pyarrow (not needed to use Sluice).

Layout (one row per 8x8 image):
  id      int64                  index in sklearn's load_digits() (0..1796)
  label   int64                  the digit, 0..9
  pixels  fixed_size_list<uint8>[64]  row-major 8x8 grey levels, 0..16
Split: rows with id % 5 == 0 go to test (360 rows), the rest to train (1437 rows).
Train is written with row groups of 512 rows, so it has 3 row groups.
"""
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sklearn.datasets import load_digits

out = pathlib.Path(__file__).resolve().parent.parent / "data" / "digits"
out.mkdir(parents=True, exist_ok=True)

digits = load_digits()
pixels = digits.data.astype(np.uint8)  # values are integers 0..16
labels = digits.target.astype(np.int64)
ids = np.arange(len(labels), dtype=np.int64)


def table(mask):
    flat = pa.array(pixels[mask].reshape(-1), type=pa.uint8())
    return pa.table(
        {
            "id": pa.array(ids[mask]),
            "label": pa.array(labels[mask]),
            "pixels": pa.FixedSizeListArray.from_arrays(flat, 64),
        }
    )


test_mask = ids % 5 == 0
pq.write_table(table(~test_mask), out / "train.parquet", row_group_size=512, compression="zstd")
pq.write_table(table(test_mask), out / "test.parquet", row_group_size=512, compression="zstd")
print(f"train: {(~test_mask).sum()} rows, test: {test_mask.sum()} rows -> {out}")
