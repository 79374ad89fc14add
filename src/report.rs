//! The run report written at the end of every `sluice run`/`sluice train`: `report.json`
//! (everything, machine-readable) and `report.html` with SVG plots drawn by `plotters` —
//! throughput over time per stage, and for training the loss and evaluation curves — plus
//! the bottleneck named with the knob to turn.

use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;
use sluice_pipeline::PipelineMetrics;

use crate::observe::{Observed, Sample, short_name};

/// One element of the pipeline's chain: the source, a task (one stage, or a run of per-batch
/// stages fused into one task) or the consumer (sink or trainer).
#[derive(Debug, Clone, Serialize)]
pub struct ChainElement {
    /// Its name (`source`, the stage's `#i kind`, `consumer`).
    pub name: String,
    /// Seconds the element waited to hand a batch on (its output queue was full: something
    /// after it is slower). Not known for the consumer.
    pub output_blocked_seconds: Option<f64>,
    /// Fraction of the run spent blocked so.
    pub output_blocked_fraction: Option<f64>,
    /// Share of the batches in its output queue that were already waiting when the element
    /// after it asked for them (SPDL's readiness; ≥ 0.99: this side is ahead). Summed over
    /// ranks. Not known for the consumer.
    pub output_readiness: Option<f64>,
}

/// A stage's totals.
#[derive(Debug, Clone, Serialize)]
pub struct StageTotals {
    /// `#i kind`.
    pub name: String,
    /// Rows in.
    pub rows_in: u64,
    /// Rows out.
    pub rows_out: u64,
    /// CPU seconds (summed over parallel tasks).
    pub busy_seconds: f64,
}

/// How busy the CPU pool was, and the source's share of it (the stages' are theirs).
#[derive(Debug, Clone, Serialize)]
pub struct PoolUse {
    /// Its threads (summed over ranks).
    pub threads: u64,
    /// Its capacity: threads × the run's seconds.
    pub seconds: f64,
    /// Seconds its threads ran tasks (the source's decode, the stages, the shuffle's steps,
    /// tensor conversion, sink encoding).
    pub busy_seconds: f64,
    /// `busy_seconds / seconds`: near 1, every element waits for CPU.
    pub busy_fraction: f64,
    /// Of `busy_seconds`, the source's decode.
    pub source_seconds: f64,
}

/// The slowest element and what to do about it.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Bottleneck {
    /// The element (see [`ChainElement::name`]).
    pub element: String,
    /// Why it is named.
    pub evidence: String,
    /// The knob to turn.
    pub suggestion: String,
}

/// A named series of (x, y) points.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    /// Legend.
    pub name: String,
    /// Points.
    pub points: Vec<(f64, f64)>,
}

/// Training curves.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Curves {
    /// Loss per step (rank 0's record).
    pub loss: Vec<(f64, f64)>,
    /// Evaluation accuracy per step.
    pub eval_accuracy: Vec<(f64, f64)>,
    /// Evaluation loss per step.
    pub eval_loss: Vec<(f64, f64)>,
    /// Fraction of rank 0's loop spent waiting for data.
    pub data_stall_fraction: Option<f64>,
}

/// Everything in `report.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `run` or `train`.
    pub kind: String,
    /// The config file.
    pub config: String,
    /// Seconds the run took.
    pub seconds: f64,
    /// The chain in order, with blocking times.
    pub chain: Vec<ChainElement>,
    /// Per-stage totals (rank 0's pipeline... summed over ranks).
    pub stages: Vec<StageTotals>,
    /// The CPU pool: how busy, and the source's share.
    pub pool: PoolUse,
    /// The bottleneck.
    pub bottleneck: Bottleneck,
    /// Rows per second over time: the source, each stage, the output.
    pub throughput: Vec<Series>,
    /// Training curves (`train` only).
    pub training: Option<Curves>,
    /// The command's summary (`--summary-json` content).
    pub summary: serde_json::Value,
}

/// Fraction of the run an output queue's producer must be blocked for its consumer to count
/// as the slower side.
const BLOCKED: f64 = 0.2;

/// Fraction of waiting for data below which the trainer (not the pipeline) is the bottleneck.
const STALL_OK: f64 = 0.05;

impl Report {
    /// Builds the report from the final counters and the sampled series.
    pub fn build(
        kind: &str,
        config: &Path,
        observed: &Observed,
        samples: &[Sample],
        stage_names: &[String],
        training: Option<Curves>,
        summary: serde_json::Value,
    ) -> Report {
        let seconds = observed.seconds().max(1e-9);
        let pipelines = observed.pipelines();
        let get = PipelineMetrics::get;
        // Queues in order, summed over ranks (every rank runs the same chain).
        let mut chain: Vec<ChainElement> = Vec::new();
        let mut stages: Vec<StageTotals> = Vec::new();
        let ranks = pipelines.len().max(1) as f64;
        // Per queue: (ready, popped), summed over ranks.
        let mut ready: Vec<(u64, u64)> = Vec::new();
        for (_, m) in &pipelines {
            for (i, (name, q)) in m.queues().iter().enumerate() {
                let blocked = get(&q.send_blocked_ns) as f64 / 1e9;
                if chain.len() <= i {
                    chain.push(ChainElement {
                        name: short_name(name),
                        output_blocked_seconds: Some(0.0),
                        output_blocked_fraction: Some(0.0),
                        output_readiness: None,
                    });
                    ready.push((0, 0));
                }
                if let Some(b) = &mut chain[i].output_blocked_seconds {
                    *b += blocked / ranks;
                }
                ready[i].0 += get(&q.ready);
                ready[i].1 += get(&q.popped);
            }
            for (i, st) in m.stages().iter().enumerate() {
                if stages.len() <= i {
                    stages.push(StageTotals {
                        name: short_name(&st.name),
                        rows_in: 0,
                        rows_out: 0,
                        busy_seconds: 0.0,
                    });
                }
                stages[i].rows_in += get(&st.rows_in);
                stages[i].rows_out += get(&st.rows_out);
                stages[i].busy_seconds += get(&st.busy_ns) as f64 / 1e9;
            }
        }
        for (e, &(r, popped)) in chain.iter_mut().zip(&ready) {
            e.output_blocked_fraction = e.output_blocked_seconds.map(|b| b / seconds);
            e.output_readiness = (popped > 0).then(|| r as f64 / popped as f64);
        }
        let consumer = match kind {
            "train" => "trainer",
            "run" => "sink",
            _ => "consumer",
        };
        chain.push(ChainElement {
            name: consumer.into(),
            output_blocked_seconds: None,
            output_blocked_fraction: None,
            output_readiness: None,
        });
        let stall = training.as_ref().and_then(|c| c.data_stall_fraction);
        let sum =
            |c: &dyn Fn(&PipelineMetrics) -> u64| pipelines.iter().map(|(_, m)| c(m)).sum::<u64>();
        let threads = sum(&|m| get(&m.pool_threads));
        let busy_seconds = sum(&|m| get(&m.pool_busy_ns)) as f64 / 1e9;
        let pool = PoolUse {
            threads,
            seconds: seconds * threads as f64,
            busy_seconds,
            busy_fraction: busy_seconds / (seconds * threads.max(1) as f64),
            source_seconds: sum(&|m| get(&m.source.busy_ns)) as f64 / 1e9,
        };
        let bottleneck = bottleneck(&chain, stall, consumer, &stages, &pool);
        Report {
            kind: kind.into(),
            config: config.display().to_string(),
            seconds,
            chain,
            stages,
            pool,
            bottleneck,
            throughput: throughput(samples, stage_names),
            training,
            summary,
        }
    }

    /// Writes `report.json`, `report.html` and the plots (`*.svg`) into `dir`.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(dir.join("report.json"), json)?;
        let mut plots: Vec<(&str, String)> = Vec::new();
        plots.push((
            "throughput.svg",
            line_chart(
                "Throughput per stage",
                "time since start (s)",
                "rows per second",
                &self.throughput,
            ),
        ));
        if let Some(t) = &self.training {
            plots.push((
                "loss.svg",
                line_chart(
                    "Training loss",
                    "optimizer step",
                    "mean loss of the step",
                    &[
                        Series {
                            name: "training loss".into(),
                            points: t.loss.clone(),
                        },
                        Series {
                            name: "evaluation loss".into(),
                            points: t.eval_loss.clone(),
                        },
                    ],
                ),
            ));
            if !t.eval_accuracy.is_empty() {
                plots.push((
                    "accuracy.svg",
                    line_chart(
                        "Evaluation accuracy",
                        "optimizer step",
                        "accuracy (%)",
                        &[Series {
                            name: "held-out accuracy".into(),
                            points: t
                                .eval_accuracy
                                .iter()
                                .map(|(x, y)| (*x, 100.0 * y))
                                .collect(),
                        }],
                    ),
                ));
            }
        }
        for (name, svg) in &plots {
            std::fs::write(dir.join(name), svg)?;
        }
        std::fs::write(dir.join("report.html"), self.html(&plots))
    }

    fn html(&self, plots: &[(&str, String)]) -> String {
        let esc = |s: &str| {
            s.replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
        };
        let mut h = String::new();
        h.push_str("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
        h.push_str(&format!(
            "<title>sluice {} report: {}</title>",
            esc(&self.kind),
            esc(&self.config)
        ));
        h.push_str(
            "<style>body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;color:#222}\
             table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}\
             th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}\
             .bottleneck{background:#fff6e0;border-left:4px solid #e0a000;padding:0.6em 1em}\
             figure{margin:1.5em 0}</style></head><body>\n",
        );
        h.push_str(&format!(
            "<h1>sluice {}: {}</h1>\n<p>{:.2} s</p>\n",
            esc(&self.kind),
            esc(&self.config),
            self.seconds
        ));
        h.push_str(&format!(
            "<div class=\"bottleneck\"><b>Bottleneck: {}</b><br>{}<br><i>{}</i></div>\n",
            esc(&self.bottleneck.element),
            esc(&self.bottleneck.evidence),
            esc(&self.bottleneck.suggestion)
        ));
        if let Some(t) = &self.training {
            h.push_str("<h2>Training</h2><table><tr><th>measure</th><th>value</th></tr>");
            if let Some((step, loss)) = t.loss.last() {
                h.push_str(&format!(
                    "<tr><td>last recorded step</td><td>{step}</td></tr><tr><td>loss</td><td>{loss:.4}</td></tr>"
                ));
            }
            if let Some((step, acc)) = t.eval_accuracy.last() {
                h.push_str(&format!(
                    "<tr><td>evaluation accuracy (step {step})</td><td>{:.2}%</td></tr>",
                    100.0 * acc
                ));
            }
            if let Some(s) = t.data_stall_fraction {
                h.push_str(&format!(
                    "<tr><td>data stall (time waiting for batches)</td><td>{:.2}%</td></tr>",
                    100.0 * s
                ));
            }
            h.push_str("</table>\n");
        }
        h.push_str("<h2>Stages</h2><table><tr><th>stage</th><th>rows in</th><th>rows out</th><th>CPU seconds</th></tr>");
        for s in &self.stages {
            h.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.3}</td></tr>",
                esc(&s.name),
                s.rows_in,
                s.rows_out,
                s.busy_seconds
            ));
        }
        h.push_str(&format!(
            "</table>\n<p>CPU pool: {} threads, {:.0}% busy ({:.3} of {:.3} thread-seconds; the source's decode {:.3}).</p>\n",
            self.pool.threads,
            100.0 * self.pool.busy_fraction,
            self.pool.busy_seconds,
            self.pool.seconds,
            self.pool.source_seconds
        ));
        h.push_str("<h2>Queues</h2><p>Time each element waited to hand on a batch because the next one was busy (its output queue full), and its readiness: the share of its batches already waiting when the next element asked (≥ 99%: it is ahead).</p><table><tr><th>element</th><th>blocked (s)</th><th>of the run</th><th>ready</th></tr>");
        for e in &self.chain {
            if let (Some(b), Some(f)) = (e.output_blocked_seconds, e.output_blocked_fraction) {
                let ready = e
                    .output_readiness
                    .map_or("-".into(), |r| format!("{:.1}%", 100.0 * r));
                h.push_str(&format!(
                    "<tr><td>{}</td><td>{b:.3}</td><td>{:.1}%</td><td>{ready}</td></tr>",
                    esc(&e.name),
                    100.0 * f
                ));
            }
        }
        h.push_str("</table>\n");
        for (name, svg) in plots {
            h.push_str(&format!(
                "<figure>{svg}<figcaption>{}</figcaption></figure>\n",
                esc(name)
            ));
        }
        h.push_str("</body></html>\n");
        h
    }
}

/// The element right after the last queue whose producer was blocked for a good part of the
/// run: everything before it waits for it. No blocked queue: the source is the slowest.
/// Share of the CPU pool one stage must keep busy on its own (and at least half of all stage
/// CPU time) for a full queue in front of the consumer (or a window shuffle) to be blamed on it
/// rather than on the consumer: the consumer's conversion (tensors, encoding) and the shuffle's
/// steps run on the same pool, so a stage that crowds the pool slows them down. (The pool's threads also lose time to the
/// rest of the process and the machine: on the 2-core tabular bench the noise stage measured
/// 38–54% of the pool while it was, by a profile, where the CPU went.)
const HEAVY_POOL_SHARE: f64 = 1.0 / 3.0;

/// Share of the CPU pool's time its threads must run tasks for the pool itself to be named:
/// then every element waits for CPU and the full queues only say which waited longest. (The
/// figure counts wall time inside tasks, so threads the OS set aside still count as busy; on
/// the 2-core benches a pipeline that keeps up with nothing but the CPU measures ~0.95.)
const SATURATED: f64 = 0.85;

fn bottleneck(
    chain: &[ChainElement],
    stall: Option<f64>,
    consumer: &str,
    stages: &[StageTotals],
    pool: &PoolUse,
) -> Bottleneck {
    let pool_seconds = pool.seconds;
    let last_blocked = chain
        .iter()
        .rposition(|e| e.output_blocked_fraction.is_some_and(|f| f >= BLOCKED));
    let idx = last_blocked
        .map_or(0, |i| i + 1)
        .min(chain.len().saturating_sub(1));
    let name = chain.get(idx).map(|e| e.name.clone()).unwrap_or_default();
    if consumer == "trainer"
        && let Some(s) = stall
    {
        if s < STALL_OK {
            return Bottleneck {
                element: "trainer".into(),
                evidence: format!(
                    "the trainer waited for data {:.1}% of its loop: the pipeline keeps up",
                    100.0 * s
                ),
                suggestion: "the model step sets the pace: more workers (trainer.allreduce.workers, or more ranks under mpirun), a larger batch, or a faster device".into(),
            };
        }
        if name == "trainer" {
            return Bottleneck {
                element: "trainer".into(),
                evidence: format!(
                    "the pipeline's output queue is full yet the trainer waited {:.1}% of its loop (tensor conversion or the handshake between ranks)",
                    100.0 * s
                ),
                suggestion: "raise loader.prefetch so conversion overlaps the step".into(),
            };
        }
    }
    if name != "trainer"
        && let Some(b) = saturated(pool, stages, consumer)
    {
        return b;
    }
    let heaviest = stages
        .iter()
        .max_by(|a, b| a.busy_seconds.total_cmp(&b.busy_seconds))
        .filter(|s| {
            let total: f64 = stages.iter().map(|s| s.busy_seconds).sum();
            pool_seconds > 0.0
                && s.busy_seconds >= HEAVY_POOL_SHARE * pool_seconds
                && s.busy_seconds >= 0.5 * total
        });
    // What the element in front of the full queue runs on the CPU pool, where a heavy stage
    // crowds it: the consumer's conversion, or a window shuffle's steps (one at a time, each
    // waiting behind the stages' queued jobs).
    let on_pool = if name == consumer && consumer != "trainer" {
        Some(format!("the {consumer}'s conversion runs"))
    } else if name.ends_with(" shuffle") {
        Some(format!("`{name}`'s steps run"))
    } else {
        None
    };
    if let Some(on_pool) = on_pool
        && idx > 0
        && let Some(h) = heaviest
    {
        let total: f64 = stages.iter().map(|s| s.busy_seconds).sum();
        return Bottleneck {
            element: h.name.clone(),
            evidence: format!(
                "the queue in front of `{name}` was full, but `{}` kept the CPU pool {:.0}% busy on its own ({:.0}% of all stage CPU time), and {on_pool} on the same pool",
                h.name,
                100.0 * h.busy_seconds / pool_seconds,
                100.0 * h.busy_seconds / total.max(1e-9)
            ),
            suggestion: format!(
                "the CPU pool sets the pace, mostly `{}`: make it cheaper or raise runtime.threads",
                h.name
            ),
        };
    }
    let evidence = match last_blocked.and_then(|i| chain.get(i)) {
        Some(before) => format!(
            "`{}` waited {:.1}% of the run for room in its output queue: `{name}` is slower than what feeds it",
            before.name,
            100.0 * before.output_blocked_fraction.unwrap_or(0.0)
        ),
        None => "no queue filled up: every element waits on the source".into(),
    };
    let suggestion = if idx == 0 {
        "the source sets the pace: raise runtime.threads (decode parallelism), read larger row groups (source.batch_rows), or for object stores more concurrent reads".to_string()
    } else if name == consumer {
        if consumer == "trainer" {
            "the trainer sets the pace: more workers or a faster model step".into()
        } else if consumer == "consumer" {
            "the consumer sets the pace: tensor conversion (loader.prefetch) or the training step"
                .into()
        } else {
            "the sink sets the pace: more output parallelism (larger files, faster storage) or a faster broker".into()
        }
    } else if name.contains("shuffle") {
        "the shuffle sets the pace: it is one task per window; a smaller buffer_rows, or a larger max_memory if it spills"
            .into()
    } else {
        format!(
            "`{name}` sets the pace: raise runtime.threads (CPU stages run on the pool) or make the stage cheaper"
        )
    };
    Bottleneck {
        element: name,
        evidence,
        suggestion,
    }
}

/// The CPU pool named when it was [`SATURATED`]: the element with the largest share of it (the
/// source's decode, a stage, or the consumer's conversion with the rest), every share given.
fn saturated(pool: &PoolUse, stages: &[StageTotals], consumer: &str) -> Option<Bottleneck> {
    if pool.seconds <= 0.0 || pool.busy_fraction < SATURATED {
        return None;
    }
    let staged: f64 = stages.iter().map(|s| s.busy_seconds).sum();
    let rest = match consumer {
        "sink" => "the sink's encoding and the rest",
        _ => "tensor conversion and the rest",
    };
    let mut shares: Vec<(String, f64)> = vec![("source".into(), pool.source_seconds)];
    shares.extend(stages.iter().map(|s| (s.name.clone(), s.busy_seconds)));
    let other = (pool.busy_seconds - pool.source_seconds - staged).max(0.0);
    let (largest, _) = shares
        .iter()
        .chain([(consumer.to_string(), other)].iter())
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .cloned()?;
    let pct = |v: f64| 100.0 * v / pool.busy_seconds.max(1e-9);
    let mut parts: Vec<String> = shares
        .iter()
        .map(|(n, v)| match n.as_str() {
            "source" => format!("the source's decode {:.0}%", pct(*v)),
            _ => format!("`{n}` {:.0}%", pct(*v)),
        })
        .collect();
    parts.push(format!("{rest} {:.0}%", pct(other)));
    let what = match largest.as_str() {
        "source" => "the source's decode (fewer columns, or a cheaper codec)".to_string(),
        n if n == consumer => format!("the {consumer}'s work (loader.dtype, a smaller batch)"),
        n => format!("`{n}`"),
    };
    Some(Bottleneck {
        element: largest,
        evidence: format!(
            "the CPU pool was {:.0}% busy ({} threads): every element waits for CPU, so full queues only say which waited longest; of its time: {}",
            100.0 * pool.busy_fraction,
            pool.threads,
            parts.join(", ")
        ),
        suggestion: format!(
            "the pipeline is CPU-bound: raise runtime.threads where the host has idle cores, or make the largest share cheaper: {what}"
        ),
    })
}

/// Rows per second between consecutive samples: the source, each stage, the output.
fn throughput(samples: &[Sample], stage_names: &[String]) -> Vec<Series> {
    let rate = |f: &dyn Fn(&Sample) -> Option<u64>| -> Vec<(f64, f64)> {
        samples
            .windows(2)
            .filter_map(|w| {
                let dt = w[1].seconds - w[0].seconds;
                let (a, b) = (f(&w[0])?, f(&w[1])?);
                (dt > 0.0).then(|| (w[1].seconds, b.saturating_sub(a) as f64 / dt))
            })
            .collect()
    };
    let mut out = vec![Series {
        name: "source".into(),
        points: rate(&|s| Some(s.source_rows)),
    }];
    for (i, name) in stage_names.iter().enumerate() {
        out.push(Series {
            name: name.clone(),
            points: rate(&|s| s.stage_rows.get(i).copied()),
        });
    }
    out.push(Series {
        name: "output".into(),
        points: rate(&|s| Some(s.output_rows)),
    });
    out
}

/// An SVG line chart with a title, labelled axes and a legend.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (860, 420)).into_drawing_area();
        if let Err(e) = draw(&root, title, x_label, y_label, series) {
            tracing::warn!("drawing {title}: {e}");
        }
        let _ = root.present();
    }
    svg
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

fn draw(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> DrawResult {
    root.fill(&WHITE)?;
    let points = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for (x, y) in points {
        if x.is_finite() && y.is_finite() {
            x0 = x0.min(*x);
            x1 = x1.max(*x);
            y1 = y1.max(*y);
        }
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= 0.0 {
        y1 = 1.0;
    }
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(80)
        .build_cartesian_2d(x0..x1, 0.0..y1 * 1.08)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|v| human(*v))
        .y_label_formatter(&|v| human(*v))
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        if s.points.is_empty() {
            continue;
        }
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                s.points
                    .iter()
                    .copied()
                    .filter(|(x, y)| x.is_finite() && y.is_finite()),
                color.stroke_width(2),
            ))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    Ok(())
}

/// 1234567 → "1.23M".
fn human(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of 2 threads with `seconds` of capacity, busy for `busy` of them (the source's
    /// decode `source` of that).
    fn pool(seconds: f64, busy: f64, source: f64) -> PoolUse {
        PoolUse {
            threads: 2,
            seconds,
            busy_seconds: busy,
            busy_fraction: busy / seconds,
            source_seconds: source,
        }
    }

    fn el(name: &str, f: Option<f64>) -> ChainElement {
        ChainElement {
            name: name.into(),
            output_blocked_seconds: f,
            output_blocked_fraction: f,
            output_readiness: None,
        }
    }

    #[test]
    fn the_element_after_the_last_full_queue_is_the_bottleneck() {
        let chain = [
            el("source", Some(0.9)),
            el("#0 image", Some(0.5)),
            el("#1 batch", Some(0.01)),
            el("sink", None),
        ];
        let none: [StageTotals; 0] = [];
        let bottleneck = |c: &[ChainElement], stall, consumer| {
            bottleneck(c, stall, consumer, &none, &pool(1.0, 0.1, 0.0))
        };
        assert_eq!(bottleneck(&chain, None, "sink").element, "#1 batch");
        let free = [
            el("source", Some(0.0)),
            el("#0 cast", Some(0.0)),
            el("sink", None),
        ];
        assert_eq!(bottleneck(&free, None, "sink").element, "source");
        let all = [
            el("source", Some(0.9)),
            el("#0 cast", Some(0.9)),
            el("sink", None),
        ];
        let b = bottleneck(&all, None, "sink");
        assert_eq!(b.element, "sink");
        assert!(b.suggestion.contains("sink"));
        let train = [el("source", Some(0.0)), el("trainer", None)];
        assert_eq!(bottleneck(&train, Some(0.01), "trainer").element, "trainer");
        assert_eq!(bottleneck(&train, Some(0.5), "trainer").element, "source");
    }

    /// A full queue in front of the consumer while one stage saturates the CPU pool names the
    /// stage; a light pool leaves the consumer named.
    #[test]
    fn a_stage_saturating_the_pool_is_named_over_the_consumer() {
        let chain = [
            el("source", Some(0.0)),
            el("#0 gaussian_noise", Some(0.0)),
            el("#1 batch", Some(0.45)),
            el("consumer", None),
        ];
        let st = |name: &str, busy: f64| StageTotals {
            name: name.into(),
            rows_in: 0,
            rows_out: 0,
            busy_seconds: busy,
        };
        let heavy = [st("#0 gaussian_noise", 5.0), st("#1 batch", 0.1)];
        // 2 threads × 3.5 s: the noise stage kept the pool 71% busy.
        let b = bottleneck(&chain, None, "consumer", &heavy, &pool(7.0, 5.6, 0.3));
        assert_eq!(b.element, "#0 gaussian_noise");
        assert!(b.evidence.contains("71% busy"), "{}", b.evidence);
        assert!(b.suggestion.contains("make it cheaper"), "{}", b.suggestion);
        let light = [st("#0 gaussian_noise", 1.0), st("#1 batch", 0.1)];
        assert_eq!(
            bottleneck(&chain, None, "consumer", &light, &pool(7.0, 5.6, 0.3)).element,
            "consumer"
        );
        // A full queue further up still names the element after it.
        let up = [
            el("source", Some(0.6)),
            el("#0 gaussian_noise", Some(0.0)),
            el("consumer", None),
        ];
        assert_eq!(
            bottleneck(&up, None, "consumer", &heavy, &pool(7.0, 5.6, 0.3)).element,
            "#0 gaussian_noise"
        );
        // A window shuffle's steps wait behind the heavy stage's jobs on the same pool: the
        // full queue in front of it names the stage that crowds the pool.
        let shuffled = [
            el("source", Some(0.9)),
            el("#0 shuffle", Some(0.0)),
            el("#1 gaussian_noise", Some(0.0)),
            el("consumer", None),
        ];
        let busy = [
            st("#0 shuffle", 0.4),
            st("#1 gaussian_noise", 5.0),
            st("#2 batch", 0.1),
        ];
        let b = bottleneck(&shuffled, None, "consumer", &busy, &pool(7.0, 5.6, 0.3));
        assert_eq!(b.element, "#1 gaussian_noise");
        assert!(
            b.evidence.contains("`#0 shuffle`'s steps"),
            "{}",
            b.evidence
        );
        let idle = [st("#0 shuffle", 0.4), st("#1 gaussian_noise", 1.0)];
        let b = bottleneck(&shuffled, None, "consumer", &idle, &pool(7.0, 5.6, 0.3));
        assert_eq!(b.element, "#0 shuffle");
        assert!(b.suggestion.contains("buffer_rows"), "{}", b.suggestion);
        // The trainer computes on its own threads: a busy pool does not excuse it.
        let train = [
            el("source", Some(0.0)),
            el("#0 batch", Some(0.5)),
            el("trainer", None),
        ];
        assert_eq!(
            bottleneck(&train, None, "trainer", &heavy, &pool(7.0, 5.6, 0.3)).element,
            "trainer"
        );
    }

    /// A pool busy ≥ 85% of its time names its largest share, whichever queue filled up,
    /// with every share in the evidence; the trainer's own verdicts still come first.
    #[test]
    fn a_saturated_pool_names_its_largest_share() {
        let chain = [
            el("source", Some(0.9)),
            el("#0 shuffle", Some(0.0)),
            el("#1 gaussian_noise", Some(0.0)),
            el("#2 batch", Some(0.0)),
            el("consumer", None),
        ];
        let st = |name: &str, busy: f64| StageTotals {
            name: name.into(),
            rows_in: 0,
            rows_out: 0,
            busy_seconds: busy,
        };
        let stages = [
            st("#0 shuffle", 0.8),
            st("#1 gaussian_noise", 2.5),
            st("#2 batch", 0.2),
        ];
        // 2 threads × 3.5 s, 6.8 s busy (97%), 2.9 s of it the decode.
        let b = bottleneck(&chain, None, "consumer", &stages, &pool(7.0, 6.8, 2.9));
        assert_eq!(b.element, "source");
        for part in [
            "97% busy",
            "the source's decode 43%",
            "`#0 shuffle` 12%",
            "`#1 gaussian_noise` 37%",
            "`#2 batch` 3%",
            "tensor conversion and the rest 6%",
        ] {
            assert!(b.evidence.contains(part), "{part}: {}", b.evidence);
        }
        assert!(b.suggestion.contains("runtime.threads"), "{}", b.suggestion);
        let b = bottleneck(&chain, None, "consumer", &stages, &pool(7.0, 6.8, 1.0));
        assert_eq!(b.element, "#1 gaussian_noise");
        assert!(
            b.suggestion.contains("`#1 gaussian_noise`"),
            "{}",
            b.suggestion
        );
        // Most of the pool outside the source and the stages: the consumer's conversion.
        let b = bottleneck(&chain, None, "sink", &stages, &pool(7.0, 6.8, 0.1));
        assert_eq!(b.element, "sink");
        assert!(
            b.evidence.contains("the sink's encoding and the rest 47%"),
            "{}",
            b.evidence
        );
        // Below the threshold the queues decide (and the heavy stage behind the shuffle).
        let b = bottleneck(&chain, None, "consumer", &stages, &pool(7.0, 5.6, 2.9));
        assert_eq!(b.element, "#1 gaussian_noise");
        assert!(
            b.evidence.contains("`#0 shuffle`'s steps"),
            "{}",
            b.evidence
        );
        // A trainer that keeps the pipeline waiting is named, however busy the pool.
        let train = [el("source", Some(0.0)), el("trainer", None)];
        let b = bottleneck(&train, Some(0.01), "trainer", &stages, &pool(7.0, 6.8, 2.9));
        assert_eq!(b.element, "trainer");
    }

    #[test]
    fn charts_are_svg_with_title_axes_and_legend() {
        let svg = line_chart(
            "Throughput per stage",
            "time since start (s)",
            "rows per second",
            &[Series {
                name: "source".into(),
                points: vec![(0.5, 1000.0), (1.0, 2500.0), (1.5, 2000.0)],
            }],
        );
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        for text in [
            "Throughput per stage",
            "time since start (s)",
            "rows per second",
            "source",
            "1000",
        ] {
            assert!(svg.contains(text), "missing {text}");
        }
        assert!(svg.contains("<polyline"));
    }
}
