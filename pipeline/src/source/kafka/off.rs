//! The Kafka source in a Sluice built without the `kafka` cargo feature: its settings are
//! read and checked as in any build, then a config naming it is refused when the pipeline is
//! prepared, naming the feature to enable. The type has no values, so the executor's arms
//! for it compile and can never run.

#[path = "settings.rs"]
mod settings;

pub use settings::*;

use std::path::Path;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;

use crate::error::{Error, Result};
use crate::runtime::CpuPool;
use crate::runtime::channel::Sender;
use crate::runtime::metrics::PipelineMetrics;
use crate::state::{Acknowledger, SourceState};

/// A Kafka source that cannot exist in this build.
#[derive(Debug)]
pub(crate) enum KafkaSource {}

impl KafkaSource {
    /// Refuses: this build has no Kafka client.
    pub(crate) async fn open(
        _config: &KafkaSourceConfig,
        _base_dir: &Path,
        at: &str,
        _rank_and_world: (usize, usize),
        _resume: Option<&SourceState>,
        _acker: Arc<Acknowledger>,
        _metrics: Arc<PipelineMetrics>,
    ) -> Result<Self> {
        Err(Error::Source {
            at: at.to_string(),
            message: crate::error::feature_off("a `kafka` source", "kafka"),
        })
    }

    pub(crate) fn schema(&self) -> &SchemaRef {
        match *self {}
    }

    pub(crate) fn describe(&self) -> String {
        match *self {}
    }

    pub(crate) async fn run(self, _tx: Sender, _pool: CpuPool, _parallelism: usize) {
        match self {}
    }
}
