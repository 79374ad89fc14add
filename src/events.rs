//! `sluice run --tensorboard DIR`: the pipeline's throughput as TensorBoard scalars, one point
//! a second (and one at the end) — rows per second read by the source, out of each stage and
//! delivered, and the rows delivered so far. (`sluice train` writes its own, per step:
//! `trainer.tensorboard`.)

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice::observe::{Observed, Sample};
use sluice_pipeline::runtime::tensorboard::EventWriter;

/// How often a point is written.
const EVERY: Duration = Duration::from_secs(1);

/// The event file and the counters at the last point (for the rates).
#[derive(Debug)]
pub struct PipelineEvents {
    writer: EventWriter,
    step: u64,
    last: Sample,
}

impl PipelineEvents {
    /// A new event file in `dir`.
    pub fn create(dir: &Path) -> std::io::Result<PipelineEvents> {
        Ok(PipelineEvents {
            writer: EventWriter::create(dir)?,
            step: 0,
            last: Sample::default(),
        })
    }

    /// Writes one point: the rates since the last one.
    pub fn write(&mut self, observed: &Observed) -> std::io::Result<()> {
        let (now, names) = Sample::of(observed);
        let then = &self.last;
        let dt = (now.seconds - then.seconds).max(1e-9);
        let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / dt;
        let mut values: Vec<(String, f64)> = vec![
            (
                "pipeline/source_rows_per_second".into(),
                rate(now.source_rows, then.source_rows),
            ),
            (
                "pipeline/output_rows_per_second".into(),
                rate(now.output_rows, then.output_rows),
            ),
            ("pipeline/output_rows".into(), now.output_rows as f64),
        ];
        for (i, (name, rows)) in names.iter().zip(&now.stage_rows).enumerate() {
            let before = then.stage_rows.get(i).copied().unwrap_or(0);
            values.push((
                format!("stage/{}/rows_per_second", tag_name(name)),
                rate(*rows, before),
            ));
        }
        self.step += 1;
        let refs: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        self.writer.scalars(self.step, &refs)?;
        self.last = now;
        Ok(())
    }
}

/// `#2 clip` → `2_clip`: a tag segment without spaces or punctuation.
fn tag_name(s: &str) -> String {
    let t: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    t.trim_matches('_').to_string()
}

/// Writes a point every second until aborted.
pub fn spawn(
    events: Arc<Mutex<PipelineEvents>>,
    observed: Arc<Observed>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Ok(mut e) = events.lock()
                && let Err(err) = e.write(&observed)
            {
                tracing::warn!("--tensorboard: {err}");
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_names_become_tag_segments() {
        assert_eq!(tag_name("#2 clip"), "2_clip");
        assert_eq!(tag_name("source"), "source");
    }
}
