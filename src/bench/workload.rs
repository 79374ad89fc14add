//! The standard workloads: their generated Parquet files and each variant's pipeline.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    FixedSizeBinaryArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
};
use arrow::datatypes::{DataType, Field};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};

/// The standard workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Workload {
    /// 200k × 32×32×3 uint8 images: shuffle 10k, random crop (pad 4), flip, normalize,
    /// batches of 256 float32 [3, 32, 32].
    Images,
    /// 2M × 128 float32: shuffle 100k, standardize, Gaussian noise, batches of 1024.
    Tabular,
}

impl Workload {
    pub(super) fn default_rows(self) -> usize {
        match self {
            Workload::Images => 200_000,
            Workload::Tabular => 2_000_000,
        }
    }
    pub(super) fn row_bytes(self) -> usize {
        match self {
            Workload::Images => 3072,
            Workload::Tabular => 512,
        }
    }
    pub(super) fn batch(self) -> usize {
        match self {
            Workload::Images => 256,
            Workload::Tabular => 1024,
        }
    }
    pub(super) fn buffer_rows(self) -> usize {
        match self {
            Workload::Images => 10_000,
            Workload::Tabular => 100_000,
        }
    }
    pub(super) fn name(self) -> &'static str {
        match self {
            Workload::Images => "images",
            Workload::Tabular => "tabular",
        }
    }
}

/// How the generated files are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Layout {
    /// As a dataset written by pyarrow or Spark: zstd, dictionary encoding tried (and given
    /// up for values that do not repeat), 8 files of 3 (images) or 4 (tabular) large row
    /// groups.
    Compressed,
    /// 20 files × 10 row groups, uncompressed PLAIN: the decode is a memory copy, so the
    /// ratios measure a ceiling no real dataset has.
    Uncompressed,
}

impl Layout {
    /// Files, row groups per file and rows per row group for `rows` rows: the shape of the
    /// default size; a larger dataset gets more files of the same row groups, as a dataset
    /// grows (so memory that depends on the row group, not the data, stays put), a smaller
    /// one smaller row groups.
    pub(super) fn shape(self, workload: Workload, rows: usize) -> (usize, usize, usize) {
        let (files, groups) = match (self, workload) {
            (Layout::Compressed, Workload::Images) => (8, 3),
            (Layout::Compressed, Workload::Tabular) => (8, 4),
            (Layout::Uncompressed, _) => (20, 10),
        };
        let per_group = workload.default_rows().div_ceil(files * groups);
        if rows <= workload.default_rows() {
            return (files, groups, rows.div_ceil(files * groups));
        }
        (rows.div_ceil(per_group * groups), groups, per_group)
    }

    fn properties(self) -> WriterProperties {
        match self {
            Layout::Compressed => WriterProperties::builder()
                .set_compression(Compression::ZSTD(ZstdLevel::default()))
                .build(),
            Layout::Uncompressed => WriterProperties::builder()
                .set_compression(Compression::UNCOMPRESSED)
                .set_dictionary_enabled(false)
                .set_encoding(Encoding::PLAIN)
                .build(),
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Layout::Compressed => "compressed",
            Layout::Uncompressed => "uncompressed",
        }
    }
}

/// What the generated images look like, part of the dataset's stamp: a directory kept with
/// `--data` from before (uniform random pixels) is written again.
pub(super) const IMAGES: &str = "photo-like-v1";

/// One 32×32 RGB image (HWC) that zstd compresses as it compresses photographs cut to
/// CIFAR's size: a 4×4 grid of colours spread around the image's own (σ 100), bilinearly
/// upsampled, plus pixel noise (σ 8), rounded and clipped.
///
/// Measured 2026-12-01, Parquet of 30,000 images (one `fixed_size_binary(3072)` column, zstd
/// level 1, no dictionary) read by pyarrow on one thread: 30,000 random 32×32 crops, at random
/// scales, of 13 of scikit-image's sample photographs compressed 1.096× and decoded at
/// ~1.6 GB/s; this model 1.10× and ~1.6 GB/s; uniform random bytes (what the bench wrote
/// before) 1.00× at 4.3 GB/s: zstd stores them raw, so their "decode" is a memory copy and the
/// ceiling a memcpy no real dataset has. Normal draws are Irwin–Hall sums of four random
/// bytes (mean 510, σ 147.8): cheap, and shaped closely enough for a byte histogram.
fn photo_like(next: &mut impl FnMut() -> u64, out: &mut [u8]) {
    const SIDE: usize = 32;
    const GRID: usize = 4;
    let base = next().to_le_bytes();
    let mut normal_pair = || {
        let r = next();
        let sum =
            |w: u64| ((0..4).map(|k| (w >> (8 * k)) & 0xff).sum::<u64>() as f32 - 510.0) / 147.8;
        (sum(r & 0xffff_ffff), sum(r >> 32))
    };
    let mut cells = [[[0f32; 3]; GRID]; GRID];
    for (k, cell) in cells.iter_mut().flatten().flatten().enumerate() {
        *cell = f32::from(base[k % 3]) + 100.0 * normal_pair().0;
    }
    // Where row or column `i` falls on the grid (numpy's `linspace(0, GRID - 1, SIDE)`).
    let at: [(usize, usize, f32); SIDE] = std::array::from_fn(|i| {
        let x = i as f32 * (GRID - 1) as f32 / (SIDE - 1) as f32;
        let i0 = (x as usize).min(GRID - 1);
        (i0, (i0 + 1).min(GRID - 1), x - i0 as f32)
    });
    for (p, px) in out.chunks_exact_mut(6).enumerate() {
        // Six values (two pixels) from three draws of a pair of normals.
        let [d0, d1, d2] = [normal_pair(), normal_pair(), normal_pair()];
        let noise = [d0.0, d0.1, d1.0, d1.1, d2.0, d2.1];
        for (j, (v, z)) in px.iter_mut().zip(noise).enumerate() {
            let (pixel, c) = ((6 * p + j) / 3, (6 * p + j) % 3);
            let ((y0, y1, fy), (x0, x1, fx)) = (at[pixel / SIDE], at[pixel % SIDE]);
            let top = cells[y0][x0][c] * (1.0 - fx) + cells[y0][x1][c] * fx;
            let bottom = cells[y1][x0][c] * (1.0 - fx) + cells[y1][x1][c] * fx;
            let value = top * (1.0 - fy) + bottom * fy + 8.0 * z;
            *v = value.round().clamp(0.0, 255.0) as u8;
        }
    }
}

/// Writes `rows` rows laid out as `layout` says, with a deterministic generator (images that
/// compress as photographs do, see [`photo_like`]; uniformly random floats), so every layout
/// holds the same values.
pub(super) fn generate(
    dir: &Path,
    workload: Workload,
    rows: usize,
    layout: Layout,
) -> std::io::Result<()> {
    let (files, groups, per_group) = layout.shape(workload, rows);
    // A kept directory may hold the files of another shape: the glob would read them too.
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("train-") && name.ends_with(".parquet") {
            std::fs::remove_file(entry.path())?;
        }
    }
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let props = layout.properties();
    let mut id = 0usize;
    for f in 0..files {
        let file = std::fs::File::create(dir.join(format!("train-{f:03}.parquet")))?;
        let mut writer: Option<ArrowWriter<std::fs::File>> = None;
        let mut file = Some(file);
        for _ in 0..groups {
            let n = per_group.min(rows - id.min(rows));
            if n == 0 {
                break;
            }
            let features: arrow::array::ArrayRef = match workload {
                Workload::Images => {
                    let mut bytes = vec![0u8; n * 3072];
                    for image in bytes.chunks_mut(3072) {
                        photo_like(&mut next, image);
                    }
                    Arc::new(
                        FixedSizeBinaryArray::try_from_iter(bytes.chunks(3072))
                            .map_err(std::io::Error::other)?,
                    )
                }
                Workload::Tabular => {
                    let values = Float32Array::from_iter_values(
                        (0..n * 128).map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32),
                    );
                    Arc::new(
                        FixedSizeListArray::try_new(
                            Arc::new(Field::new("item", DataType::Float32, false)),
                            128,
                            Arc::new(values),
                            None,
                        )
                        .map_err(std::io::Error::other)?,
                    )
                }
            };
            let labels = Int64Array::from_iter_values((id..id + n).map(|i| (i % 10) as i64));
            id += n;
            let name = match workload {
                Workload::Images => "image",
                Workload::Tabular => "x",
            };
            let rb =
                RecordBatch::try_from_iter([(name, features), ("label", Arc::new(labels) as _)])
                    .map_err(std::io::Error::other)?;
            let w = match &mut writer {
                Some(w) => w,
                None => writer.insert(
                    ArrowWriter::try_new(
                        file.take().ok_or_else(|| std::io::Error::other("file"))?,
                        rb.schema(),
                        Some(props.clone()),
                    )
                    .map_err(std::io::Error::other)?,
                ),
            };
            w.write(&rb).map_err(std::io::Error::other)?;
            w.flush().map_err(std::io::Error::other)?;
        }
        if let Some(w) = writer {
            w.close().map_err(std::io::Error::other)?;
        }
    }
    Ok(())
}

/// The pipeline of a variant (`source`: the source alone).
pub(super) fn yaml(dir: &Path, workload: Workload, variant: &str, threads: usize) -> String {
    // Row groups in flight (the one being handed over among them): 2 for every variant.
    // Measured 2026-12-01 on the photo-like images, whose zstd decode is real work (bench
    // child, two runs each): float32 0.75–0.79 s with 1, 0.56–0.57 s with 2, 0.56 s with 3; the
    // floor 0.68 s, 0.49–0.50 s, 0.52–0.54 s. With 1, one thread decoded while the other
    // waited. (On the uniform random pixels written before, whose "decode" was a memory copy,
    // 1 had been as fast for these two.) Tabular (2026-11-30, `sluice run` of this pipeline):
    // 2.61–2.63 s and 342–346 MiB with 2, 2.73–2.74 s and 362–381 MiB with 3, 3.25–3.30 s
    // with 1.
    let prefetch = 2;
    let source = format!(
        "source: {{type: parquet, path: '{}/*.parquet', batch_rows: 1024, prefetch: {prefetch}}}\n",
        dir.display()
    );
    let stages = match (workload, variant) {
        (_, "source" | "floor") => String::new(),
        // DALI's split: the crop and flip here, the images handed over as uint8 (a quarter of
        // the bytes), `normalize` on the device (`sluice.torch.normalize` or the loader's
        // `augment_on: device`), where it costs a GPU a few microseconds per batch.
        (Workload::Images, "uint8") => "stages:\n\
            - SHUFFLE\n\
            - {type: batch, size: 256}\n\
            - type: image\n  column: image\n  shape: [32, 32, 3]\n  seed: 2\n  dtype: uint8\n  ops:\n\
            \x20   - random_crop: {size: [32, 32], padding: 4}\n\
            \x20   - horizontal_flip: {p: 0.5}\n"
            .to_string(),
        // `batch` before `image`: the rows are cut into batches of 256 while they are still
        // 3 KiB of uint8 each, and every float32 batch is written once, already final (after
        // `image` a batch that straddles two shuffle outputs would be concatenated: 12 KiB
        // per row copied again).
        // (`float16`: the same, rounded to half float32's bytes.)
        (Workload::Images, _) => format!(
            "stages:\n\
            - SHUFFLE\n\
            - {{type: batch, size: 256}}\n\
            - type: image\n  column: image\n  shape: [32, 32, 3]\n  seed: 2\n{dtype}  ops:\n\
            \x20   - random_crop: {{size: [32, 32], padding: 4}}\n\
            \x20   - horizontal_flip: {{p: 0.5}}\n\
            \x20   - normalize: {{mean: [0.4914, 0.4822, 0.4465], std: [0.2470, 0.2435, 0.2616]}}\n",
            dtype = if variant == "float16" { "  dtype: float16\n" } else { "" }
        ),
        (Workload::Tabular, _) => "stages:\n\
            - SHUFFLE\n\
            - {type: standardize, columns: [x], mean: 0.5, std: 0.29}\n\
            - {type: gaussian_noise, columns: [x], std: 0.1, seed: 3}\n\
            - {type: batch, size: 1024}\n"
            .to_string(),
    };
    let shuffle = match (workload, variant) {
        (_, "global") => "{type: shuffle, mode: global, seed: 1, batch_rows: 1024}",
        (Workload::Images, _) => "{type: shuffle, buffer_rows: 10000, seed: 1, batch_rows: 1024}",
        (Workload::Tabular, _) => "{type: shuffle, buffer_rows: 100000, seed: 1, batch_rows: 4096}",
    };
    let stages = stages.replace("SHUFFLE", shuffle);
    // 4 MiB queues: as fast as 8 or 32 MiB here (measured: images 685-705 k/s with 4 MiB,
    // 550-652 k/s with 8; tabular 1.33 M/s with both) and less peak RSS (images 289-291 MiB
    // vs 316-322, tabular 322 vs 384).
    format!("{source}{stages}runtime: {{threads: {threads}, queue_bytes: 4 MiB}}\n")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn written(dir: &Path) -> Vec<(std::ffi::OsString, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| (e.file_name(), std::fs::read(e.path()).unwrap()))
            .collect();
        files.sort();
        files
    }

    /// The generated images compress as the photographs measured in [`photo_like`] did
    /// (1.10× at zstd level 1): not as uniform random bytes (1.00×, stored raw), not as a
    /// smooth picture (several times); and the same rows give the same files.
    #[test]
    fn photo_like_images_compress_as_photographs_do() {
        let rows = 6000;
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        generate(a.path(), Workload::Images, rows, Layout::Compressed).unwrap();
        generate(b.path(), Workload::Images, rows, Layout::Compressed).unwrap();
        let files = written(a.path());
        assert_eq!(files, written(b.path()));
        let bytes: usize = files.iter().map(|(_, f)| f.len()).sum();
        let ratio = (rows * Workload::Images.row_bytes()) as f64 / bytes as f64;
        assert!((1.06..1.16).contains(&ratio), "compressed {ratio:.3}×");
    }
}
