//! `type: null`.

use async_trait::async_trait;
use serde::Deserialize;
use sluice_pipeline::Batch;

use crate::{Result, Sink, SinkReport};

/// `type: null` — discards batches, counting rows and bytes (for benchmarks).
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NullSinkConfig {}

/// Counts and discards.
#[derive(Debug, Default)]
pub(crate) struct NullSink {
    report: SinkReport,
}

#[async_trait]
impl Sink for NullSink {
    async fn write(&mut self, batch: &Batch) -> Result<()> {
        self.report.rows += batch.num_rows() as u64;
        self.report.batches += 1;
        self.report.bytes += batch.memory_size() as u64;
        Ok(())
    }

    async fn flush(&mut self) -> Result<bool> {
        Ok(true)
    }

    async fn finish(self: Box<Self>) -> Result<SinkReport> {
        Ok(self.report)
    }

    async fn abort(self: Box<Self>) {}
}
