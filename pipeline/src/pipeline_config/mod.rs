//! The whole pipeline document: the source, the stages and the runtime, read from a config
//! file. It sits above the stages and the sources (each kind's settings live with its build
//! step, in `stage` and `source`), while the `runtime` section and the settings components
//! share live below them, in `config`.

use crate::config::{
    ConfigDocument, ConfigError, Located, RuntimeConfig, TOP_LEVEL_SECTIONS, limits,
};
use crate::source::SourceConfig;
use crate::stage::StageConfig;

/// A whole pipeline: where rows come from and what happens to them.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Where rows come from.
    pub source: Located<SourceConfig>,
    /// Transformations, applied in order.
    pub stages: Vec<Located<StageConfig>>,
    /// Threads and buffers.
    pub runtime: RuntimeConfig,
}

impl PipelineConfig {
    /// Reads the pipeline sections of a document, collecting every problem. Sections owned by
    /// other crates (`sink`) are accepted but not read here.
    pub fn from_document(doc: &ConfigDocument, errors: &mut Vec<ConfigError>) -> Option<Self> {
        let present = doc.sections(TOP_LEVEL_SECTIONS, errors);
        let source = doc.component::<SourceConfig>("source", errors);
        if source.is_none() && !present.iter().any(|k| k == "source") && errors.is_empty() {
            errors.push(ConfigError::new(
                doc.origin(),
                1,
                1,
                "missing required section `source` (for example `source: {type: parquet, path: data/*.parquet}`)"
                    .to_string(),
            ));
        }
        let stages = doc.component_list::<StageConfig>("stages", errors);
        let runtime = doc
            .value::<RuntimeConfig>("runtime", errors)
            .unwrap_or_default();
        // Every size setting of the file (its other sections' too), before anything runs.
        limits::check(doc, errors);
        Some(PipelineConfig {
            source: source?,
            stages,
            runtime,
        })
    }
}

#[cfg(test)]
mod tests;
