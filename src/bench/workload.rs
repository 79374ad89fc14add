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

/// Writes `rows` rows laid out as `layout` says, with a deterministic generator (random
/// pixels and floats: what compression cannot shrink, so every layout holds the same values).
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
                    for chunk in bytes.chunks_mut(8) {
                        let b = next().to_le_bytes();
                        chunk.copy_from_slice(&b[..chunk.len()]);
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
    // Row groups in flight (the one being handed over among them; measured 2026-11-30, after
    // `prefetch` came to mean that — it had been one fewer). Images to float32 and the floor:
    // 1 — CPU-bound on writing 4 bytes per pixel, a second row group left them as fast
    // (0.68–0.71 s for 200k) at 40 MiB more peak RSS; the source alone and uint8: 2 — the
    // decode no longer waits for the consumer (source 0.33–0.37 s → 0.30, uint8 0.54–0.62 →
    // 0.47–0.49) for the same 40 MiB. Tabular: 2 — since the noise stage reads the rows from
    // the shuffle's window (2026-11-30: `sluice run` of this pipeline, 2.61–2.63 s and
    // 342–346 MiB with 2, 2.73–2.74 s and 362–381 MiB with 3, 3.25–3.30 s with 1).
    let prefetch = match (workload, variant) {
        (Workload::Images, "source" | "uint8") | (Workload::Tabular, _) => 2,
        (Workload::Images, _) => 1,
    };
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
