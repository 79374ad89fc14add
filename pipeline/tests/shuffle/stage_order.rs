//! Stage orders around the shuffle: those that would make a resume inexact are refused
//! before any data moves, saying why and what to do; a filter before the shuffle under
//! several ranks is warned about.

use sluice_pipeline::Pipeline;

use super::write_dataset;

/// Stage orders that would make a resume inexact are refused before any data moves, saying
/// why and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stage_orders_that_would_break_resume_are_refused_with_the_reason() {
    let source = format!(
        "source: {{type: parquet, path: '{}/../data/digits/train.parquet'}}\n",
        env!("CARGO_MANIFEST_DIR")
    );
    let refused = |rest: &str| {
        let yaml = format!("{source}{rest}");
        async move {
            Pipeline::from_yaml(&yaml)
                .unwrap()
                .prepare()
                .await
                .unwrap_err()
                .to_string()
        }
    };
    let e = refused(
        "stages:\n- {type: batch, size: 8}\n- {type: filter, predicate: 'id > 3'}\n- {type: batch, size: 16}\n",
    )
    .await;
    assert!(e.contains("stages[1] (filter)"), "{e}");
    assert!(
        e.contains("a filter removes rows after stages[0] (batch)")
            && e.contains("and before stages[2] (batch)"),
        "{e}"
    );
    assert!(
        e.contains("could not be replayed on resume and ranks could get unequal batch counts"),
        "{e}"
    );
    assert!(
        e.contains("move this stage before stages[0] (batch)"),
        "{e}"
    );
    let e = refused(
        "stages:\n- {type: shuffle}\n- {type: image, column: pixels, shape: [8, 8, 1], on_error: skip}\n- {type: batch, size: 8}\n",
    )
    .await;
    assert!(
        e.contains("stages[1] (image)")
            && e.contains("`on_error: skip` removes rows after stages[0] (shuffle)")
            && e.contains("and before stages[2] (batch)"),
        "{e}"
    );
    let e = refused("stages:\n- {type: mixup, columns: [x], alpha: 0.2}\n").await;
    assert!(e.contains("stages[0] (mixup)"), "{e}");
    assert!(e.contains("put a `batch` stage before it"), "{e}");
    let e = refused(
        "stages:\n- {type: batch, size: 8}\n- {type: mixup, columns: [x], alpha: 0.2}\n- {type: batch, size: 16}\n",
    )
    .await;
    assert!(
        e.contains("stages[2] (batch)") && e.contains("cuts batches again"),
        "{e}"
    );
    assert!(e.contains("move mixup after the last `batch`"), "{e}");
    let e = refused("stages:\n- {type: batch, size: 8}\n- {type: shuffle}\n").await;
    assert!(e.contains("shuffle after stages[0] (batch)"), "{e}");
    assert!(e.contains("shuffle rows first, then batch them"), "{e}");
    let e = refused(
        "stages:\n- {type: filter, predicate: 'id > 3'}\n- {type: shuffle, across_ranks: true}\nruntime: {rank: 0, world_size: 2}\n",
    )
    .await;
    assert!(e.contains("`across_ranks` needs every rank's windows to hold the same number of rows, but stages[0] (filter)"), "{e}");
    let e = refused(
        "stages:\n- {type: shuffle, across_ranks: true}\nruntime: {rank: 0, world_size: 2}\n",
    )
    .await;
    assert!(
        e.contains("`across_ranks` needs a collective between the ranks"),
        "{e}"
    );
    // `group_by_length` needs the batch stage it groups for, with windows it divides.
    let e = refused("stages:\n- {type: shuffle, group_by_length: {column: pixels}}\n").await;
    assert!(
        e.contains("stages[0] (shuffle)")
            && e.contains("`group_by_length` makes batches of rows of similar length for the `batch` stage after the shuffle, and there is none"),
        "{e}"
    );
    let e = refused(
        "stages:\n- {type: shuffle, buffer_rows: 1000, group_by_length: {column: pixels}}\n- {type: batch, size: 64}\n",
    )
    .await;
    assert!(
        e.contains(
            "`group_by_length` needs `buffer_rows` (1000) to be a multiple of the batch size (64)"
        ) && e.contains("use 960 or 1024"),
        "{e}"
    );
    let e = refused(
        "stages:\n- {type: shuffle, buffer_rows: 1024, group_by_length: {column: label}}\n- {type: batch, size: 64}\n",
    )
    .await;
    assert!(
        e.contains(
            "compares the lengths of `label`, a Int64 column: give a list, string or binary column"
        ),
        "{e}"
    );
    let e = refused(
        "stages:\n- {type: shuffle, buffer_rows: 1024, group_by_length: {column: pixel}}\n- {type: batch, size: 64}\n",
    )
    .await;
    assert!(
        e.contains("column `pixel` does not exist") && e.contains("did you mean `pixels`?"),
        "{e}"
    );
}

/// Under several ranks, a filter before the last stage that cuts batches — a `shuffle`, when
/// there is no `batch` — makes each rank's count depend on its data: the filter is warned
/// about. After the shuffle it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_before_the_shuffle_under_several_ranks_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    write_dataset(dir.path(), &[vec![20, 20]]);
    let filter = "- {type: filter, predicate: 'id % 5 <> 1'}\n";
    let shuffle = "- {type: shuffle, buffer_rows: 10, seed: 3, batch_rows: 4}\n";
    let notes = |stages: String| {
        let yaml = format!(
            "source: {{type: parquet, path: '{}/*.parquet'}}\nstages:\n{stages}runtime: {{rank: 0, world_size: 2}}\n",
            dir.path().display()
        );
        async move {
            let prepared = Pipeline::from_yaml(&yaml).unwrap().prepare().await.unwrap();
            let stages = prepared.metrics().stages();
            let filter = stages.iter().find(|s| s.name.contains("(filter)")).unwrap();
            filter.notes.lock().unwrap().clone()
        }
    };
    let before = notes(format!("{filter}{shuffle}")).await;
    assert!(
        before
            .iter()
            .any(|n| n.contains("the ranks may get unequal counts")),
        "{before:?}"
    );
    let after = notes(format!("{shuffle}{filter}")).await;
    assert!(after.is_empty(), "{after:?}");
}
