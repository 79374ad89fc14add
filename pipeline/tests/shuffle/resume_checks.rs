//! What a resume checks the state against: the files and the settings that decide which rows
//! come in which order (refused when they changed, saying what changed), and in listing order
//! only the files up to the position.

use futures::StreamExt;
use sluice_pipeline::{Pipeline, SourceState};

use super::{Case, run, write_dataset, yaml};
use crate::common::{ids, rt};

/// A state's position means rows of one plan: the files, and the settings that decide which
/// rows come in which order. Resuming it under another plan is refused, saying what changed;
/// settings that move no row may change, and so may where the files live.
#[test]
fn resume_checks_the_files_and_settings_the_state_was_taken_under() {
    let dir = tempfile::tempdir().unwrap();
    let groups = vec![vec![30, 20], vec![25, 5], vec![40]];
    let total = write_dataset(dir.path(), &groups);
    let c = Case {
        groups,
        batch_rows: 8,
        buffer_rows: 32,
        max_memory: 1 << 30,
        batch: 10,
        epochs: 2,
        seed: 3,
        filter: true,
        trim: false,
        group: None,
    };
    let rt = rt();
    let base = yaml(dir.path(), &c, 2, "", false);
    let reference = ids(&rt
        .block_on(run(Pipeline::from_yaml(&base).unwrap(), None))
        .0);
    let (head, state) = rt.block_on(run(Pipeline::from_yaml(&base).unwrap(), Some(5)));
    let plan = state.plan.clone().unwrap();
    let data = plan.data.clone().unwrap();
    assert_eq!((data.files, data.rows), (3, total));
    assert_eq!(plan.order["rank"], "0 of 1");
    let state: SourceState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let resumed = |y: &str| {
        let mut joined = ids(&head);
        let tail = rt.block_on(run(
            Pipeline::from_yaml(y).unwrap().resume_from(state.clone()),
            None,
        ));
        joined.extend(ids(&tail.0));
        joined
    };
    // Allowed: other threads and batch size; the same files in another directory.
    let other = yaml(
        dir.path(),
        &Case {
            batch: 7,
            ..c.clone()
        },
        1,
        "",
        false,
    );
    assert_eq!(resumed(&other), reference);
    let copy = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(dir.path()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, copy.path().join(f.file_name().unwrap())).unwrap();
    }
    assert_eq!(resumed(&yaml(copy.path(), &c, 2, "", false)), reference);

    let refused = |y: &str| -> String {
        rt.block_on(async {
            let mut s = Pipeline::from_yaml(y)
                .unwrap()
                .resume_from(state.clone())
                .stream();
            let e = s.next().await.unwrap().unwrap_err().to_string();
            assert!(e.starts_with("cannot resume: "), "{e}");
            e
        })
    };
    let e = refused(&yaml(
        dir.path(),
        &Case {
            seed: 4,
            ..c.clone()
        },
        2,
        "",
        false,
    ));
    assert!(
        e.contains("What changed: stages[3] (shuffle): seed 3 then, seed 4 now. "),
        "{e}"
    );
    let e = refused(&yaml(
        dir.path(),
        &Case {
            buffer_rows: 33,
            ..c.clone()
        },
        2,
        "",
        false,
    ));
    assert!(
        e.contains("stages[3] (shuffle): buffer_rows 32 then, buffer_rows 33 now"),
        "{e}"
    );
    let e = refused(&yaml(
        dir.path(),
        &Case {
            max_memory: 3000,
            ..c.clone()
        },
        2,
        "",
        false,
    ));
    assert!(
        e.contains("stages[3] (shuffle): max_memory 1.0 GiB then, max_memory 2.9 KiB now"),
        "{e}"
    );
    let e = refused(&yaml(
        dir.path(),
        &Case {
            filter: false,
            ..c.clone()
        },
        2,
        "",
        false,
    ));
    assert!(e.contains("stages[0] (filter): there then, not now"), "{e}");
    // Grouping by length reorders the window: the batch size then decides the order too.
    let e = refused(&yaml(
        dir.path(),
        &Case {
            group: Some(2),
            batch: 8,
            ..c.clone()
        },
        2,
        "",
        false,
    ));
    assert!(
        e.contains("seed 3 then, buffer_rows 32, max_memory 1.0 GiB, seed 3, group_by_length `tok` in 2 batches of 8 now"),
        "{e}"
    );
    let e = refused(&yaml(dir.path(), &c, 2, ", rank: 1, world_size: 2", false));
    assert!(e.contains("rank: 0 of 1 then, 1 of 2 now"), "{e}");
    // A file added, then one rewritten with as many rows in other row groups.
    write_dataset(copy.path(), &[vec![1], vec![1], vec![1], vec![9]]);
    let added = copy.path().join("part-003.parquet");
    std::fs::copy(&added, dir.path().join("part-003.parquet")).unwrap();
    let e = refused(&base);
    assert!(
        e.contains(&format!(
            "the files: 3 file(s) with {total} rows then, 4 file(s) with {} rows now",
            total + 9
        )),
        "{e}"
    );
    std::fs::remove_file(dir.path().join("part-003.parquet")).unwrap();
    write_dataset(copy.path(), &[vec![1], vec![1], vec![20, 20]]);
    std::fs::copy(
        copy.path().join("part-002.parquet"),
        dir.path().join("part-002.parquet"),
    )
    .unwrap();
    let e = refused(&base);
    assert!(
        e.contains(&format!(
            "the files: as many (3, {total} rows) but with other paths or row groups"
        )),
        "{e}"
    );
}

/// Reading in listing order (no shuffle, one rank), a position depends only on the files up
/// to the one it is in: a file added after it is read on resume, one added before it (or a
/// file before it rewritten) is refused.
#[test]
fn resume_in_listing_order_checks_the_files_up_to_the_position() {
    let dir = tempfile::tempdir().unwrap();
    let total = write_dataset(dir.path(), &[vec![30, 20], vec![25, 5], vec![40]]);
    let yaml = format!(
        "source: {{type: parquet, path: '{}/*.parquet', batch_rows: 7}}\n\
         stages:\n- {{type: batch, size: 10}}\nruntime: {{threads: 2}}\n",
        dir.path().display()
    );
    let rt = rt();
    // 6 batches: 60 rows, inside the second file (rows 50..80).
    let (head, state) = rt.block_on(run(Pipeline::from_yaml(&yaml).unwrap(), Some(6)));
    let data = state.plan.as_ref().unwrap().data.clone().unwrap();
    assert_eq!((data.files, data.rows, data.prefix), (2, 80, true));
    let resume = |state: &SourceState| {
        rt.block_on(async {
            let mut s = Pipeline::from_yaml(&yaml)
                .unwrap()
                .resume_from(state.clone())
                .stream();
            let mut out = Vec::new();
            while let Some(b) = s.next().await {
                out.push(b.map_err(|e| e.to_string())?);
            }
            Ok::<_, String>(out)
        })
    };
    // A file after the position: read on resume, after the rest.
    let extra = tempfile::tempdir().unwrap();
    write_dataset(extra.path(), &[vec![1], vec![1], vec![1], vec![4]]);
    std::fs::copy(
        extra.path().join("part-003.parquet"),
        dir.path().join("part-003.parquet"),
    )
    .unwrap();
    let tail = resume(&state).unwrap();
    let mut joined = ids(&head);
    joined.extend(ids(&tail));
    let mut expected: Vec<i64> = (0..total as i64).collect();
    expected.extend(3..7); // part-003's ids, as written alone
    assert_eq!(joined, expected);
    // A file before the position: refused.
    std::fs::copy(
        extra.path().join("part-003.parquet"),
        dir.path().join("part-000a.parquet"),
    )
    .unwrap();
    let e = resume(&state).unwrap_err();
    assert!(
        e.contains(
            "the files up to the position: 2 file(s) with 80 rows then, 2 file(s) with 54 rows now"
        ),
        "{e}"
    );
    std::fs::remove_file(dir.path().join("part-000a.parquet")).unwrap();
    // The first file rewritten with other row groups: refused.
    write_dataset(extra.path(), &[vec![25, 25]]);
    std::fs::copy(
        extra.path().join("part-000.parquet"),
        dir.path().join("part-000.parquet"),
    )
    .unwrap();
    let e = resume(&state).unwrap_err();
    assert!(
        e.contains(
            "the files up to the position: as many (2, 80 rows) but with other paths or row groups"
        ),
        "{e}"
    );
}
