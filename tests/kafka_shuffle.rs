//! The `shuffle` stage over a Kafka stream, against the real broker (Tansu, from
//! `scripts/services.sh`): resumed inside a window exactly (also where a window splits a
//! message, and without dead-lettering a bad record twice), what it needs of the source, and
//! `group_by_length`.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::kafka::{json_source, json_topic, runtime};

use std::collections::BTreeMap;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use common::kafka::{self, json_record};
use futures::StreamExt;
use sluice::pipeline::Pipeline;

/// Reads a pipeline to the end: each batch's ids and the state just past it.
fn ids_and_states(
    rt: &tokio::runtime::Runtime,
    pipeline: Pipeline,
) -> Vec<(Vec<i64>, sluice::pipeline::SourceState)> {
    per_batch(rt, pipeline, |_| ())
        .into_iter()
        .map(|(ids, (), state)| (ids, state))
        .collect()
}

/// Every batch of `pipeline`: its ids (column 0), `f` of it, and the state after it.
fn per_batch<T>(
    rt: &tokio::runtime::Runtime,
    pipeline: Pipeline,
    f: impl Fn(&sluice::pipeline::Batch) -> T,
) -> Vec<(Vec<i64>, T, sluice::pipeline::SourceState)> {
    rt.block_on(async {
        let mut s = pipeline.stream();
        let mut out = Vec::new();
        while let Some(b) = s.next().await {
            let b = b.unwrap();
            let ids = b
                .data
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec();
            out.push((ids, f(&b), s.snapshot()));
        }
        out
    })
}

/// A shuffled Kafka stream, interrupted after `k` batches and resumed from the state (through
/// JSON, as a checkpoint stores it): every id exactly once, and the rest of the window being
/// emitted comes out exactly as the uninterrupted run emitted it, although the partitions'
/// rows arrive interleaved differently the second time.
fn resume_a_shuffled_stream(
    rt: &tokio::runtime::Runtime,
    source: &str,
    n: i64,
    locate: &dyn Fn(i64) -> (i64, i64),
    partitions: usize,
    k: usize,
) {
    let yaml = format!(
        "{source}stages:\n  - {{type: shuffle, buffer_rows: 1000, seed: 7, batch_rows: 100}}\n"
    );
    let full = ids_and_states(rt, Pipeline::from_yaml(&yaml).unwrap());
    let all: Vec<i64> = full.iter().flat_map(|(ids, _)| ids.clone()).collect();
    let mut sorted = all.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "every row exactly once");
    // Shuffled: about half of the neighbours ascend (the input ascends within partitions).
    let ascending = all.windows(2).filter(|w| w[0] < w[1]).count() as f64 / (n - 1) as f64;
    assert!(
        (0.4..0.6).contains(&ascending),
        "{ascending} of neighbours ascend"
    );
    // Windows take rows as they arrive, the partitions in turn: the first output window holds,
    // of every partition, its first rows (`locate`: id → partition, row position in it).
    let mut firsts: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for &id in &all[..1000] {
        let (partition, position) = locate(id);
        firsts.entry(partition).or_default().push(position);
    }
    assert_eq!(
        firsts.len(),
        partitions,
        "the first window mixes every partition"
    );
    for positions in firsts.values_mut() {
        positions.sort_unstable();
        assert_eq!(*positions, (0..positions.len() as i64).collect::<Vec<_>>());
    }

    let state = full[k - 1].1.clone();
    let window = state.kafka_shuffle.clone().unwrap();
    let delivered: usize = full[..k].iter().map(|(ids, _)| ids.len()).sum();
    assert!(
        window.rows == 1000 && window.emitted > 0 && window.emitted < 1000,
        "the state is taken inside a window: {window:?}"
    );
    let state: sluice::pipeline::SourceState =
        serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let rest = ids_and_states(
        rt,
        Pipeline::from_yaml(&yaml)
            .unwrap()
            .resume_from(state.clone()),
    );
    let rest: Vec<i64> = rest.into_iter().flat_map(|(ids, _)| ids).collect();
    let left = (window.rows - window.emitted) as usize;
    assert_eq!(
        rest[..left],
        all[delivered..delivered + left],
        "the window's remaining rows, in the same order"
    );
    let mut joined: Vec<i64> = all[..delivered].iter().chain(&rest).copied().collect();
    assert_eq!(joined.len() as i64, n, "no row twice, none missing");
    joined.sort_unstable();
    assert_eq!(joined, (0..n).collect::<Vec<_>>());

    // Another seed would emit the window in another order: refused, saying so.
    let other = yaml.replace("seed: 7", "seed: 8");
    let err = rt
        .block_on(async {
            let mut s = Pipeline::from_yaml(&other)
                .unwrap()
                .resume_from(state)
                .stream();
            s.next().await.unwrap()
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("seed 7 then, seed 8 now"), "{err}");
}

#[test]
fn a_shuffled_kafka_stream_resumes_inside_a_window_exactly() {
    let rt = runtime();
    let n = 6000i64;
    let topic = json_topic(&rt, "shuffle-json", n, 4);
    // (A long `batch_timeout`: the partitions' turns wait for each other that long.)
    let source = json_source(&topic, "  batch_rows: 250\n  batch_timeout: 5s\n");
    resume_a_shuffled_stream(&rt, &source, n, &|id| (id % 4, id / 4), 4, 25);
}

#[test]
fn a_shuffled_stream_of_many_row_messages_resumes_where_a_window_splits_a_message() {
    use arrow::array::Int64Array;
    let rt = runtime();
    // 700 messages of 7 rows over 3 partitions: windows of 1000 rows end inside messages.
    let n = 4900i64;
    let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Int64, false),
    ]));
    let messages: Vec<(i32, Vec<u8>)> = (0..n / 7)
        .map(|m| {
            let rb = RecordBatch::try_new(
                schema.clone(),
                vec![std::sync::Arc::new(Int64Array::from_iter_values(
                    m * 7..m * 7 + 7,
                ))],
            )
            .unwrap();
            let mut buf = Vec::new();
            let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut buf, &schema).unwrap();
            w.write(&rb).unwrap();
            w.finish().unwrap();
            drop(w);
            ((m % 3) as i32, buf)
        })
        .collect();
    let topic = rt.block_on(async {
        let t = kafka::create_topic("shuffle-ipc", 3).await;
        assert_eq!(kafka::produce(&t, messages).await as i64, n / 7);
        t
    });
    let source = format!(
        "source:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: arrow_ipc\n  schema: {{id: int64}}\n  until: end\n  batch_timeout: 5s\n",
        kafka::brokers()
    );
    // After 2700 rows: inside the third window, which starts and ends inside messages.
    let locate = |id: i64| ((id / 7) % 3, id / 21 * 7 + id % 7);
    resume_a_shuffled_stream(&rt, &source, n, &locate, 3, 27);
}

/// Offsets of the records in one dead-letter directory, sorted (a record written twice shows
/// twice).
fn dead_lettered(dir: &std::path::Path) -> Vec<i64> {
    let mut offsets = Vec::new();
    for f in std::fs::read_dir(dir).into_iter().flatten() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        for l in text.lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["partition"], 1, "{v}");
            offsets.push(v["offset"].as_i64().unwrap());
        }
    }
    offsets.sort_unstable();
    offsets
}

#[test]
fn a_resumed_shuffle_window_does_not_dead_letter_its_bad_records_again() {
    let rt = runtime();
    // Ids 0..4000 over 4 partitions; partition 1 also holds a bad message after every 10th
    // of its good ones.
    let topic = rt.block_on(kafka::create_topic("dlq-shuffle", 4));
    let mut records: Vec<(i32, Vec<u8>)> = Vec::new();
    let mut next = [0i64; 4];
    let mut bad = Vec::new();
    for id in 0..4000i64 {
        let p = (id % 4) as usize;
        records.push((p as i32, json_record(id)));
        next[p] += 1;
        if id % 40 == 1 {
            records.push((1, format!("not json {id}").into_bytes()));
            bad.push(next[1]);
            next[1] += 1;
        }
    }
    assert_eq!(rt.block_on(kafka::produce(&topic, records)), 4100);
    let dir = tempfile::tempdir().unwrap();
    let yaml_with = |dlq: &str, budget: &str| {
        let source = json_source(
            &topic,
            &format!(
                "  batch_rows: 250\n  batch_timeout: 5s\n  dead_letter: {{type: file, path: '{}'}}\n{budget}",
                dir.path().join(dlq).display()
            ),
        );
        format!(
            "{source}stages:\n  - {{type: shuffle, buffer_rows: 1000, seed: 7, batch_rows: 100}}\n"
        )
    };
    let yaml = |dlq: &str| yaml_with(dlq, "");
    let full = ids_and_states(&rt, Pipeline::from_yaml(&yaml("full")).unwrap());
    assert_eq!(dead_lettered(&dir.path().join("full")), bad, "each once");
    // Every state carries the error budget's counts below its positions: the topic's offsets
    // are dense, so the records below are the positions' sum, and the bad ones are known.
    for (_, s) in &full {
        let k = s.kafka.as_ref().unwrap();
        let below: i64 = (0..4)
            .filter_map(|p| k.get(&topic, p))
            .map(|p| p.offset)
            .sum();
        let p1 = k.get(&topic, 1).map_or(0, |p| p.offset);
        let expected = sluice::pipeline::ErrorCounts {
            records: below as u64,
            bad: bad.iter().filter(|&&o| o < p1).count() as u64,
        };
        assert_eq!(s.kafka_errors, Some(expected));
    }
    assert_eq!(
        full.last().unwrap().1.kafka_errors,
        Some(sluice::pipeline::ErrorCounts {
            records: 4100,
            bad: 100
        })
    );

    // A state inside a window whose rows of partition 1 are read again on resume (from the
    // window's start to the position) and hold bad records.
    let position = |s: &sluice::pipeline::SourceState| {
        s.kafka.as_ref().unwrap().get(&topic, 1).unwrap().offset
    };
    let (k, state) = full
        .iter()
        .enumerate()
        .map(|(i, (_, s))| (i + 1, s.clone()))
        .find(|(_, s)| {
            let Some(w) = &s.kafka_shuffle else {
                return false;
            };
            let Some(start) = w.starts.get(&topic, 1) else {
                return false;
            };
            w.rows > 0 && w.emitted > 0 && bad.iter().any(|&o| start.offset <= o && o < position(s))
        })
        .expect("a state inside a window holding bad records");
    let rest = ids_and_states(
        &rt,
        Pipeline::from_yaml(&yaml("resumed"))
            .unwrap()
            .resume_from(state.clone()),
    );
    let mut ids: Vec<i64> = full[..k]
        .iter()
        .chain(&rest)
        .flat_map(|(ids, _)| ids.clone())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..4000).collect::<Vec<_>>(), "every good row once");
    let after: Vec<i64> = bad
        .iter()
        .copied()
        .filter(|&o| o >= position(&state))
        .collect();
    assert!(after.len() < bad.len());
    assert_eq!(
        dead_lettered(&dir.path().join("resumed")),
        after,
        "the resumed run writes the bad records past its position, once each"
    );
    // The resumed run goes on from the counts of the run it continues: it ends where the
    // uninterrupted one did, and its error budget is the whole run's — 100 bad records
    // pass `max_records: 100` and stop `max_records: 99`, with the earlier ones named.
    assert_eq!(
        rest.last().unwrap().1.kafka_errors,
        full.last().unwrap().1.kafka_errors
    );
    let resumed_with = |max: u64| {
        let yaml = yaml_with(
            &format!("budget-{max}"),
            &format!("  error_budget: {{max_records: {max}}}\n"),
        );
        let pipeline = Pipeline::from_yaml(&yaml)
            .unwrap()
            .resume_from(state.clone());
        rt.block_on(async {
            let mut s = pipeline.stream();
            while let Some(b) = s.next().await {
                if let Err(e) = b {
                    return Err(e.to_string());
                }
            }
            Ok(())
        })
    };
    resumed_with(100).unwrap();
    let e = resumed_with(99).unwrap_err();
    let before = state.kafka_errors.unwrap();
    assert!(
        e.contains("100 records could not be decoded, more than `error_budget.max_records` (99)")
            && e.contains(&format!(
                "{} of the {} records before this resumed run were bad",
                before.bad, before.records
            )),
        "{e}"
    );
}

#[test]
fn a_shuffle_of_a_kafka_stream_needs_static_assignment_and_no_exchange() {
    let rt = runtime();
    for (extra, stage, expected) in [
        (
            "  assignment: group\n  group_id: g\n",
            "",
            "needs `assignment: static`",
        ),
        (
            "",
            ", across_ranks: true",
            "`across_ranks` needs a Parquet source",
        ),
    ] {
        let yaml = format!(
            "{}stages:\n  - {{type: shuffle, buffer_rows: 10{stage}}}\n",
            json_source("t", extra)
        );
        let err = rt
            .block_on(Pipeline::from_yaml(&yaml).unwrap().prepare())
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{err}");
    }
}

/// `group_by_length` over a shuffled Kafka stream of token lists, against the broker: every
/// record once, far less padding than the same shuffle without it, and a run interrupted
/// inside a window resumes with exactly the batches the uninterrupted run delivered next.
#[test]
fn grouping_a_kafka_stream_by_length_pads_less_and_resumes_exactly() {
    use arrow::datatypes::Int32Type;
    let rt = runtime();
    let n = 4000i64;
    let len = |id: i64| (id * 7919 % 100 + 1) as usize;
    let topic = rt.block_on(async {
        let t = kafka::create_topic("group-length", 4).await;
        let records = (0..n).map(|i| {
            let toks: Vec<String> = (0..len(i)).map(|t| t.to_string()).collect();
            (
                (i % 4) as i32,
                format!(r#"{{"id": {i}, "toks": [{}]}}"#, toks.join(",")).into_bytes(),
            )
        });
        assert_eq!(kafka::produce(&t, records).await as i64, n);
        t
    });
    let yaml = |group: &str| {
        format!(
            "source:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: json\n  schema: {{id: int64, toks: \"list<int32>\"}}\n  until: end\n  batch_rows: 250\n  batch_timeout: 5s\nstages:\n  - type: shuffle\n    buffer_rows: 1024\n    seed: 7\n{group}  - {{type: batch, size: 32}}\n",
            kafka::brokers()
        )
    };
    // Each batch's ids and padding to its longest row, with the state after it.
    let batches = |p: Pipeline| {
        per_batch(&rt, p, |b| {
            let lens: Vec<usize> = b
                .data
                .column(1)
                .as_list::<i32>()
                .iter()
                .map(|l| l.unwrap().as_primitive::<Int32Type>().len())
                .collect();
            let longest = lens.iter().copied().max().unwrap_or(0);
            lens.iter().map(|l| longest - l).sum::<usize>()
        })
    };
    let grouping = "    group_by_length: {column: toks, batches: 8}\n";
    let grouped = batches(Pipeline::from_yaml(&yaml(grouping)).unwrap());
    let plain = batches(Pipeline::from_yaml(&yaml("")).unwrap());
    for run in [&grouped, &plain] {
        let mut ids: Vec<i64> = run.iter().flat_map(|(ids, _, _)| ids.clone()).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..n).collect::<Vec<_>>(), "every record once");
    }
    let padding = |run: &[(Vec<i64>, usize, sluice::pipeline::SourceState)]| {
        run.iter().map(|(_, p, _)| p).sum::<usize>()
    };
    assert!(
        padding(&grouped) * 4 < padding(&plain),
        "padding {} grouped, {} plain",
        padding(&grouped),
        padding(&plain)
    );
    // Interrupted inside the second window (32 batches of 32 a window), resumed.
    let k = 45;
    let state = grouped[k - 1].2.clone();
    let window = state.kafka_shuffle.clone().unwrap();
    assert!(
        window.emitted > 0 && window.emitted < window.rows,
        "{window:?}"
    );
    let state: sluice::pipeline::SourceState =
        serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let rest = batches(
        Pipeline::from_yaml(&yaml(grouping))
            .unwrap()
            .resume_from(state),
    );
    let rest: Vec<Vec<i64>> = rest.into_iter().map(|(ids, _, _)| ids).collect();
    let expected: Vec<Vec<i64>> = grouped[k..].iter().map(|(ids, _, _)| ids.clone()).collect();
    assert_eq!(rest, expected, "the batches after the state");
}
