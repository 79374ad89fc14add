//! Spilling: a window's rows permuted and written as runs (zstd Arrow IPC) to unnamed
//! temporary files, and read back a chunk at a time.

use std::fs::File;
use std::io::{BufReader, BufWriter, Seek, SeekFrom};

use arrow::array::RecordBatch;
use arrow::compute::interleave_record_batch;
use arrow::ipc::CompressionType;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};

use crate::error::{Error, Result, StageRef};

use super::{OWN_RUNS, RowOrigin, Shuffler, arrow_err, err, io_err, shuffled};

/// A spilled, permuted run: a zstd IPC stream in an unnamed temporary file.
pub(super) struct Run {
    pub(super) rows: u64,
    /// Arrow bytes per row of the rows written (what sizes the rounds that send them on).
    pub(super) bytes_per_row: usize,
    pub(super) lineage: Vec<RowOrigin>,
    reader: Option<StreamReader<BufReader<File>>>,
    file: Option<File>,
    pub(super) chunk: Option<RecordBatch>,
    pub(super) chunk_pos: usize,
    pub(super) next_row: usize,
}

impl Run {
    /// The chunk holding the next row, reading the next one from disk when needed.
    pub(super) fn current(&mut self, stage: &StageRef) -> Result<&RecordBatch> {
        let exhausted = self
            .chunk
            .as_ref()
            .is_none_or(|c| self.chunk_pos >= c.num_rows());
        if exhausted {
            if self.reader.is_none() {
                let file = self
                    .file
                    .take()
                    .ok_or_else(|| Error::Internal("spill run read twice".into()))?;
                self.reader = Some(
                    StreamReader::try_new(BufReader::new(file), None)
                        .map_err(|e| arrow_err(stage, e))?,
                );
            }
            let next = self
                .reader
                .as_mut()
                .and_then(|r| r.next())
                .ok_or_else(|| err(stage, "a shuffle spill file ended early"))?
                .map_err(|e| arrow_err(stage, e))?;
            self.chunk = Some(next);
            self.chunk_pos = 0;
        }
        self.chunk
            .as_ref()
            .ok_or_else(|| Error::Internal("no chunk".into()))
    }
}

impl Shuffler {
    /// Permutes the held rows and writes them to a temporary file as one run.
    pub(super) fn spill(&mut self) -> Result<()> {
        let bytes_per_row = (self.bytes / self.held_rows.max(1)).max(1);
        let (pieces, lineage) = self.window_rows();
        let part = OWN_RUNS + self.runs.len() as u64;
        let run = self.write_run(&pieces, &lineage, part, bytes_per_row)?;
        self.runs.push(run);
        Ok(())
    }

    /// Writes `pieces` (rows with their origins), permuted by the stream `part` of this
    /// window, to a temporary file as one run.
    pub(super) fn write_run(
        &mut self,
        pieces: &[RecordBatch],
        lineage: &[Vec<RowOrigin>],
        part: u64,
        bytes_per_row: usize,
    ) -> Result<Run> {
        let epoch = self.epoch.unwrap_or(0);
        let order = shuffled(pieces, &mut self.rng(epoch, self.window, part));
        // Chunks small enough that one per run fits in half the cap.
        let runs_expected =
            (self.spec.buffer_rows * bytes_per_row).div_ceil(self.spec.max_memory.max(1)) + 1;
        let chunk_rows =
            (self.spec.max_memory / 2 / runs_expected / bytes_per_row).clamp(16, 65536);
        let file = match &self.spec.spill_dir {
            Some(d) => tempfile::tempfile_in(d),
            None => tempfile::tempfile(),
        }
        .map_err(|e| io_err(&self.stage, "creating a shuffle spill file", e))?;
        let schema = pieces[0].schema();
        let options = IpcWriteOptions::default()
            .try_with_compression(Some(CompressionType::ZSTD))
            .map_err(|e| arrow_err(&self.stage, e))?;
        let mut writer = StreamWriter::try_new_with_options(BufWriter::new(file), &schema, options)
            .map_err(|e| arrow_err(&self.stage, e))?;
        let refs: Vec<&RecordBatch> = pieces.iter().collect();
        let mut run_lineage = Vec::with_capacity(order.len());
        for chunk in order.chunks(chunk_rows) {
            let rb =
                interleave_record_batch(&refs, chunk).map_err(|e| arrow_err(&self.stage, e))?;
            writer.write(&rb).map_err(|e| arrow_err(&self.stage, e))?;
            run_lineage.extend(chunk.iter().map(|(p, r)| lineage[*p][*r]));
        }
        writer.finish().map_err(|e| arrow_err(&self.stage, e))?;
        let mut file = writer
            .into_inner()
            .map_err(|e| arrow_err(&self.stage, e))?
            .into_inner()
            .map_err(|e| io_err(&self.stage, "writing a shuffle spill file", e.into_error()))?;
        let written = file
            .stream_position()
            .map_err(|e| io_err(&self.stage, "writing a shuffle spill file", e))?;
        file.seek(SeekFrom::Start(0))
            .map_err(|e| io_err(&self.stage, "rewinding a shuffle spill file", e))?;
        self.stats.runs += 1;
        self.stats.bytes_written += written;
        Ok(Run {
            rows: run_lineage.len() as u64,
            bytes_per_row,
            lineage: run_lineage,
            reader: None,
            file: Some(file),
            chunk: None,
            chunk_pos: 0,
            next_row: 0,
        })
    }
}
