//! The resumable state's unit tests.

use super::*;

/// A lock poisoned by a panicking thread never turns into "no position": taking the
/// state then fails loudly instead of recording an empty one.
#[test]
#[should_panic(expected = "stopping without recording a position")]
fn a_poisoned_position_fails_loudly() {
    let acker = Arc::new(Acknowledger::new(None));
    let poisoner = acker.clone();
    let _ = std::thread::spawn(move || {
        let _guard = poisoner.mark.lock().unwrap();
        panic!("poison the lock");
    })
    .join();
    let _ = acker.state();
}
use crate::batch::{LineageSpan, Name};

/// The epoch after the latest one any rank was in, at its start; the files' stamp kept
/// and the settings' dropped; nothing passed over when no rank had delivered a batch; a
/// Kafka state refused.
#[test]
fn next_epoch_starts_after_the_latest_interrupted_epoch() {
    let at = |epoch: u64, unit: u64| SourceState {
        parquet: Some(Mark {
            unit,
            skip: 5,
            ..Mark::start_of(epoch)
        }),
        plan: Some(PlanStamp {
            data: Some(DataStamp {
                entries: Vec::new(),
                files: 2,
                rows: 100,
                hash: "h".into(),
                prefix: false,
            }),
            order: BTreeMap::from([("rank".to_string(), "0 of 2".to_string())]),
            form: ORDER_FORM,
        }),
        ..SourceState::default()
    };
    let next = SourceState::next_epoch(&[at(3, 1), at(4, 0), SourceState::default()]).unwrap();
    assert_eq!(next.interrupted, Some(4));
    let mark = next.state.parquet.unwrap();
    assert_eq!(mark, Mark::start_of(5));
    assert!(mark.is_epoch_start() && !at(4, 0).parquet.unwrap().is_epoch_start());
    let plan = next.state.plan.unwrap();
    assert!(plan.order.is_empty());
    assert_eq!(plan.data.unwrap().rows, 100);

    let fresh = SourceState::next_epoch(&vec![SourceState::default(); 2]).unwrap();
    assert_eq!(fresh.interrupted, None);
    assert_eq!(fresh.state.parquet, Some(Mark::start_of(0)));

    let kafka = SourceState {
        kafka: Some(KafkaPositions::default()),
        ..SourceState::default()
    };
    assert!(
        SourceState::next_epoch(&[kafka])
            .unwrap_err()
            .contains("Kafka")
    );
}

#[test]
fn plan_differences_name_what_changed() {
    let stamp = |data: Option<(u64, u64, &str)>, order: &[(&str, &str)]| PlanStamp {
        data: data.map(|(files, rows, hash)| DataStamp {
            entries: Vec::new(),
            files,
            rows,
            hash: hash.into(),
            prefix: false,
        }),
        order: order
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        form: ORDER_FORM,
    };
    let hashed = setting_hash("Filter(..)");
    let then = stamp(
        Some((3, 100, "a")),
        &[
            ("rank", "0 of 2"),
            ("stages[0] (filter)", &hashed),
            (
                "stages[1] (shuffle)",
                "buffer_rows 10, max_memory 1 MiB, seed 1",
            ),
        ],
    );
    assert!(then.differences(&then.clone()).is_empty());
    // Files unknown on one side are not compared.
    let mut unknown = then.clone();
    unknown.data = None;
    assert!(then.differences(&unknown).is_empty());
    let now = stamp(
        Some((3, 100, "b")),
        &[
            ("rank", "1 of 2"),
            ("stages[0] (filter)", &setting_hash("Filter(...)")),
            (
                "stages[1] (shuffle)",
                "buffer_rows 10, max_memory 1 MiB, seed 2",
            ),
            ("stages[2] (filter)", &hashed),
        ],
    );
    assert_eq!(
        then.differences(&now),
        [
            "the files: as many (3, 100 rows) but with other paths or row groups",
            "rank: 0 of 2 then, 1 of 2 now",
            "stages[0] (filter): its settings changed",
            "stages[1] (shuffle): seed 1 then, seed 2 now",
            "stages[2] (filter): not there then",
        ]
    );
    let wide = stamp(
        None,
        &[("stages[10] (filter)", "a"), ("stages[2] (filter)", "a")],
    );
    let wider = stamp(
        None,
        &[("stages[10] (filter)", "b"), ("stages[2] (filter)", "b")],
    );
    assert_eq!(
        wide.differences(&wider),
        [
            "stages[2] (filter): a then, b now",
            "stages[10] (filter): a then, b now"
        ]
    );
    assert_eq!(
        now.differences(&stamp(Some((4, 120, "b")), &[])),
        [
            "the files: 3 file(s) with 100 rows then, 4 file(s) with 120 rows now",
            "rank: there then, not now",
            "stages[0] (filter): there then, not now",
            "stages[1] (shuffle): there then, not now",
            "stages[2] (filter): there then, not now",
        ]
    );
}

#[test]
fn a_restored_plan_is_kept_until_the_pipeline_sets_its_own() {
    let plan = PlanStamp {
        data: None,
        order: [("rank".to_string(), "0 of 1".to_string())].into(),
        form: ORDER_FORM,
    };
    let acker = Acknowledger::new(Some(&SourceState {
        plan: Some(plan.clone()),
        ..SourceState::default()
    }));
    assert_eq!(acker.state().plan, Some(plan));
    acker.set_plan(Arc::new(PlanSource::new(BTreeMap::new(), |_| {
        Some(DataStamp {
            entries: Vec::new(),
            files: 1,
            rows: 2,
            hash: "h".into(),
            prefix: false,
        })
    })));
    let now = acker.state().plan.unwrap();
    assert!(now.order.is_empty());
    assert_eq!(now.data.unwrap().rows, 2);
}

#[test]
fn positions_follow_lineage_and_partial_messages() {
    let t = Name::from("t");
    let mut l = Lineage::new(
        Origin::Kafka {
            topic: t,
            partition: 0,
        },
        10,
        5,
        0,
    );
    l.push(LineageSpan {
        origin: Origin::KafkaMessage {
            topic: t,
            partition: 1,
            offset: 7,
            rows: 100,
        },
        first: 0,
        len: 40,
        epoch: 0,
    });
    let mut p = KafkaPositions::default();
    p.observe(&l);
    assert_eq!(
        p.get("t", 0),
        Some(Position {
            offset: 15,
            skip_rows: 0
        })
    );
    assert_eq!(
        p.get("t", 1),
        Some(Position {
            offset: 7,
            skip_rows: 40
        })
    );
    let rest = Lineage::new(
        Origin::KafkaMessage {
            topic: t,
            partition: 1,
            offset: 7,
            rows: 100,
        },
        40,
        60,
        0,
    );
    p.observe(&rest);
    assert_eq!(
        p.get("t", 1),
        Some(Position {
            offset: 8,
            skip_rows: 0
        })
    );
    let json = serde_json::to_string(&SourceState {
        kafka: Some(p.clone()),
        kafka_shuffle: None,
        parquet: None,
        plan: None,
        kafka_errors: None,
        rescaled: None,
        draws: Draws::default(),
    })
    .unwrap();
    let back: SourceState = serde_json::from_str(&json).unwrap();
    assert_eq!(back.kafka, Some(p));
}

/// 3 old ranks owing 5 batches each, dealt to 2 then 4 ranks: contiguous runs in order,
/// shares as equal as can be, everything once; what is left after some are delivered is
/// dealt out again the same way.
#[test]
fn owed_batches_are_dealt_in_contiguous_equal_shares() {
    let runs: Vec<BatchRun> = (0..3)
        .map(|rank| BatchRun {
            rank,
            first: 0,
            end: 5,
        })
        .collect();
    let run = |rank, first, end| BatchRun { rank, first, end };
    let two = Rescaled::deal(Vec::new(), &runs, 2, Mark::start_of(1));
    assert_eq!(two[0].runs, [run(0, 0, 5), run(1, 0, 3)]);
    assert_eq!(two[1].runs, [run(1, 3, 5), run(2, 0, 5)]);
    assert!(two.iter().all(|r| r.batches == 8));
    let four = Rescaled::deal(Vec::new(), &runs, 4, Mark::start_of(1));
    let lens: Vec<u64> = four
        .iter()
        .map(|r| r.runs.iter().map(|x| x.end - x.first).sum())
        .collect();
    assert_eq!(lens, [4, 4, 4, 3]);
    assert_eq!(four[3].runs, [run(2, 2, 5)]);
    // Both delivered 6 (of 8 and of 7 batches): 2 + 1 left, dealt to 3.
    let mut left = two.clone();
    for r in &mut left {
        r.delivered = 6;
    }
    let rest: Vec<BatchRun> = left.iter().flat_map(Rescaled::remaining).collect();
    assert_eq!(rest, [run(1, 1, 3), run(2, 4, 5)]);
    let three = Rescaled::deal(Vec::new(), &rest, 3, Mark::start_of(1));
    assert_eq!(three[0].runs, [run(1, 1, 2)]);
    assert_eq!(three[1].runs, [run(1, 2, 3)]);
    assert_eq!(three[2].runs, [run(2, 4, 5)]);
    assert!(three.iter().all(|r| r.batches == 1));
}

#[test]
fn error_counts_split_exactly_at_each_sharers_positions() {
    let topic: Arc<str> = Arc::from("t");
    let at = |offset: i64| {
        let mut k = KafkaPositions::default();
        k.set(
            "t",
            0,
            Position {
                offset,
                skip_rows: 0,
            },
        );
        k
    };
    let leader = Acknowledger::new(None);
    let follower = leader.follower(None);
    // Offsets 0..7 and 8..11 of partition 0 (7 is missing: compacted); 3 and 4 are bad.
    leader.consumed(
        (0..7)
            .chain(8..11)
            .map(|o| (&topic, 0, o, o == 3 || o == 4)),
    );
    let count =
        |a: &Acknowledger, slot: usize, o: i64| a.errors.lock().unwrap().count(slot, &at(o));
    assert_eq!(count(&leader, 0, 5), ErrorCounts { records: 5, bad: 2 });
    assert_eq!(count(&follower, 1, 9), ErrorCounts { records: 8, bad: 2 });
    // Folded below 5 (the smaller of the two): the counts stay exact for both.
    assert_eq!(
        leader.errors.lock().unwrap().base,
        ErrorCounts { records: 5, bad: 2 }
    );
    assert_eq!(
        count(&follower, 1, 11),
        ErrorCounts {
            records: 10,
            bad: 2
        }
    );
    assert_eq!(count(&leader, 0, 9), ErrorCounts { records: 8, bad: 2 });
    assert_eq!(
        count(&leader, 0, 11),
        ErrorCounts {
            records: 10,
            bad: 2
        }
    );
    assert!(
        leader
            .errors
            .lock()
            .unwrap()
            .pending
            .values()
            .all(|r| r.is_empty())
    );

    // Through states: the counts below the positions, carried into a resumed acknowledger.
    let a = Acknowledger::new(None);
    a.consumed((0..6).map(|o| (&topic, 0, o, o == 1)));
    *a.written.lock().unwrap() = at(4);
    let state = a.state();
    assert_eq!(state.kafka_errors, Some(ErrorCounts { records: 4, bad: 1 }));
    let json = serde_json::to_string(&state).unwrap();
    let back: SourceState = serde_json::from_str(&json).unwrap();
    assert_eq!(
        Acknowledger::new(Some(&back)).restored_errors(),
        ErrorCounts { records: 4, bad: 1 }
    );
    // A Parquet pipeline's state has none.
    assert_eq!(Acknowledger::new(None).state().kafka_errors, None);
}
