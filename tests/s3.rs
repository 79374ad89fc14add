//! Parquet from and to a real S3 server (moto, started by `scripts/services.sh`), including
//! faults injected by a proxy in front of it.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;
use std::sync::atomic::Ordering;

use arrow::array::RecordBatch;
use common::s3::{self, Proxy, SECRET};
use common::*;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// The digits training set split into `parts` Parquet files, as (name, bytes).
fn digits_parts(parts: usize) -> Vec<(String, Vec<u8>)> {
    let all = read_parquet(&repo().join("data/digits/train.parquet"));
    let all = arrow::compute::concat_batches(&all[0].schema(), &all).unwrap();
    let per = all.num_rows().div_ceil(parts);
    (0..parts)
        .map(|i| {
            let start = i * per;
            let len = per.min(all.num_rows() - start);
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("x.parquet");
            write_parquet(&p, &[all.slice(start, len)], 200);
            (format!("part-{i:03}.parquet"), std::fs::read(&p).unwrap())
        })
        .collect()
}

async fn upload(bucket: &str, prefix: &str, files: &[(String, Vec<u8>)]) {
    let store = s3::store(bucket);
    futures::stream::iter(files.iter().map(|(name, bytes)| {
        let store = &store;
        async move {
            store
                .put(
                    &ObjectPath::from(format!("{prefix}/{name}")),
                    PutPayload::from(bytes.clone()),
                )
                .await
                .unwrap();
        }
    }))
    .buffer_unordered(32)
    .collect::<Vec<_>>()
    .await;
}

/// Runs `sluice run` on `yaml` (written into `dir`) against `endpoint`; returns (exit code,
/// stdout+stderr).
fn run(dir: &Path, yaml: &str, endpoint: &str, extra: &[&str]) -> (i32, String) {
    let config = dir.join("p.yaml");
    std::fs::write(&config, yaml).unwrap();
    let mut cmd = sluice();
    cmd.arg("run")
        .arg(&config)
        .args(extra)
        .envs(s3::env(endpoint));
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains(SECRET),
        "the secret leaked into the output:\n{text}"
    );
    (out.status.code().unwrap_or(-1), text)
}

/// A proxy that breaks the first `n` data reads (ranged GETs below byte 4096; footers are
/// read beyond it) by dropping the connection, as a server killed mid-read.
fn proxy_dropping_data_reads(n: u64) -> Proxy {
    let proxy = Proxy::start();
    proxy.faults.data_limit.store(4096, Ordering::SeqCst);
    proxy.faults.drop_data_reads.store(n, Ordering::SeqCst);
    proxy
}

const STAGES: &str =
    "stages:\n- {type: cast, columns: {pixels: float32}}\n- {type: batch, size: 100}\n";

fn local_reference(dir: &Path, parts: &[(String, Vec<u8>)]) -> Vec<RecordBatch> {
    let data = dir.join("local");
    std::fs::create_dir_all(&data).unwrap();
    for (name, bytes) in parts {
        std::fs::write(data.join(name), bytes).unwrap();
    }
    let yaml = format!(
        "source: {{type: parquet, path: 'local/*.parquet'}}\n{STAGES}sink: {{type: parquet, path: ref.parquet}}\n"
    );
    let (code, text) = run(dir, &yaml, &s3::endpoint(), &[]);
    assert_eq!(code, 0, "{text}");
    read_parquet(&dir.join("ref.parquet"))
}

#[tokio::test(flavor = "multi_thread")]
async fn reads_a_multi_file_dataset_like_local_disk_and_writes_back() {
    let bucket = s3::bucket("read");
    let parts = digits_parts(4);
    upload(&bucket, "digits/train", &parts).await;
    let dir = tempfile::tempdir().unwrap();
    let reference = local_reference(dir.path(), &parts);
    assert_eq!(rows(&reference), 1437);

    // S3 in, S3 out.
    let yaml = format!(
        "source: {{type: parquet, path: 's3://{bucket}/digits/train/*.parquet', prefetch: 3}}\n{STAGES}sink: {{type: parquet, path: 's3://{bucket}/out/digits.parquet'}}\n"
    );
    let (code, text) = run(dir.path(), &yaml, &s3::endpoint(), &[]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(&format!("-> s3://{bucket}/out/digits.parquet")),
        "{text}"
    );
    let bytes = s3::store(&bucket)
        .get(&ObjectPath::from("out/digits.parquet"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let back = read_parquet_from(bytes);
    let schema = reference[0].schema();
    assert_eq!(
        arrow::compute::concat_batches(&schema, &back).unwrap(),
        arrow::compute::concat_batches(&schema, &reference).unwrap(),
        "S3 round trip differs from the local run"
    );
    assert_eq!(
        checksum_i64(&back, &["id", "label"]),
        checksum_i64(&reference, &["id", "label"])
    );

    // The float32 lists written back, read from S3: their column chunks fetched whole and
    // the lists decoded by the source's own list reader (`source::parquet::lists`), the same
    // rows as the file they are.
    assert!(matches!(
        schema.field_with_name("pixels").unwrap().data_type(),
        arrow::datatypes::DataType::FixedSizeList(item, 64)
            if item.data_type() == &arrow::datatypes::DataType::Float32
    ));
    let yaml = format!(
        "source: {{type: parquet, path: 's3://{bucket}/out/digits.parquet', batch_rows: 100}}
sink: {{type: parquet, path: again.parquet}}
"
    );
    let (code, text) = run(dir.path(), &yaml, &s3::endpoint(), &[]);
    assert_eq!(code, 0, "{text}");
    let again = read_parquet(&dir.path().join("again.parquet"));
    assert_eq!(
        arrow::compute::concat_batches(&schema, &again).unwrap(),
        arrow::compute::concat_batches(&schema, &back).unwrap(),
        "float32 lists read from S3 differ from the object's rows"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn lists_two_thousand_objects_under_a_prefix() {
    let bucket = s3::bucket("many");
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..2000i64)
        .map(|i| (format!("f-{i:05}.parquet"), one_row_parquet(i)))
        .collect();
    upload(&bucket, "many", &files).await;
    let proxy = Proxy::start();
    let yaml = format!(
        "source: {{type: parquet, path: 's3://{bucket}/many/', prefetch: 16}}\nsink: {{type: parquet, path: out.parquet}}\n"
    );
    let (code, text) = run(dir.path(), &yaml, &proxy.endpoint, &[]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("2000 file(s)"), "{text}");
    // The listing came in pages, and reading started before the last page was fetched.
    let log = proxy.faults.log.lock().unwrap().clone();
    assert!(
        proxy.faults.lists.load(Ordering::SeqCst) >= 2,
        "expected paginated listing: {log}"
    );
    let first_read = log.find('R').unwrap();
    let last_list = log.rfind('L').unwrap();
    assert!(
        first_read < last_list,
        "reading must start before listing ends: {}",
        &log[..last_list + 1]
    );
    let out = read_parquet(&dir.path().join("out.parquet"));
    let ids = int64_values(&out, "id");
    assert_eq!(
        ids,
        (0..2000).collect::<Vec<_>>(),
        "every object once, in key order"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn manifest_reads_need_no_listing() {
    let bucket = s3::bucket("manifest");
    let parts = digits_parts(3);
    upload(&bucket, "ds", &parts).await;
    let files: Vec<String> = parts
        .iter()
        .map(|(n, b)| format!("{{\"path\": \"{n}\", \"size\": {}}}", b.len()))
        .collect();
    let manifest = format!("{{\"files\": [{}]}}", files.join(", "));
    s3::store(&bucket)
        .put(
            &ObjectPath::from("ds/manifest.json"),
            PutPayload::from(manifest.into_bytes()),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let reference = local_reference(dir.path(), &parts);

    let proxy = Proxy::start();
    let yaml = format!(
        "source: {{type: parquet, manifest: 's3://{bucket}/ds/manifest.json'}}\n{STAGES}sink: {{type: parquet, path: m.parquet}}\n"
    );
    let (code, text) = run(dir.path(), &yaml, &proxy.endpoint, &[]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(
        proxy.faults.lists.load(Ordering::SeqCst),
        0,
        "a manifest read must not list"
    );
    assert!(proxy.faults.requests.load(Ordering::SeqCst) > 3);
    assert_eq!(read_parquet(&dir.path().join("m.parquet")), reference);

    // The same dataset by glob does list (so the counter above can see listings).
    let yaml = format!(
        "source: {{type: parquet, path: 's3://{bucket}/ds/*.parquet'}}\n{STAGES}sink: {{type: parquet, path: g.parquet}}\n"
    );
    let (code, text) = run(dir.path(), &yaml, &proxy.endpoint, &[]);
    assert_eq!(code, 0, "{text}");
    assert!(proxy.faults.lists.load(Ordering::SeqCst) >= 1);
    assert_eq!(read_parquet(&dir.path().join("g.parquet")), reference);
}

#[tokio::test(flavor = "multi_thread")]
async fn server_dying_mid_read_is_retried_and_output_is_identical() {
    let bucket = s3::bucket("flaky");
    let parts = digits_parts(4);
    upload(&bucket, "d", &parts).await;
    let dir = tempfile::tempdir().unwrap();
    let reference = local_reference(dir.path(), &parts);

    // The first 5 data reads die with the connection, as if the server was killed mid-read.
    let proxy = proxy_dropping_data_reads(5);
    let yaml = format!(
        "source:\n  type: parquet\n  path: 's3://{bucket}/d/*.parquet'\n  storage: {{retry: {{max_retries: 10, initial_backoff_secs: 0.05}}}}\n{STAGES}sink: {{type: parquet, path: f.parquet}}\n"
    );
    let (code, text) = run(dir.path(), &yaml, &proxy.endpoint, &[]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(
        proxy.faults.broken.load(Ordering::SeqCst),
        5,
        "the faults were injected"
    );
    assert_eq!(read_parquet(&dir.path().join("f.parquet")), reference);
}

#[tokio::test(flavor = "multi_thread")]
async fn server_down_beyond_the_retry_budget_fails_cleanly() {
    let bucket = s3::bucket("down");
    upload(&bucket, "d", &digits_parts(2)).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = proxy_dropping_data_reads(u64::MAX);
    let direct = s3::endpoint();
    let yaml = format!(
        "source:\n  type: parquet\n  path: 's3://{bucket}/d/*.parquet'\n  storage: {{retry: {{max_retries: 2, timeout_secs: 5, initial_backoff_secs: 0.05}}}}\n{STAGES}\
         sink:\n  type: parquet\n  path: 's3://{bucket}/out/x.parquet'\n  storage: {{options: {{endpoint: '{direct}'}}}}\n"
    );
    let (code, text) = run(dir.path(), &yaml, &proxy.endpoint, &[]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(&format!("s3://{bucket}/d/part-000.parquet")),
        "names the object: {text}"
    );
    assert!(
        text.contains("within bytes 4..") || text.contains("reading bytes 4.."),
        "names the byte range: {text}"
    );
    assert!(text.contains("retry budget"), "{text}");
    assert!(
        !text.contains("corrupt"),
        "an outage is not corruption: {text}"
    );
    assert!(
        text.contains("after 2 retries") || text.contains("retries"),
        "says it retried: {text}"
    );
    // No output object, not even a partial one.
    let listed: Vec<_> = s3::store(&bucket)
        .list(Some(&ObjectPath::from("out")))
        .try_collect()
        .await
        .unwrap();
    assert!(listed.is_empty(), "partial output: {listed:?}");
    let uploads = proxy.faults.requests.load(Ordering::SeqCst);
    assert!(uploads > 0);
}

/// A store that comes back from an outage without the bucket (an emulator restarted without
/// its data) answers `NoSuchBucket`: the error says the bucket is gone, on one line, not
/// "check that it is reachable" nor "deleted while being read". (The proxy gives moto's own
/// `NoSuchBucket` answer once the outage ends, so no request can see a half-deleted bucket.)
#[tokio::test(flavor = "multi_thread")]
async fn a_bucket_gone_after_an_outage_is_named() {
    let bucket = s3::bucket("vanish");
    let parts = digits_parts(2);
    upload(&bucket, "d", &parts).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = proxy_dropping_data_reads(u64::MAX);
    let yaml = format!(
        "source:\n  type: parquet\n  path: 's3://{bucket}/d/*.parquet'\n  storage: {{retry: {{max_retries: 30, timeout_secs: 120, initial_backoff_secs: 0.05}}}}\n{STAGES}sink: {{type: parquet, path: f.parquet}}\n"
    );
    let (path, endpoint) = (dir.path().to_path_buf(), proxy.endpoint.clone());
    // Bounded: the retry budget (120 s) ends the run if the store never answers again.
    let sluice = std::thread::spawn(move || run(&path, &yaml, &endpoint, &[]));
    // Down: a data read was broken, and the reader is retrying.
    wait_for(
        "a broken data read",
        std::time::Duration::from_secs(60),
        || (proxy.faults.broken.load(Ordering::SeqCst) > 0).then_some(()),
    );
    // Back, without the bucket.
    proxy.faults.no_bucket.store(true, Ordering::SeqCst);
    proxy.faults.drop_data_reads.store(0, Ordering::SeqCst);
    let (code, text) = sluice.join().unwrap();
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("The bucket does not exist (any more)"),
        "{text}"
    );
    assert!(
        text.contains("NoSuchBucket (The specified bucket does not exist)")
            && !text.contains("<?xml"),
        "one line, the store's code and message without its XML: {text}"
    );
    assert!(
        !text.contains("reachable") && !text.contains("deleted or replaced"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_bucket_missing_object_and_bad_credentials_get_one_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let ep = s3::endpoint();

    let yaml = "source: {type: parquet, path: 's3://no-such-bucket-sluice/x/*.parquet'}\n";
    let (code, text) = run(dir.path(), yaml, &ep, &[]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("s3://no-such-bucket-sluice"), "{text}");
    assert!(
        text.contains("NoSuchBucket (The specified bucket does not exist). The bucket does not exist: check its name"),
        "{text}"
    );
    // On one line: not the server's XML body, split over two `error:` lines.
    assert!(
        !text.contains("<?xml") && !text.contains("<Error>"),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("error: ")).count(),
        1,
        "one message: {text}"
    );

    let bucket = s3::bucket("missing");
    let yaml = format!("source: {{type: parquet, path: 's3://{bucket}/nope.parquet'}}\n");
    let (code, text) = run(dir.path(), &yaml, &ep, &[]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(&format!("no files match `s3://{bucket}/nope.parquet`")),
        "{text}"
    );

    // moto accepts any credentials unless configured otherwise, so the proxy answers like S3
    // does for an unknown access key.
    let proxy = Proxy::start();
    proxy
        .faults
        .reject_key
        .lock()
        .unwrap()
        .replace("BADKEY".into());
    let yaml = format!(
        "source:\n  type: parquet\n  path: 's3://{bucket}/x.parquet'\n  storage: {{options: {{access_key_id: BADKEY, secret_access_key: '{SECRET}'}}}}\n"
    );
    let (code, text) = run(dir.path(), &yaml, &proxy.endpoint, &["-vv"]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("Access denied: check the credentials"),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("error: ")).count(),
        1,
        "one message: {text}"
    );
}

/// `partitioning: hive` on S3: the `key=value` directories of the keys become columns, the
/// same as from local disk (tests/cli.rs), a URI-encoded value and Hive's null included.
#[tokio::test(flavor = "multi_thread")]
async fn hive_partition_directories_on_s3_become_columns() {
    let bucket = s3::bucket("hive");
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<(String, Vec<u8>)> = HIVE_LAYOUT
        .iter()
        .map(|(path, id, _, _)| (path.to_string(), one_row_parquet(*id)))
        .collect();
    upload(&bucket, "hive", &files).await;
    let yaml = format!(
        "source: {{type: parquet, path: 's3://{bucket}/hive/**/*.parquet', partitioning: hive}}\nsink: {{type: parquet, path: out.parquet}}\n"
    );
    let (code, text) = run(dir.path(), &yaml, &s3::endpoint(), &[]);
    assert_eq!(code, 0, "{text}");
    assert_hive_columns(&read_parquet(&dir.path().join("out.parquet")));
}

#[tokio::test(flavor = "multi_thread")]
async fn partitioned_layouts_are_listed_partition_by_partition_in_key_order() {
    let bucket = s3::bucket("parts");
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    // Partition names chosen so that name order and key order differ (`a-b/` < `a/`).
    for (p, part) in ["a", "a-b", "b", "c"].iter().enumerate() {
        for j in 0..25i64 {
            let id = p as i64 * 100 + j;
            files.push((format!("{part}/f-{j:03}.parquet"), one_row_parquet(id)));
        }
    }
    upload(&bucket, "part", &files).await;
    // A decoy that the pattern must not match.
    upload(
        &bucket,
        "part/a",
        &[("notes.txt".to_string(), b"x".to_vec())],
    )
    .await;
    let proxy = Proxy::start();
    let yaml = format!(
        "source: {{type: parquet, path: 's3://{bucket}/part/*/f-*.parquet'}}\nsink: {{type: parquet, path: out.parquet}}\n"
    );
    let (code, text) = run(dir.path(), &yaml, &proxy.endpoint, &[]);
    assert_eq!(code, 0, "{text}");
    let out = read_parquet(&dir.path().join("out.parquet"));
    let ids = int64_values(&out, "id");
    // Key order: a-b/ (100..) < a/ (0..) < b/ (200..) < c/ (300..).
    let expected: Vec<i64> = [1, 0, 2, 3]
        .iter()
        .flat_map(|p| (0..25).map(move |j| p * 100 + j))
        .collect();
    assert_eq!(ids, expected);
    assert!(
        proxy.faults.lists.load(Ordering::SeqCst) >= 5,
        "one delimited listing plus one per partition"
    );
}

/// A `mix` of two S3 prefixes reads exactly the rows a local copy of the same files does (the
/// datasets are told apart by the `path` entry that listed them, on either store).
#[tokio::test(flavor = "multi_thread")]
async fn a_mix_of_s3_prefixes_reads_what_a_local_copy_does() {
    let bucket = s3::bucket("mix");
    let parts = digits_parts(4);
    upload(&bucket, "digits/a", &parts[..1]).await;
    upload(&bucket, "digits/b", &parts[1..]).await;
    let dir = tempfile::tempdir().unwrap();
    for (sub, files) in [("a", &parts[..1]), ("b", &parts[1..])] {
        let d = dir.path().join("local").join(sub);
        std::fs::create_dir_all(&d).unwrap();
        for (name, bytes) in files {
            std::fs::write(d.join(name), bytes).unwrap();
        }
    }
    let yaml = |a: &str, b: &str, out: &str| {
        format!(
            "source: {{type: parquet, path: ['{a}', '{b}'], epochs: 2, mix: {{weights: [1, 2], seed: 5}}}}\n{STAGES}sink: {{type: parquet, path: {out}}}\n"
        )
    };
    let (code, text) = run(
        dir.path(),
        &yaml("local/a/*.parquet", "local/b/*.parquet", "local.parquet"),
        &s3::endpoint(),
        &[],
    );
    assert_eq!(code, 0, "{text}");
    let (code, text) = run(
        dir.path(),
        &yaml(
            &format!("s3://{bucket}/digits/a/*.parquet"),
            &format!("s3://{bucket}/digits/b/"),
            "s3.parquet",
        ),
        &s3::endpoint(),
        &[],
    );
    assert_eq!(code, 0, "{text}");
    // 360 rows in a, 1077 in b; weighed 1 : 2, an epoch is all of a and 720 of b.
    assert!(
        text.contains(&format!(
            "mix      s3://{bucket}/digits/a/*.parquet: 360 of its 360 rows each epoch"
        )) && text.contains(&format!(
            "mix      s3://{bucket}/digits/b/: 720 of its 1077 rows each epoch"
        )),
        "{text}"
    );
    let (local, remote) = (
        read_parquet(&dir.path().join("local.parquet")),
        read_parquet(&dir.path().join("s3.parquet")),
    );
    assert_eq!(rows(&remote), 2 * 1080);
    assert_eq!(int64_values(&remote, "id"), int64_values(&local, "id"));
}

/// A global shuffle over S3 delivers what it delivers over a local copy of the same files,
/// batch for batch, whichever way a block reads a row group (pages of 10 rows): most of its
/// rows, the span decoded and filtered (blocks of ~600 rows: every row group so), or some of
/// them, only the pages holding them (blocks of ~110 rows: about 40 % of the row groups so,
/// the rest the first way).
#[tokio::test(flavor = "multi_thread")]
async fn a_global_shuffle_reads_from_s3_what_it_reads_from_disk() {
    use parquet::file::properties::WriterProperties;
    let bucket = s3::bucket("global");
    let all = read_parquet(&repo().join("data/digits/train.parquet"));
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("local");
    std::fs::create_dir_all(&local).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(200))
        .set_data_page_row_count_limit(10)
        .set_write_batch_size(10)
        .build();
    let path = local.join("part-000.parquet");
    let file = std::fs::File::create(&path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, all[0].schema(), Some(props)).unwrap();
    for b in &all {
        w.write(b).unwrap();
    }
    w.close().unwrap();
    let parts = vec![(
        "part-000.parquet".to_string(),
        std::fs::read(&path).unwrap(),
    )];
    upload(&bucket, "digits", &parts).await;
    for memory in ["300 KiB", "55 KiB"] {
        let yaml = |from: &str, out: &str| {
            format!(
                "source: {{type: parquet, path: '{from}', epochs: 2}}\n\
                 stages:\n\
                 - {{type: shuffle, mode: global, max_memory: {memory}, seed: 7, batch_rows: 64}}\n\
                 sink: {{type: parquet, path: {out}}}\n"
            )
        };
        let (code, text) = run(
            dir.path(),
            &yaml("local/*.parquet", "local.parquet"),
            &s3::endpoint(),
            &[],
        );
        assert_eq!(code, 0, "{text}");
        let from = format!("s3://{bucket}/digits/*.parquet");
        let (code, text) = run(dir.path(), &yaml(&from, "s3.parquet"), &s3::endpoint(), &[]);
        assert_eq!(code, 0, "{text}");
        let (local, remote) = (
            read_parquet(&dir.path().join("local.parquet")),
            read_parquet(&dir.path().join("s3.parquet")),
        );
        let schema = local[0].schema();
        assert_eq!(
            arrow::compute::concat_batches(&schema, &remote).unwrap(),
            arrow::compute::concat_batches(&schema, &local).unwrap(),
            "blocks of {memory}: S3 and local disk differ"
        );
        let mut ids = int64_values(&remote, "id");
        assert_ne!(ids[..1437], int64_values(&all, "id")[..], "not shuffled");
        ids.sort_unstable();
        let want: Vec<i64> = (int64_values(&all, "id").into_iter())
            .flat_map(|i| [i, i])
            .collect();
        let mut want = want;
        want.sort_unstable();
        assert_eq!(ids, want, "blocks of {memory}: each row once per epoch");
    }
}
