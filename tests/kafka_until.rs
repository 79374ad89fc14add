//! `until: {records: N}` counts rows, whatever a message holds: an `arrow_ipc` topic whose
//! messages carry 250 rows each is read to exactly N rows — the last message cut where N falls
//! — and the run ends (it used to count messages, and a trainer asked for every row of the
//! topic waited forever). Against the real broker (Tansu, from `scripts/services.sh`).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::kafka;
use common::{assert_ok, int64_values, read_parquet, repo, run_in_for};

#[test]
fn until_records_counts_the_rows_of_arrow_ipc_messages() {
    let topic = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(kafka::create_topic("until-ipc", 1));
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let digits = repo().join("data/digits/train.parquet");
    // 1,437 rows as 6 messages: 5 of 250 rows and one of 187.
    std::fs::write(
        dir.join("publish.yaml"),
        format!(
            "source: {{type: parquet, path: '{}', columns: [id]}}\nstages: [{{type: batch, size: 250}}]\nsink: {{type: kafka, brokers: '{}', topic: {topic}, format: arrow_ipc}}\n",
            digits.display(),
            kafka::brokers()
        ),
    )
    .unwrap();
    assert_ok(&run_in_for(
        dir,
        &["run", "publish.yaml"],
        Duration::from_secs(120),
    ));
    let expected = int64_values(&read_parquet(&digits), "id");

    for n in [1000usize, 1100, 1437] {
        let name = format!("read-{n}.yaml");
        std::fs::write(
            dir.join(&name),
            format!(
                "source: {{type: kafka, brokers: '{}', topic: {topic}, format: arrow_ipc, schema: {{id: int64}}, until: {{records: {n}}}}}\nsink: {{type: parquet, path: out-{n}.parquet}}\n",
                kafka::brokers()
            ),
        )
        .unwrap();
        // Bounded: counting messages, 1,437 "records" never come and the run hangs.
        let out = run_in_for(dir, &["run", &name], Duration::from_secs(60));
        assert_ok(&out);
        let got = int64_values(&read_parquet(&dir.join(format!("out-{n}.parquet"))), "id");
        assert_eq!(got.len(), n, "until {{records: {n}}}");
        assert_eq!(
            got,
            expected[..n],
            "one partition: the first {n} rows in order"
        );
    }
}
