//! Live training counters for a metrics endpoint and the run report: the step, loss, time
//! split (data wait, step, all-reduce) of rank 0, every rank's pipeline counters, and a
//! bounded history of steps and evaluations for the curves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_pipeline::PipelineMetrics;

/// Points kept per curve; beyond it every other point is dropped and the stride doubles, so
/// a week-long run keeps its whole shape in bounded memory.
const MAX_POINTS: usize = 4096;

/// What one gradient exchange cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReduceCost {
    /// Time in the collective.
    pub collective: Duration,
    /// Time compressing and decompressing (selection, factorisation, conversions), outside
    /// the collective.
    pub compress: Duration,
    /// Payload bytes this rank sent.
    pub wire_bytes: u64,
    /// What the same gradients would have cost as f32 (`4 × values`).
    pub dense_bytes: u64,
}

/// One step of rank 0, as recorded in the history.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepPoint {
    /// The optimizer step.
    pub step: u64,
    /// Seconds since the run started.
    pub seconds: f64,
    /// Mean loss of the step (all ranks).
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Rows of the step (all ranks).
    pub rows: u64,
    /// Milliseconds rank 0 waited for this batch.
    pub wait_ms: f64,
}

#[derive(Debug, Default)]
struct History {
    steps: Vec<StepPoint>,
    stride: u64,
    evals: Vec<EvalReport>,
}

/// Counters of a training run. Rank 0 updates the step counters; every rank registers its
/// pipeline.
#[derive(Debug)]
pub struct TrainingMetrics {
    started: Instant,
    /// Optimizer steps done (this run and those before a resume).
    pub steps: AtomicU64,
    /// Rows trained (all ranks).
    pub rows: AtomicU64,
    loss: AtomicU64,
    lr: AtomicU64,
    /// Nanoseconds in steps (forward excluded: backward, all-reduce, optimizer).
    pub step_ns: AtomicU64,
    /// Nanoseconds rank 0 waited for data.
    pub data_wait_ns: AtomicU64,
    /// Nanoseconds rank 0 spent in collectives.
    pub allreduce_ns: AtomicU64,
    /// Gradient bytes rank 0 sent (compressed as configured).
    pub wire_bytes: AtomicU64,
    /// What the same gradients would have been as f32.
    pub dense_bytes: AtomicU64,
    /// Nanoseconds rank 0 spent compressing and decompressing gradients.
    pub compress_ns: AtomicU64,
    eval_accuracy: AtomicU64,
    eval_loss: AtomicU64,
    pipelines: Mutex<Vec<(usize, Arc<PipelineMetrics>)>>,
    history: Mutex<History>,
}

impl Default for TrainingMetrics {
    fn default() -> Self {
        TrainingMetrics {
            started: Instant::now(),
            steps: AtomicU64::new(0),
            rows: AtomicU64::new(0),
            loss: AtomicU64::new(f64::NAN.to_bits()),
            lr: AtomicU64::new(f64::NAN.to_bits()),
            step_ns: AtomicU64::new(0),
            data_wait_ns: AtomicU64::new(0),
            allreduce_ns: AtomicU64::new(0),
            wire_bytes: AtomicU64::new(0),
            dense_bytes: AtomicU64::new(0),
            compress_ns: AtomicU64::new(0),
            eval_accuracy: AtomicU64::new(f64::NAN.to_bits()),
            eval_loss: AtomicU64::new(f64::NAN.to_bits()),
            pipelines: Mutex::new(Vec::new()),
            history: Mutex::new(History {
                stride: 1,
                ..History::default()
            }),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl TrainingMetrics {
    /// Registers a rank's pipeline counters.
    pub fn add_pipeline(&self, rank: usize, metrics: Arc<PipelineMetrics>) {
        if let Ok(mut p) = self.pipelines.lock() {
            p.retain(|(r, _)| *r != rank);
            p.push((rank, metrics));
            p.sort_by_key(|(r, _)| *r);
        }
    }

    /// Every registered pipeline, by rank.
    pub fn pipelines(&self) -> Vec<(usize, Arc<PipelineMetrics>)> {
        self.pipelines.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Records a step of rank 0.
    #[allow(clippy::too_many_arguments)]
    pub fn record_step(
        &self,
        step: u64,
        rows: u64,
        loss: f64,
        lr: f64,
        waited: Duration,
        step_time: Duration,
        exchange: &ReduceCost,
    ) {
        self.steps.store(step, Ordering::Relaxed);
        self.rows.fetch_add(rows, Ordering::Relaxed);
        self.loss.store(loss.to_bits(), Ordering::Relaxed);
        self.lr.store(lr.to_bits(), Ordering::Relaxed);
        self.data_wait_ns
            .fetch_add(nanos(waited), Ordering::Relaxed);
        self.step_ns.fetch_add(nanos(step_time), Ordering::Relaxed);
        self.allreduce_ns
            .fetch_add(nanos(exchange.collective), Ordering::Relaxed);
        self.wire_bytes
            .fetch_add(exchange.wire_bytes, Ordering::Relaxed);
        self.dense_bytes
            .fetch_add(exchange.dense_bytes, Ordering::Relaxed);
        self.compress_ns
            .fetch_add(nanos(exchange.compress), Ordering::Relaxed);
        if let Ok(mut h) = self.history.lock()
            && step.is_multiple_of(h.stride)
        {
            h.steps.push(StepPoint {
                step,
                seconds: self.started.elapsed().as_secs_f64(),
                loss,
                lr,
                rows,
                wait_ms: waited.as_secs_f64() * 1e3,
            });
            if h.steps.len() >= MAX_POINTS {
                let stride = h.stride * 2;
                h.steps.retain(|p| p.step.is_multiple_of(stride));
                h.stride = stride;
            }
        }
    }

    /// Sets the step count and rows of a resumed run.
    pub fn resumed(&self, step: u64, rows: u64) {
        self.steps.store(step, Ordering::Relaxed);
        self.rows.store(rows, Ordering::Relaxed);
    }

    /// Records an evaluation.
    pub fn record_eval(&self, eval: &EvalReport) {
        self.eval_loss.store(eval.loss.to_bits(), Ordering::Relaxed);
        if let Some(a) = eval.accuracy {
            self.eval_accuracy.store(a.to_bits(), Ordering::Relaxed);
        }
        if let Ok(mut h) = self.history.lock() {
            h.evals.push(eval.clone());
        }
    }

    /// Loss of the latest step (NaN before the first).
    pub fn loss(&self) -> f64 {
        f64::from_bits(self.loss.load(Ordering::Relaxed))
    }

    /// Learning rate of the latest step (NaN before the first).
    pub fn learning_rate(&self) -> f64 {
        f64::from_bits(self.lr.load(Ordering::Relaxed))
    }

    /// Accuracy of the latest evaluation (NaN before the first, or without accuracy).
    pub fn eval_accuracy(&self) -> f64 {
        f64::from_bits(self.eval_accuracy.load(Ordering::Relaxed))
    }

    /// Loss of the latest evaluation (NaN before the first).
    pub fn eval_loss(&self) -> f64 {
        f64::from_bits(self.eval_loss.load(Ordering::Relaxed))
    }

    /// The recorded steps (every `stride`-th once the run is long) and evaluations.
    pub fn history(&self) -> (Vec<StepPoint>, Vec<EvalReport>) {
        self.history
            .lock()
            .map(|h| (h.steps.clone(), h.evals.clone()))
            .unwrap_or_default()
    }
}

/// An evaluation's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalReport {
    /// Step after which it ran.
    pub step: u64,
    /// Mean loss.
    pub loss: f64,
    /// Fraction of correct argmax predictions (cross-entropy only).
    pub accuracy: Option<f64>,
    /// Rows evaluated.
    pub rows: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_stays_bounded_and_keeps_the_whole_run() {
        let m = TrainingMetrics::default();
        let n = 3 * MAX_POINTS as u64;
        for step in 1..=n {
            m.record_step(
                step,
                8,
                1.0 / step as f64,
                0.1,
                Duration::ZERO,
                Duration::ZERO,
                &ReduceCost::default(),
            );
        }
        let (steps, _) = m.history();
        assert!(steps.len() < MAX_POINTS);
        assert!(steps.len() > MAX_POINTS / 4);
        let last = steps.last().map(|p| p.step).unwrap_or(0);
        assert!(last > n - n / 8, "the end of the run is kept: {last}");
        assert!(steps.windows(2).all(|w| w[0].step < w[1].step));
        assert_eq!(m.rows.load(Ordering::Relaxed), 8 * n);
        assert_eq!(m.loss(), 1.0 / n as f64);
    }
}
