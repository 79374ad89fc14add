//! `sluice run --tensorboard DIR`: the pipeline's throughput as TensorBoard scalars, one point
//! a second (and one at the end) — rows per second read by the source, out of each stage and
//! delivered, and the rows delivered so far. (`sluice train` writes its own, per step:
//! `trainer.tensorboard`.)

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_pipeline::PipelineMetrics;
use sluice_pipeline::runtime::tensorboard::EventWriter;

use sluice::observe::{Observed, short_name};

/// How often a point is written.
const EVERY: Duration = Duration::from_secs(1);

/// The event file and the counters at the last point (for the rates).
#[derive(Debug)]
pub struct PipelineEvents {
    writer: EventWriter,
    step: u64,
    /// Seconds, source rows, rows out of each stage, rows delivered.
    last: (f64, u64, Vec<u64>, u64),
}

impl PipelineEvents {
    /// A new event file in `dir`.
    pub fn create(dir: &Path) -> std::io::Result<PipelineEvents> {
        Ok(PipelineEvents {
            writer: EventWriter::create(dir)?,
            step: 0,
            last: (0.0, 0, Vec::new(), 0),
        })
    }

    /// Writes one point: the rates since the last one.
    pub fn write(&mut self, observed: &Observed) -> std::io::Result<()> {
        let get = PipelineMetrics::get;
        let seconds = observed.seconds();
        let (mut source, mut out, mut stages) = (0u64, 0u64, Vec::<(String, u64)>::new());
        for (_, m) in observed.pipelines() {
            source += get(&m.source.rows);
            out += get(&m.rows_out);
            for (i, st) in m.stages().iter().enumerate() {
                if stages.len() <= i {
                    stages.push((tag_name(&short_name(&st.name)), 0));
                }
                stages[i].1 += get(&st.rows_out);
            }
        }
        let (t0, source0, stages0, out0) = &self.last;
        let dt = (seconds - t0).max(1e-9);
        let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / dt;
        let mut values: Vec<(String, f64)> = vec![
            (
                "pipeline/source_rows_per_second".into(),
                rate(source, *source0),
            ),
            ("pipeline/output_rows_per_second".into(), rate(out, *out0)),
            ("pipeline/output_rows".into(), out as f64),
        ];
        for (i, (name, rows)) in stages.iter().enumerate() {
            let before = stages0.get(i).copied().unwrap_or(0);
            values.push((format!("stage/{name}/rows_per_second"), rate(*rows, before)));
        }
        self.step += 1;
        let refs: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        self.writer.scalars(self.step, &refs)?;
        self.last = (
            seconds,
            source,
            stages.into_iter().map(|(_, r)| r).collect(),
            out,
        );
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
