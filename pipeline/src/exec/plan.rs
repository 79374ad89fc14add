//! Checking a pipeline without reading data ([`Pipeline::plan`]): the source's files and
//! schema, and each stage against the schema it will receive.

use std::sync::Arc;

use super::stats::placeholder_stats;
use super::{Pipeline, Plan};
use crate::error::Result;
use crate::source::Source;
use crate::stage;
use crate::state::Acknowledger;

impl Pipeline {
    /// Checks the order of the stages, opens the source (lists files, reads footers) and checks
    /// every stage against the schema it will receive, without reading data.
    pub async fn plan(&self) -> Result<Plan> {
        self.check_stage_order(false)?;
        let source = self
            .open_source(Arc::default(), Arc::new(Acknowledger::new(None)))
            .await?;
        if let Source::Parquet(p) = &source {
            p.open_all().await?;
        }
        let mut schema = source.schema().clone();
        let mut stages = Vec::new();
        let mut problems = Vec::new();
        let mut unchecked_from = None;
        let ctx = self.build_context();
        for (i, s) in self.config.stages.iter().enumerate() {
            let sref = self.stage_ref(i);
            let placeholder = placeholder_stats(&s.value);
            match stage::build(&sref, &s.value, &schema, placeholder, &ctx) {
                Ok((_, out)) => {
                    if problems.is_empty() {
                        stages.push((sref, out.clone()));
                    }
                    schema = out;
                }
                Err(e) => {
                    problems.push(e);
                    if !s.value.keeps_columns() {
                        unchecked_from = self
                            .config
                            .stages
                            .get(i + 1)
                            .map(|next| format!("stages[{}] ({})", i + 1, next.value.kind()));
                        break;
                    }
                }
            }
        }
        let summary = match &source {
            Source::Parquet(p) => {
                let mut text = format!(
                    "{} file(s), {} rows",
                    p.num_files().unwrap_or(0),
                    p.total_rows().unwrap_or(0)
                );
                for m in p.mix_shares().unwrap_or_default() {
                    text += &format!(
                        "; mix: `{}` {} of its {} rows each epoch",
                        m.path, m.per_epoch, m.rows
                    );
                }
                text
            }
            Source::Kafka(k) => k.describe(),
        };
        Ok(Plan {
            summary,
            files: source.num_files().unwrap_or(0),
            rows: source.total_rows().unwrap_or(0),
            source_schema: source.schema().clone(),
            stages,
            problems,
            unchecked_from,
        })
    }
}
