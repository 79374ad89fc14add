//! Building a `shuffle` stage: its settings checked against the input schema (the shuffle
//! itself is in `shuffle`).

use arrow::datatypes::SchemaRef;

use super::{Build, BuildStage, BuiltStage, shuffle};
use crate::config::ShuffleConfig;
use crate::error::Result;

impl BuildStage for ShuffleConfig {
    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        if self.buffer_rows == 0 || self.batch_rows == 0 {
            return Err(b.err("`buffer_rows` and `batch_rows` must be at least 1".into()));
        }
        if self.max_memory.as_u64() == 0 {
            return Err(b.err("`max_memory` must be more than 0".into()));
        }
        let group = match &self.group_by_length {
            None => None,
            Some(g) => Some(shuffle::group_spec(b.stage, g, b.input)?),
        };
        Ok((
            BuiltStage::Shuffle(shuffle::ShuffleSpec {
                buffer_rows: self.buffer_rows,
                max_memory: self.max_memory.as_u64() as usize,
                spill_dir: self.spill_dir.as_ref().map(std::path::PathBuf::from),
                seed: self.seed,
                batch_rows: self.batch_rows,
                across_ranks: self.across_ranks,
                views: Vec::new(),
                group,
                rank: b.ctx.rank,
            }),
            b.input.clone(),
        ))
    }
}
