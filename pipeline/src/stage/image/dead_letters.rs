//! Dead letters: the rows `on_error: skip` removes, written with their origin, error and
//! bytes to the stage's dead-letter directory.

use super::decode::raw_bytes;
use super::{ImageDeadLetter, ImageStage};
use crate::batch::Batch;
use crate::error::{Error, Result};

impl ImageStage {
    /// Writes the bad rows `bad` (row, error) of `batch` to the dead-letter directory: one
    /// JSON line each, with the row's origin, the error and the bytes (base64).
    pub(super) fn dead_letters(
        &self,
        dl: &ImageDeadLetter,
        batch: &Batch,
        bad: &[(usize, String)],
    ) -> Result<()> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let col = batch.data.column(self.input);
        let lines: Vec<serde_json::Value> = bad
            .iter()
            .map(|(r, error)| {
                let mut line = batch
                    .lineage
                    .slice(*r as u64, 1)
                    .spans()
                    .first()
                    .map(origin_fields)
                    .unwrap_or_default();
                line.insert("stage".into(), self.stage.to_string().into());
                line.insert(
                    "column".into(),
                    self.schema.field(self.output).name().as_str().into(),
                );
                line.insert("error".into(), error.as_str().into());
                line.insert(
                    "value_base64".into(),
                    raw_bytes(col, *r).map(|b| b64.encode(b)).into(),
                );
                serde_json::Value::Object(line)
            })
            .collect();
        let mut files = dl
            .files
            .lock()
            .map_err(|_| Error::Internal(format!("{}: dead-letter lock poisoned", self.stage)))?;
        dl.runtime.block_on(files.write(&lines))
    }
}

/// Where a row came from, as a dead letter's fields: `url`, `row_group`, `row`, `epoch` (a
/// file), or `topic`, `partition`, `offset` (and `row_in_message`) from Kafka.
fn origin_fields(s: &crate::batch::LineageSpan) -> serde_json::Map<String, serde_json::Value> {
    use crate::batch::Origin;
    let v = match &s.origin {
        Origin::Object { url, row_group } => serde_json::json!({
            "url": &**url, "row_group": row_group, "row": s.first, "epoch": s.epoch,
        }),
        Origin::Kafka { topic, partition } => serde_json::json!({
            "topic": &**topic, "partition": partition, "offset": s.first,
        }),
        Origin::KafkaMessage {
            topic,
            partition,
            offset,
            ..
        } => serde_json::json!({
            "topic": &**topic, "partition": partition, "offset": offset,
            "row_in_message": s.first,
        }),
    };
    match v {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}
