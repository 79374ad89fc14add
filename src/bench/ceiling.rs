//! The ceiling every variant is compared with: arrow-rs's own `ParquetRecordBatchReader`
//! decoding the files with no loader around it, row groups shared between `threads` threads,
//! every value touched (summed) so that nothing is decoded for nothing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::Float32Type;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};

use super::workload::Workload;

/// Decodes every row group of the `*.parquet` files in `data` with `threads` threads
/// (each takes the next row group), in batches of 1024 rows as the Sluice variants read them;
/// returns the rows decoded.
pub(super) fn decode(data: &Path, workload: Workload, threads: usize) -> anyhow::Result<usize> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    files.sort();
    // Each footer read once; the row groups then decoded from it.
    let mut groups = Vec::new();
    for file in &files {
        let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new();
        let metadata = ArrowReaderMetadata::load(&std::fs::File::open(file)?, options)?;
        let row_groups = metadata.metadata().num_row_groups();
        groups.extend((0..row_groups).map(|rg| (file.clone(), metadata.clone(), rg)));
    }
    let next = AtomicUsize::new(0);
    let per_thread = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| -> anyhow::Result<(usize, f64)> {
                    let (mut rows, mut sum) = (0usize, 0f64);
                    while let Some((file, metadata, rg)) =
                        groups.get(next.fetch_add(1, Ordering::Relaxed))
                    {
                        let file = std::fs::File::open(file)?;
                        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(
                            file,
                            metadata.clone(),
                        )
                        .with_row_groups(vec![*rg])
                        .with_batch_size(1024)
                        .build()?;
                        for batch in reader {
                            let batch = batch?;
                            rows += batch.num_rows();
                            sum += touch(&batch, workload);
                        }
                    }
                    Ok((rows, sum))
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .map_err(|_| anyhow::anyhow!("a decode thread panicked"))?
            })
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let sum: f64 = per_thread.iter().map(|(_, s)| s).sum();
    // The sum is kept (printed to nowhere) so the reads are not optimised away.
    std::hint::black_box(sum);
    Ok(per_thread.iter().map(|(r, _)| r).sum())
}

/// Reads every feature value of `batch` once: the pixels' bytes, the float32 features.
pub(super) fn touch(batch: &RecordBatch, workload: Workload) -> f64 {
    let Some(column) = batch.column_by_name(match workload {
        Workload::Images => "image",
        Workload::Tabular => "x",
    }) else {
        return 0.0;
    };
    match workload {
        Workload::Images => {
            let bytes = column.as_fixed_size_binary().value_data();
            // 32 running sums of 16 bits over blocks of 256 × 32 bytes (255 · 256 < 2¹⁶), so
            // the loop is vectorised on the baseline x86-64 target: one `u64` sum per byte
            // ran at ~6 GB/s here (2026-12-01), 30 GB/s this way, and took as long as the
            // decode of these images, in the ceiling and on the source variant's one consumer
            // thread alike.
            let mut total = 0u64;
            for block in bytes.chunks(32 * 256) {
                let words = block.chunks_exact(32);
                let rest: u64 = words.remainder().iter().map(|&b| u64::from(b)).sum();
                let lanes = words.fold([0u16; 32], |mut acc, w| {
                    for (a, b) in acc.iter_mut().zip(w) {
                        *a += u16::from(*b);
                    }
                    acc
                });
                total += lanes.iter().map(|&l| u64::from(l)).sum::<u64>() + rest;
            }
            total as f64
        }
        Workload::Tabular => {
            let list = column.as_fixed_size_list();
            let values = list.values().as_primitive::<Float32Type>();
            let start = list.offset() * list.value_length() as usize;
            let end = start + list.len() * list.value_length() as usize;
            // Sixteen running sums, so the loop is vectorised (one sum would be a chain of
            // dependent additions, slower than the decode it is measuring).
            let lanes =
                values.values()[start..end]
                    .chunks_exact(16)
                    .fold([0f32; 16], |mut acc, c| {
                        for (a, v) in acc.iter_mut().zip(c) {
                            *a += v;
                        }
                        acc
                    });
            lanes.iter().sum::<f32>() as f64
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use arrow::array::FixedSizeBinaryArray;
    use std::sync::Arc;

    /// The blocked sum of the pixels equals the plain one: all bytes 255 (each 16-bit lane at
    /// its largest, 256 · 255), and bytes that are not a whole number of blocks or lanes.
    #[test]
    fn touch_sums_every_pixel() {
        for (rows, byte) in [(11usize, None), (3, Some(255u8)), (1, Some(7))] {
            let bytes: Vec<u8> = (0..rows * 3072)
                .map(|i| byte.unwrap_or(((i * 2_654_435_761) >> 7) as u8))
                .collect();
            let images = FixedSizeBinaryArray::try_from_iter(bytes.chunks(3072)).unwrap();
            let batch = RecordBatch::try_from_iter([("image", Arc::new(images) as _)]).unwrap();
            let want: u64 = bytes.iter().map(|&b| u64::from(b)).sum();
            assert_eq!(touch(&batch, Workload::Images), want as f64, "{rows} rows");
        }
    }
}
