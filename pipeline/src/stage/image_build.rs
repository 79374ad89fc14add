//! The `image` stage's build step: `image::build` checks the config and makes the stage,
//! which runs on the CPU pool.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;

use super::{Build, BuildStage, BuiltStage};
use crate::config::ImageConfig;
use crate::error::Result;

impl BuildStage for ImageConfig {
    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        let (built, schema) = super::image::build(b.stage, self, b.input, b.ctx)?;
        Ok((BuiltStage::Map(Arc::new(built)), schema))
    }
}
