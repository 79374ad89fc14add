//! What a running `sluice run`/`sluice train` shows the outside: a Prometheus (OpenMetrics)
//! endpoint read straight from the live counters at each scrape, and a sampler that keeps
//! a bounded time series of them for the run report (see the `report` module).
//!
//! Every metric is written down in `docs/metrics.md`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use sluice_pipeline::PipelineMetrics;

#[cfg(feature = "torch")]
use sluice_trainer::TrainingMetrics;

/// The live counters of one run: the pipeline of each rank and, for training, the trainer's.
#[derive(Debug)]
pub struct Observed {
    started: Instant,
    pipelines: Mutex<Vec<(usize, Arc<PipelineMetrics>)>>,
    /// Training counters (`sluice train`).
    #[cfg(feature = "torch")]
    pub training: Option<Arc<TrainingMetrics>>,
}

impl Default for Observed {
    fn default() -> Self {
        Observed {
            started: Instant::now(),
            pipelines: Mutex::new(Vec::new()),
            #[cfg(feature = "torch")]
            training: None,
        }
    }
}

impl Observed {
    /// Observes a training run.
    #[cfg(feature = "torch")]
    pub fn training(training: Arc<TrainingMetrics>) -> Self {
        Observed {
            training: Some(training),
            ..Observed::default()
        }
    }

    /// Adds the pipeline of `rank` (a `sluice run` has one, rank 0).
    pub fn add_pipeline(&self, rank: usize, metrics: Arc<PipelineMetrics>) {
        if let Ok(mut p) = self.pipelines.lock() {
            p.push((rank, metrics));
        }
    }

    /// Every observed pipeline, by rank.
    pub fn pipelines(&self) -> Vec<(usize, Arc<PipelineMetrics>)> {
        let all = self.pipelines.lock().map(|p| p.clone()).unwrap_or_default();
        #[cfg(feature = "torch")]
        let all = match &self.training {
            Some(t) => all.into_iter().chain(t.pipelines()).collect(),
            None => all,
        };
        all
    }

    /// Seconds since the run started.
    pub fn seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The OpenMetrics text exposition of every counter, as of now.
    pub fn render(self: &Arc<Self>) -> String {
        let mut registry = Registry::with_prefix("sluice");
        registry.register_collector(Box::new(Scrape(self.clone())));
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
            tracing::warn!("encoding metrics: {e}");
        }
        out
    }
}

/// `stages[2] (clip) at configs/x.yaml:17:5` → `#2 clip`; other names unchanged.
pub fn short_name(name: &str) -> String {
    let head = name.split(" at ").next().unwrap_or(name);
    match head
        .strip_prefix("stages[")
        .and_then(|r| r.split_once("] ("))
        .and_then(|(i, kind)| Some((i, kind.strip_suffix(')')?)))
    {
        Some((i, kind)) => format!("#{i} {kind}"),
        None => head.to_string(),
    }
}

fn ns(v: u64) -> f64 {
    v as f64 / 1e9
}

/// One metric family: name, help, samples (labels, value).
struct Family {
    name: &'static str,
    help: &'static str,
    counter: bool,
    samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl Family {
    fn counter(name: &'static str, help: &'static str) -> Self {
        Family {
            name,
            help,
            counter: true,
            samples: Vec::new(),
        }
    }

    fn gauge(name: &'static str, help: &'static str) -> Self {
        Family {
            name,
            help,
            counter: false,
            samples: Vec::new(),
        }
    }

    fn add(&mut self, labels: Vec<(&'static str, String)>, value: f64) {
        self.samples.push((labels, value));
    }

    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        if self.samples.is_empty() {
            return Ok(());
        }
        let kind = if self.counter {
            ConstCounter::new(0.0f64).metric_type()
        } else {
            ConstGauge::new(0.0f64).metric_type()
        };
        let mut metric = encoder.encode_descriptor(self.name, self.help, None, kind)?;
        for (labels, value) in &self.samples {
            let family = metric.encode_family(labels)?;
            if self.counter {
                ConstCounter::new(*value).encode(family)?;
            } else {
                ConstGauge::new(*value).encode(family)?;
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Scrape(Arc<Observed>);

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for f in families(&self.0) {
            f.encode(&mut encoder)?;
        }
        Ok(())
    }
}

fn families(o: &Observed) -> Vec<Family> {
    use Family as F;
    let get = PipelineMetrics::get;
    let mut source = SourceFamilies::new();
    let mut stages = StageFamilies::new();
    let mut queues = QueueFamilies::new();
    let mut out_rows = F::counter("output_rows", "Rows delivered by the pipeline");
    let mut out_batches = F::counter("output_batches", "Batches delivered by the pipeline");
    let mut out_bytes = F::counter("output_bytes", "Arrow bytes delivered by the pipeline");
    let mut pool_busy = F::counter(
        "pool_busy_seconds",
        "Seconds the CPU pool's threads ran tasks (decode, stages, conversion), summed over them",
    );
    let mut pool_threads = F::gauge("pool_threads", "Threads of the CPU pool");
    for (rank, m) in o.pipelines() {
        let r = || vec![("rank", rank.to_string())];
        source.add(rank, &m);
        stages.add(rank, &m);
        queues.add(rank, &m);
        out_rows.add(r(), get(&m.rows_out) as f64);
        out_batches.add(r(), get(&m.batches_out) as f64);
        out_bytes.add(r(), get(&m.bytes_out) as f64);
        pool_busy.add(r(), ns(get(&m.pool_busy_ns)));
        pool_threads.add(r(), get(&m.pool_threads) as f64);
    }
    let mut all = source.into_families();
    all.extend(stages.into_families());
    all.extend(queues.into_families());
    all.extend([out_rows, out_batches, out_bytes, pool_busy, pool_threads]);
    let mut up = F::gauge("uptime_seconds", "Seconds since the run started");
    up.add(Vec::new(), o.seconds());
    all.push(up);
    #[cfg(feature = "torch")]
    if let Some(t) = &o.training {
        all.extend(training_families(t));
    }
    all
}

/// The source's families: rows and bytes read, bad records, the shard policy's remainders,
/// replayed rows, and each Kafka partition's records and lag.
struct SourceFamilies {
    src_rows: Family,
    src_read: Family,
    src_decoded: Family,
    src_busy: Family,
    bad: Family,
    dead: Family,
    shard_left_out: Family,
    src_replayed: Family,
    shard_repeated: Family,
    part_records: Family,
    part_lag: Family,
}

impl SourceFamilies {
    /// The families, with no samples yet.
    fn new() -> Self {
        use Family as F;
        SourceFamilies {
            src_rows: F::counter("source_rows", "Rows read by the source"),
            src_read: F::counter(
                "source_bytes_read",
                "Bytes read by the source (compressed Parquet, Kafka message bytes)",
            ),
            src_decoded: F::counter(
                "source_bytes_decoded",
                "Arrow bytes the source decoded into",
            ),
            src_busy: F::counter(
                "source_busy_seconds",
                "Seconds of the CPU pool's time the source's decode took, summed over its tasks",
            ),
            bad: F::counter(
                "source_records_bad",
                "Records that could not be decoded (errors)",
            ),
            dead: F::counter(
                "source_records_dead_lettered",
                "Bad records written to the dead-letter sink",
            ),
            shard_left_out: F::counter(
                "source_shard_left_out_rows",
                "Rows the shard policy gave to no rank (drop_last, redistribute's remainder), all epochs read",
            ),
            src_replayed: F::counter(
                "source_replayed_rows",
                "Rows a resumed run read again and passed over before its first reordering stage (delivered before the checkpoint)",
            ),
            shard_repeated: F::counter(
                "source_shard_repeated_rows",
                "Rows shard: pad gave a second time, over all ranks and epochs read",
            ),
            part_records: F::counter(
                "kafka_partition_records",
                "Records read from a Kafka partition",
            ),
            part_lag: F::gauge(
                "kafka_partition_lag",
                "Records between a Kafka partition's read position and its end (-1: unknown)",
            ),
        }
    }

    /// Adds the samples of `rank`'s source.
    fn add(&mut self, rank: usize, m: &PipelineMetrics) {
        let get = PipelineMetrics::get;
        let r = || vec![("rank", rank.to_string())];
        let s = &m.source;
        self.src_rows.add(r(), get(&s.rows) as f64);
        self.src_read.add(r(), get(&s.bytes_read) as f64);
        self.src_decoded.add(r(), get(&s.bytes_decoded) as f64);
        self.src_busy.add(r(), ns(get(&s.busy_ns)));
        self.bad.add(r(), get(&s.records_bad) as f64);
        self.dead.add(r(), get(&s.records_dead_lettered) as f64);
        self.shard_left_out.add(r(), get(&s.shard_left_out) as f64);
        self.shard_repeated.add(r(), get(&s.shard_repeated) as f64);
        self.src_replayed.add(r(), get(&s.rows_replayed) as f64);
        for (name, p) in s.partitions() {
            let l = vec![("rank", rank.to_string()), ("partition", name.clone())];
            self.part_records.add(l.clone(), p.records as f64);
            self.part_lag.add(l, p.lag as f64);
        }
    }

    /// The families, in the order they are exposed.
    fn into_families(self) -> Vec<Family> {
        vec![
            self.src_rows,
            self.src_read,
            self.src_decoded,
            self.src_busy,
            self.bad,
            self.dead,
            self.shard_left_out,
            self.shard_repeated,
            self.src_replayed,
            self.part_records,
            self.part_lag,
        ]
    }
}

/// Each stage's families: rows in, out, removed and replayed, and CPU seconds.
struct StageFamilies {
    st_in: Family,
    st_out: Family,
    st_removed: Family,
    st_replayed: Family,
    st_busy: Family,
}

impl StageFamilies {
    /// The families, with no samples yet.
    fn new() -> Self {
        use Family as F;
        StageFamilies {
            st_in: F::counter("stage_rows_in", "Rows into a stage"),
            st_out: F::counter("stage_rows_out", "Rows out of a stage"),
            st_removed: F::counter(
                "stage_rows_removed",
                "Rows a stage's rules removed: filtered out, bad images skipped (on_error: skip), drop_last tails",
            ),
            st_replayed: F::counter(
                "stage_rows_replayed",
                "Rows into a stage that a resumed run had delivered before its checkpoint (a shuffle rebuilding its window): taken in, not emitted again",
            ),
            st_busy: F::counter(
                "stage_busy_seconds",
                "CPU seconds a stage spent working (summed over its parallel tasks)",
            ),
        }
    }

    /// Adds the samples of `rank`'s stages.
    fn add(&mut self, rank: usize, m: &PipelineMetrics) {
        let get = PipelineMetrics::get;
        for st in m.stages() {
            let l = vec![("rank", rank.to_string()), ("stage", short_name(&st.name))];
            self.st_in.add(l.clone(), get(&st.rows_in) as f64);
            self.st_out.add(l.clone(), get(&st.rows_out) as f64);
            self.st_removed.add(l.clone(), get(&st.rows_removed) as f64);
            self.st_replayed
                .add(l.clone(), get(&st.rows_replayed) as f64);
            self.st_busy.add(l, ns(get(&st.busy_ns)));
        }
    }

    /// The families, in the order they are exposed.
    fn into_families(self) -> Vec<Family> {
        vec![
            self.st_in,
            self.st_out,
            self.st_removed,
            self.st_replayed,
            self.st_busy,
        ]
    }
}

/// Each queue's families: batches and bytes through it, bytes in it now, and the seconds
/// its producer and consumer waited.
struct QueueFamilies {
    q_pushed: Family,
    q_popped: Family,
    q_bytes_in: Family,
    q_bytes_out: Family,
    q_bytes: Family,
    q_blocked: Family,
    q_waited: Family,
    q_ready: Family,
}

impl QueueFamilies {
    /// The families, with no samples yet.
    fn new() -> Self {
        use Family as F;
        QueueFamilies {
            q_pushed: F::counter("queue_batches_pushed", "Batches put into a queue"),
            q_popped: F::counter("queue_batches_popped", "Batches taken from a queue"),
            q_bytes_in: F::counter("queue_bytes_pushed", "Arrow bytes put into a queue"),
            q_bytes_out: F::counter(
                "queue_bytes_popped",
                "Arrow bytes taken from a queue (the bytes into the stage it feeds)",
            ),
            q_bytes: F::gauge("queue_bytes", "Arrow bytes in a queue now"),
            q_blocked: F::counter(
                "queue_send_blocked_seconds",
                "Seconds the producer of a queue waited for room: downstream is slower",
            ),
            q_waited: F::counter(
                "queue_recv_waited_seconds",
                "Seconds the consumer of a queue waited for a batch: upstream is slower",
            ),
            q_ready: F::counter(
                "queue_batches_ready",
                "Batches already waiting when the consumer of a queue asked (readiness = ready / popped)",
            ),
        }
    }

    /// Adds the samples of `rank`'s queues.
    fn add(&mut self, rank: usize, m: &PipelineMetrics) {
        let get = PipelineMetrics::get;
        for (name, q) in m.queues() {
            let l = vec![("rank", rank.to_string()), ("queue", short_name(&name))];
            self.q_pushed.add(l.clone(), get(&q.pushed) as f64);
            self.q_popped.add(l.clone(), get(&q.popped) as f64);
            self.q_bytes_in.add(l.clone(), get(&q.bytes_pushed) as f64);
            self.q_bytes_out.add(l.clone(), get(&q.bytes_popped) as f64);
            self.q_bytes.add(l.clone(), q.bytes_queued() as f64);
            self.q_blocked.add(l.clone(), ns(get(&q.send_blocked_ns)));
            self.q_waited.add(l.clone(), ns(get(&q.recv_waited_ns)));
            self.q_ready.add(l, get(&q.ready) as f64);
        }
    }

    /// The families, in the order they are exposed.
    fn into_families(self) -> Vec<Family> {
        vec![
            self.q_pushed,
            self.q_popped,
            self.q_bytes_in,
            self.q_bytes_out,
            self.q_bytes,
            self.q_blocked,
            self.q_waited,
            self.q_ready,
        ]
    }
}

#[cfg(feature = "torch")]
fn training_families(t: &TrainingMetrics) -> Vec<Family> {
    use Family as F;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let one = |mut f: Family, v: f64| {
        if !v.is_nan() {
            f.add(Vec::new(), v);
        }
        f
    };
    vec![
        one(
            F::counter(
                "train_steps",
                "Optimizer steps done (including before a resume)",
            ),
            load(&t.steps) as f64,
        ),
        one(
            F::counter("train_rows", "Rows trained on, all ranks"),
            load(&t.rows) as f64,
        ),
        one(
            F::gauge("train_loss", "Mean loss of the latest step"),
            t.loss(),
        ),
        one(
            F::gauge("train_learning_rate", "Learning rate of the latest step"),
            t.learning_rate(),
        ),
        one(
            F::counter(
                "train_data_wait_seconds",
                "Seconds rank 0 waited for its next batch (data stall)",
            ),
            ns(load(&t.data_wait_ns)),
        ),
        one(
            F::counter(
                "train_step_seconds",
                "Seconds rank 0 spent in steps (backward, all-reduce, optimizer)",
            ),
            ns(load(&t.step_ns)),
        ),
        one(
            F::counter(
                "train_allreduce_seconds",
                "Seconds rank 0 spent in collectives (handshake and gradient all-reduce)",
            ),
            ns(load(&t.allreduce_ns)),
        ),
        one(
            F::counter(
                "train_wire_bytes",
                "Gradient (local SGD: parameter) bytes rank 0 sent, compressed as configured",
            ),
            load(&t.wire_bytes) as f64,
        ),
        one(
            F::counter(
                "train_dense_bytes",
                "What rank 0's exchanges would have sent as plain f32 gradients",
            ),
            load(&t.dense_bytes) as f64,
        ),
        one(
            F::counter(
                "train_compression_seconds",
                "Seconds rank 0 spent compressing and decompressing gradients",
            ),
            ns(load(&t.compress_ns)),
        ),
        one(
            F::gauge("train_eval_accuracy", "Accuracy of the latest evaluation"),
            t.eval_accuracy(),
        ),
        one(
            F::gauge("train_eval_loss", "Mean loss of the latest evaluation"),
            t.eval_loss(),
        ),
    ]
}

type HttpResponse = hyper::Response<http_body_util::Full<hyper::body::Bytes>>;

fn respond(path: &str, observed: &Arc<Observed>) -> Result<HttpResponse, hyper::http::Error> {
    use http_body_util::Full;
    use hyper::body::Bytes;
    if path == "/metrics" {
        hyper::Response::builder()
            .header(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
            .body(Full::new(Bytes::from(observed.render())))
    } else {
        hyper::Response::builder()
            .status(hyper::StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"metrics are at /metrics\n")))
    }
}

/// Serves `GET /metrics` (anything else: 404) on `addr` until the returned task is aborted.
/// Returns the bound address (port 0 picks a free one).
pub async fn serve_metrics(
    addr: SocketAddr,
    observed: Arc<Observed>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    use hyper::Request;

    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let observed = observed.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let observed = observed.clone();
                        async move { respond(req.uri().path(), &observed) }
                    });
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await
                {
                    tracing::debug!("metrics connection: {e}");
                }
            });
        }
    });
    Ok((bound, task))
}

/// One sample of the pipelines' cumulative counters (summed over ranks).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    /// Seconds since the start.
    pub seconds: f64,
    /// Rows read by the source.
    pub source_rows: u64,
    /// Rows out of each stage, in pipeline order.
    pub stage_rows: Vec<u64>,
    /// Rows delivered.
    pub output_rows: u64,
}

impl Sample {
    /// The counters now, summed over every rank's pipeline, and the stages' short names.
    pub fn of(observed: &Observed) -> (Sample, Vec<String>) {
        let get = PipelineMetrics::get;
        let mut sample = Sample {
            seconds: observed.seconds(),
            source_rows: 0,
            stage_rows: Vec::new(),
            output_rows: 0,
        };
        let mut names = Vec::new();
        for (_, m) in &observed.pipelines() {
            sample.source_rows += get(&m.source.rows);
            sample.output_rows += get(&m.rows_out);
            for (i, st) in m.stages().iter().enumerate() {
                if sample.stage_rows.len() <= i {
                    sample.stage_rows.push(0);
                    names.push(short_name(&st.name));
                }
                sample.stage_rows[i] += get(&st.rows_out);
            }
        }
        (sample, names)
    }
}

/// Samples the counters at a fixed interval into a bounded series (every other sample is
/// dropped and the interval doubled when it fills).
#[derive(Debug, Default)]
pub struct Sampler {
    samples: Mutex<Vec<Sample>>,
    stage_names: Mutex<Vec<String>>,
}

const MAX_SAMPLES: usize = 2048;

impl Sampler {
    /// Starts sampling `observed` every `every` on the current runtime.
    pub fn start(
        observed: Arc<Observed>,
        every: Duration,
    ) -> (Arc<Sampler>, tokio::task::JoinHandle<()>) {
        let sampler = Arc::new(Sampler::default());
        let s = sampler.clone();
        let task = tokio::spawn(async move {
            let mut every = every;
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                if s.sample(&observed) {
                    every *= 2;
                    tick = tokio::time::interval(every);
                    tick.tick().await;
                }
            }
        });
        (sampler, task)
    }

    /// Takes a sample now; returns whether the series was thinned.
    pub fn sample(&self, observed: &Observed) -> bool {
        let (sample, names) = Sample::of(observed);
        if let Ok(mut n) = self.stage_names.lock()
            && n.len() < names.len()
        {
            *n = names;
        }
        let Ok(mut s) = self.samples.lock() else {
            return false;
        };
        s.push(sample);
        if s.len() >= MAX_SAMPLES {
            let mut i = 0;
            s.retain(|_| {
                i += 1;
                i % 2 == 1
            });
            return true;
        }
        false
    }

    /// The series and the stage names.
    pub fn series(&self) -> (Vec<Sample>, Vec<String>) {
        (
            self.samples.lock().map(|s| s.clone()).unwrap_or_default(),
            self.stage_names
                .lock()
                .map(|s| s.clone())
                .unwrap_or_default(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_names_are_shortened_for_labels() {
        assert_eq!(
            short_name("stages[2] (clip) at configs/q.yaml:17:5"),
            "#2 clip"
        );
        assert_eq!(short_name("stages[10] (image)"), "#10 image");
        assert_eq!(short_name("source"), "source");
    }
}
