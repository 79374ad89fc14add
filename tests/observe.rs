//! The metrics endpoint and the run report, on running `sluice` processes: every metric
//! documented in docs/metrics.md is served and the counters move; the report's plots are
//! valid SVG with titles, labelled axes and data.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use common::kafka::{self, JSON_SCHEMA, free_port, json_record};
use common::{repo, spawn_sluice, wait_for};

/// `(name, when)` of every metric in docs/metrics.md's table.
fn documented() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    let rows: Vec<(String, String)> = doc
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells.len() > 5 && matches!(cells[2], "counter" | "gauge"))
        .map(|cells| (cells[1].trim_matches('`').to_string(), cells[4].to_string()))
        .collect();
    assert!(rows.len() > 20, "the metrics table was not found");
    rows
}

/// One scrape: `name` (as on the wire) → sum over its label sets. `None` while the endpoint
/// is not up.
fn scrape(port: u16) -> Option<BTreeMap<String, f64>> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let (head, body) = body.split_once("\r\n\r\n")?;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(
        body.trim_end().ends_with("# EOF"),
        "OpenMetrics ends with # EOF"
    );
    let mut out = BTreeMap::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let name = series.split('{').next().unwrap().to_string();
        let v: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line}"));
        *out.entry(name).or_insert(0.0) += v;
    }
    Some(out)
}

/// The wire name of a documented metric.
fn wire(name: &str, counters: &BTreeMap<String, f64>) -> Option<String> {
    let full = format!("sluice_{name}");
    let total = format!("{full}_total");
    [total, full].into_iter().find(|n| counters.contains_key(n))
}

/// Every documented metric whose `when` matches is present.
fn assert_documented_present(m: &BTreeMap<String, f64>, when: &[&str]) {
    for (name, w) in documented() {
        if when.contains(&w.as_str()) {
            assert!(
                wire(&name, m).is_some(),
                "documented metric `{name}` ({w}) missing"
            );
        }
    }
}

fn assert_moved(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, names: &[&str]) {
    for name in names {
        let n = wire(name, after).unwrap_or_else(|| panic!("{name} missing"));
        let (a, b) = (before.get(&n).copied().unwrap_or(0.0), after[&n]);
        assert!(b > a, "`{n}` did not move: {a} → {b}");
    }
}

fn sigterm(child: &mut std::process::Child) -> Option<i32> {
    assert!(child.try_wait().unwrap().is_none(), "ended before SIGTERM");
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    child.wait().unwrap().code()
}

/// Checks a plot: an SVG document with the title and axis labels as text and at least one
/// drawn line of several points.
fn assert_plot(path: &Path, texts: &[&str]) {
    let svg = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc = roxmltree::Document::parse(&svg)
        .unwrap_or_else(|e| panic!("{} is not valid XML: {e}", path.display()));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    for dim in ["width", "height"] {
        let v: f64 = root.attribute(dim).unwrap().parse().unwrap();
        assert!(v >= 300.0, "{dim} {v}");
    }
    let all_text: Vec<&str> = doc
        .descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .collect();
    for t in texts {
        assert!(
            all_text.iter().any(|x| x.contains(t)),
            "{}: no text `{t}`",
            path.display()
        );
    }
    let longest = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .map(|n| {
            n.attribute("points")
                .unwrap_or("")
                .split_whitespace()
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(longest >= 2, "{}: no data line", path.display());
}

#[cfg(feature = "torch")]
#[test]
fn train_serves_every_documented_metric_and_writes_a_report_with_plots() {
    let dir = tempfile::tempdir().unwrap();
    let data = repo().join("data/digits");
    std::fs::write(
        dir.path().join("job.yaml"),
        format!(
            "source: {{type: parquet, path: '{d}/train.parquet', columns: [label, pixels], batch_rows: 100}}
stages:
  - {{type: cast, columns: {{pixels: float32}}}}
  - {{type: standardize, columns: [pixels]}}
  - {{type: batch, size: 32}}
runtime: {{threads: 1}}
loader:
  tensors:
    x: {{column: pixels, dtype: f32}}
    y: {{column: label, dtype: i64}}
trainer:
  model: {{type: mlp, hidden: [32], outputs: 10}}
  optimizer: {{type: sgd, lr: 0.05, momentum: 0.9}}
  epochs: 100000
  eval: {{path: '{d}/test.parquet', every_steps: 20}}
  allreduce: {{workers: 2}}
",
            d = data.display()
        ),
    )
    .unwrap();
    let port = free_port();
    let mut child = spawn_sluice(
        dir.path(),
        &[
            "train",
            "job.yaml",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--report",
            "rep",
        ],
    );
    let first = wait_for("an evaluation", Duration::from_secs(120), || {
        scrape(port).filter(|m| m.contains_key("sluice_train_eval_accuracy"))
    });
    let steps = first["sluice_train_steps_total"];
    // The throughput plot needs several samples (one every 200 ms) with the stages running:
    // a fast run can do 50 steps within two.
    let second = wait_for(
        "50 more steps and 2 s of samples",
        Duration::from_secs(120),
        || {
            scrape(port).filter(|m| {
                m["sluice_train_steps_total"] >= steps + 50.0 && m["sluice_uptime_seconds"] >= 2.0
            })
        },
    );
    assert_documented_present(&second, &["always", "train", "train with `eval`"]);
    assert_moved(
        &first,
        &second,
        &[
            "source_rows",
            "source_bytes_read",
            "source_bytes_decoded",
            "stage_rows_in",
            "stage_rows_out",
            "stage_busy_seconds",
            "source_busy_seconds",
            "pool_busy_seconds",
            "queue_batches_pushed",
            "queue_batches_popped",
            "queue_bytes_pushed",
            "queue_bytes_popped",
            "output_rows",
            "output_batches",
            "output_bytes",
            "uptime_seconds",
            "train_steps",
            "train_rows",
            "train_step_seconds",
            "train_allreduce_seconds",
            "train_data_wait_seconds",
        ],
    );
    let loss = second["sluice_train_loss"];
    assert!(loss.is_finite() && loss > 0.0);
    let acc = second["sluice_train_eval_accuracy"];
    assert!((0.0..=1.0).contains(&acc));
    assert_eq!(sigterm(&mut child), Some(130));

    // The report of the interrupted run.
    let rep = dir.path().join("rep");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(rep.join("report.json")).unwrap()).unwrap();
    assert_eq!(json["kind"], "train");
    assert_eq!(json["summary"]["interrupted"], true);
    // Each queue's readiness (a share), none for the consumer at the end of the chain.
    let chain = json["chain"].as_array().unwrap();
    assert!(
        chain[..chain.len() - 1]
            .iter()
            .all(|e| e["output_readiness"]
                .as_f64()
                .is_some_and(|r| (0.0..=1.0).contains(&r))),
        "{chain:?}"
    );
    assert!(chain.last().unwrap()["output_readiness"].is_null());
    // The pools (`threads: 1` on each of the 2 workers, summed) ran the source's decode among
    // their tasks.
    let pool = &json["pool"];
    assert_eq!(pool["threads"], 2, "{pool}");
    let busy = pool["busy_seconds"].as_f64().unwrap();
    let source = pool["source_seconds"].as_f64().unwrap();
    assert!(source > 0.0 && source < busy, "{pool}");
    assert!(busy <= pool["seconds"].as_f64().unwrap() * 1.01, "{pool}");
    assert!(!json["bottleneck"]["element"].as_str().unwrap().is_empty());
    assert!(
        !json["bottleneck"]["suggestion"]
            .as_str()
            .unwrap()
            .is_empty()
    );
    let curves = &json["training"];
    assert!(curves["loss"].as_array().unwrap().len() >= 50);
    assert!(!curves["eval_accuracy"].as_array().unwrap().is_empty());
    let names: Vec<&str> = json["throughput"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["source", "#0 cast", "#1 standardize", "#2 batch", "output"]
    );
    assert_plot(
        &rep.join("throughput.svg"),
        &[
            "Throughput per stage",
            "time since start (s)",
            "rows per second",
            "#0 cast",
        ],
    );
    assert_plot(
        &rep.join("loss.svg"),
        &["Training loss", "optimizer step", "mean loss of the step"],
    );
    assert_plot(
        &rep.join("accuracy.svg"),
        &["Evaluation accuracy", "optimizer step", "accuracy (%)"],
    );
    let html = std::fs::read_to_string(rep.join("report.html")).unwrap();
    assert_eq!(html.matches("<svg").count(), 3);
    assert!(html.contains("Bottleneck:"));
}

#[test]
fn run_serves_kafka_partition_metrics_that_follow_the_topic() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let topic = rt.block_on(async {
        let t = kafka::create_topic("observe", 2).await;
        kafka::produce(&t, (0..4000i64).map(|i| ((i % 2) as i32, json_record(i)))).await;
        t
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("job.yaml"),
        format!(
            "source:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: json\n  schema: {JSON_SCHEMA}\nstages:\n  - {{type: filter, predicate: 'id >= 0'}}\nsink: {{type: null}}\n",
            kafka::brokers()
        ),
    )
    .unwrap();
    let port = free_port();
    let mut child = spawn_sluice(
        dir.path(),
        &[
            "run",
            "job.yaml",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ],
    );
    let records = "sluice_kafka_partition_records_total";
    let first = wait_for("all 4000 records through", Duration::from_secs(60), || {
        scrape(port).filter(|m| {
            m.get(records) == Some(&4000.0) && m.get("sluice_output_rows_total") == Some(&4000.0)
        })
    });
    assert_documented_present(&first, &["always", "kafka"]);
    rt.block_on(kafka::produce(
        &topic,
        (4000..5000i64).map(|i| ((i % 2) as i32, json_record(i))),
    ));
    let second = wait_for("the new records", Duration::from_secs(60), || {
        scrape(port).filter(|m| {
            m.get(records) == Some(&5000.0) && m.get("sluice_output_rows_total") == Some(&5000.0)
        })
    });
    assert_moved(
        &first,
        &second,
        &[
            "source_rows",
            "stage_rows_in",
            "stage_rows_out",
            "output_rows",
        ],
    );
    assert_eq!(sigterm(&mut child), Some(130));
    // The report of an interrupted run exists too.
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("sluice-report/job-run/report.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(json["kind"], "run");
    assert!(
        json["summary"]["error"]
            .as_str()
            .unwrap()
            .contains("interrupt")
    );
    assert_plot(
        &dir.path().join("sluice-report/job-run/throughput.svg"),
        &["Throughput per stage"],
    );
}

#[test]
fn a_metrics_address_in_use_is_a_usage_error_that_names_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = common::sluice()
        .current_dir(dir.path())
        .args([
            "run",
            repo().join("configs/quickstart.yaml").to_str().unwrap(),
        ])
        .args(["--metrics-addr", &addr, "--no-report"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("--metrics-addr {addr}: cannot listen there"))
            && err.contains("choose a free port"),
        "{err}"
    );
}

/// `sluice run --tensorboard DIR`: TensorBoard's reader finds the pipeline's rates and the
/// rows delivered, whose last point is every row of the run.
#[test]
fn run_writes_tensorboard_scalars_tensorboards_reader_takes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("job.yaml"),
        format!(
            "source: {{type: parquet, path: '{}/train.parquet'}}\nstages:\n  - {{type: cast, columns: {{pixels: float32}}}}\nsink: {{type: null}}\n",
            common::repo().join("data/digits").display()
        ),
    )
    .unwrap();
    common::assert_ok(&common::run_in_for(
        dir.path(),
        &["run", "job.yaml", "--tensorboard", "tb", "--no-report"],
        Duration::from_secs(120),
    ));
    let script = "import json, sys\n\
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n\
        ea = EventAccumulator(sys.argv[1], size_guidance={'scalars': 0})\n\
        ea.Reload()\n\
        print(json.dumps({t: [e.value for e in ea.Scalars(t)] for t in ea.Tags()['scalars']}))\n";
    let out = std::process::Command::new(common::venv_python())
        .args(["-c", script])
        .arg(dir.path().join("tb"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tags: BTreeMap<String, Vec<f64>> = serde_json::from_slice(&out.stdout).unwrap();
    for tag in [
        "pipeline/source_rows_per_second",
        "pipeline/output_rows_per_second",
        "stage/0_cast/rows_per_second",
    ] {
        assert!(
            tags.get(tag).is_some_and(|v| !v.is_empty()),
            "`{tag}` in {tags:?}"
        );
    }
    assert_eq!(tags["pipeline/output_rows"].last(), Some(&1437.0));
}
