//! Tests of the shuffle stage: Kafka windows that resume exactly, and view columns.

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, FixedSizeBinaryArray, Int64Array, LargeBinaryArray,
};
use arrow::datatypes::DataType;

use super::*;
use crate::batch::Name;
use crate::state::SourceState;

/// Rows `from..to` of Kafka partition `p` (id = 1000 p + offset) as one batch.
fn kafka_rows(p: i32, from: u64, to: u64) -> Batch {
    let ids = Int64Array::from_iter_values((from..to).map(|o| 1000 * p as i64 + o as i64));
    let rb = RecordBatch::try_from_iter([("id", Arc::new(ids) as ArrayRef)]).unwrap();
    let origin = Origin::Kafka {
        topic: Name::from("t"),
        partition: p,
    };
    Batch::new(rb, Lineage::new(origin, from, to - from, 0))
}

fn kafka_shuffler(resume: Option<&SourceState>) -> Shuffler {
    let spec = ShuffleSpec {
        buffer_rows: 100,
        max_memory: 1 << 20,
        spill_dir: None,
        seed: 5,
        batch_rows: 30,
        across_ranks: false,
        views: Vec::new(),
        group: None,
        rank: 0,
    };
    let stage = StageRef {
        index: 0,
        kind: "shuffle",
        location: None,
    };
    Shuffler::new(stage, spec, None, None).over_kafka(resume)
}

/// Feeds `input` and returns every output batch.
fn run(s: &mut Shuffler, input: Vec<Batch>) -> Vec<Batch> {
    let mut out = Vec::new();
    for b in input {
        s.push(b).unwrap();
        while let Some(o) = s.next_output().unwrap() {
            out.push(o);
        }
    }
    s.finish().unwrap();
    while let Some(o) = s.next_output().unwrap() {
        out.push(o);
    }
    out
}

fn ids(batches: &[Batch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.data
                .column(0)
                .as_primitive::<arrow::datatypes::Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

/// A Kafka window's output depends on its rows, not on how the partitions interleaved
/// on arrival; and a shuffler restored from a position inside a window, fed the window's
/// rows in yet another interleaving, emits exactly the rest of it, then goes on.
#[test]
fn kafka_windows_do_not_depend_on_arrival_order_and_resume_exactly() {
    // Window 0: partition 0 offsets 0..60 and partition 1 offsets 0..40; then 50 more.
    let a = vec![
        kafka_rows(0, 0, 60),
        kafka_rows(1, 0, 40),
        kafka_rows(1, 40, 60),
        kafka_rows(0, 60, 90),
    ];
    let b = vec![
        kafka_rows(1, 0, 25),
        kafka_rows(0, 0, 35),
        kafka_rows(1, 25, 40),
        kafka_rows(0, 35, 60),
        kafka_rows(0, 60, 90),
        kafka_rows(1, 40, 60),
    ];
    let out_a = run(&mut kafka_shuffler(None), a);
    let out_b = run(&mut kafka_shuffler(None), b);
    let (ia, ib) = (ids(&out_a), ids(&out_b));
    assert_eq!(
        ia[..100],
        ib[..100],
        "the first window, whatever the arrival"
    );
    assert_ne!(ia[..100], (0..100).collect::<Vec<i64>>()[..], "permuted");
    let mut sorted = ia.clone();
    sorted.sort_unstable();
    let mut want: Vec<i64> = (0..90).chain(1000..1060).collect();
    want.sort_unstable();
    assert_eq!(sorted, want);

    // The state after the second output batch (60 rows of window 0 out).
    let mut acker = crate::state::Acknowledger::new(None);
    for o in &out_a[..2] {
        acker.observe_batch(o);
    }
    let state = acker.state();
    let w = state.kafka_shuffle.clone().unwrap();
    assert_eq!((w.window, w.rows, w.emitted), (0, 100, 60));
    let kafka = state.kafka.clone().unwrap();
    assert_eq!(kafka.get("t", 0).unwrap().offset, 60);
    assert_eq!(kafka.get("t", 1).unwrap().offset, 40);
    // What a resumed source sends: the window's rows (another interleaving), then the rest.
    let replay = vec![
        kafka_rows(1, 0, 10),
        kafka_rows(0, 0, 60),
        kafka_rows(1, 10, 40),
        kafka_rows(1, 40, 60),
        kafka_rows(0, 60, 90),
    ];
    let rest = ids(&run(&mut kafka_shuffler(Some(&state)), replay));
    assert_eq!(rest[..40], ia[60..100], "the rest of the window");
    let mut all: Vec<i64> = ia[..60].iter().chain(&rest).copied().collect();
    all.sort_unstable();
    assert_eq!(all, want, "every row once");
    acker = crate::state::Acknowledger::new(Some(&state));
    assert_eq!(
        acker.state(),
        state,
        "a restored state is kept until a batch moves it"
    );

    // A replay that misses rows of the window is refused, saying which.
    let mut s = kafka_shuffler(Some(&state));
    s.push(kafka_rows(0, 0, 60)).unwrap();
    assert!(s.next_output().unwrap().is_none());
    s.push(kafka_rows(1, 5, 40)).unwrap();
    assert!(s.next_output().unwrap().is_none());
    s.push(kafka_rows(0, 60, 90)).unwrap();
    let e = s.next_output().unwrap_err().to_string();
    assert!(
        e.contains("cannot rebuild the shuffle window")
            && e.contains("t/1 from offset 0 to offset 40")
            && e.contains("only 95 of them were read again before kafka t/0, offset 60"),
        "{e}"
    );
}

/// Each column turned into views holds the same values and nulls, over the same buffer.
#[test]
fn views_point_at_the_same_bytes() {
    let fixed = FixedSizeBinaryArray::try_from_sparse_iter_with_size(
        (0..20u8).map(|i| (i % 7 != 3).then(|| vec![i; 48])),
        48,
    )
    .unwrap();
    let values: Vec<Option<Vec<u8>>> = (0..20u8)
        .map(|i| (i % 5 != 2).then(|| vec![i; 10 + i as usize]))
        .collect();
    let binary = BinaryArray::from_iter(values.iter().map(|v| v.as_deref()));
    let large = LargeBinaryArray::from_iter(values.iter().map(|v| v.as_deref()));
    let ids = Int64Array::from_iter_values(0..20);
    let rb = RecordBatch::try_from_iter([
        ("fixed", Arc::new(fixed) as ArrayRef),
        ("id", Arc::new(ids) as ArrayRef),
        ("binary", Arc::new(binary) as ArrayRef),
        ("large", Arc::new(large) as ArrayRef),
    ])
    .unwrap();
    // A slice, as the shuffle's window pieces usually are.
    let rb = rb.slice(3, 12);
    let v = views(&rb, &[0, 2, 3]).unwrap();
    assert_eq!(v.column(1), rb.column(1));
    for c in [0, 2, 3] {
        assert_eq!(v.schema().field(c).data_type(), &DataType::BinaryView);
        let got = v.column(c).as_binary_view();
        let data = rb.column(c).to_data();
        assert_eq!(got.nulls(), rb.column(c).nulls(), "column {c}");
        for r in 0..rb.num_rows() {
            let want: Option<&[u8]> = match rb.column(c).data_type() {
                DataType::FixedSizeBinary(_) => {
                    let a = rb.column(c).as_fixed_size_binary();
                    a.is_valid(r).then(|| a.value(r))
                }
                DataType::Binary => {
                    let a = rb.column(c).as_binary::<i32>();
                    a.is_valid(r).then(|| a.value(r))
                }
                _ => {
                    let a = rb.column(c).as_binary::<i64>();
                    a.is_valid(r).then(|| a.value(r))
                }
            };
            assert_eq!(
                got.is_valid(r).then(|| got.value(r)),
                want,
                "column {c} row {r}"
            );
        }
        // No bytes were copied: the views point into the input's value buffer.
        let buffer = &data.buffers()[data.buffers().len() - 1];
        assert_eq!(got.data_buffers().len(), 1);
        assert_eq!(
            got.data_buffers()[0].as_ptr(),
            buffer.as_ptr(),
            "column {c}"
        );
    }
}

/// Huge-page list buffers are asked for only where the window is gathered from memory: not
/// when `buffer_rows` of the list values exceed `max_memory` (it spills), not across ranks
/// (rows arrive decoded from the exchange), not for a global shuffle.
#[test]
fn gathers_in_memory_only_for_a_window_held_in_memory() {
    use arrow::datatypes::{Field, Schema};
    let item = Arc::new(Field::new_list_field(DataType::Float32, false));
    let schema = Schema::new(vec![
        Field::new("x", DataType::FixedSizeList(item, 256), false),
        Field::new("label", DataType::Int64, false),
    ]);
    let config = |json: &str| serde_json::from_str::<settings::ShuffleConfig>(json).unwrap();
    // The default 16,384 rows × 1 KiB = 16 MiB of list values.
    assert!(config("{}").gathers_in_memory(&schema));
    assert!(config(r#"{"max_memory": "16 MiB"}"#).gathers_in_memory(&schema));
    assert!(!config(r#"{"max_memory": "15 MiB"}"#).gathers_in_memory(&schema));
    assert!(!config(r#"{"buffer_rows": 1000000}"#).gathers_in_memory(&schema));
    assert!(!config(r#"{"across_ranks": true}"#).gathers_in_memory(&schema));
    assert!(!config(r#"{"mode": "global"}"#).gathers_in_memory(&schema));
}
