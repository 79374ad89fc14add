//! Azure Blob storage against a real server: Azurite (npm `azurite`, the Azure SDKs'
//! emulator, started by `scripts/services.sh`) — the checks S3 has against moto: a
//! multi-file dataset reads as it does from local disk, a sink's object reads back, a missing
//! object and a refused key are clear errors, and the key is never printed.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::RecordBatch;
use common::*;
use futures::StreamExt;
use object_store::azure::{MicrosoftAzure, MicrosoftAzureBuilder};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};

/// Azurite's account and its published development key (not a secret: every Azure SDK ships
/// it); the tests still check that no output ever contains a key.
const ACCOUNT: &str = "devstoreaccount1";
const KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// A well-formed key Azurite refuses.
const WRONG_KEY: &str =
    "c2x1aWNlLXdyb25nLWtleS1zbHVpY2Utd3Jvbmcta2V5LXNsdWljZS13cm9uZy1rZXktc2x1aWNlLXdyb25nLWtleQ==";

/// Azurite's blob endpoint; the suite cannot run without it.
fn endpoint() -> String {
    std::env::var("SLUICE_TEST_AZURITE").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_AZURITE is not set: the Azure tests need Azurite. Run the suite with \
             scripts/test.sh, or `eval \"$(scripts/services.sh start)\"` first"
        )
    })
}

/// Environment for a `sluice` process talking to Azurite with `key`.
fn env(key: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AZURE_STORAGE_ACCOUNT_NAME", ACCOUNT.to_string()),
        ("AZURE_STORAGE_ACCOUNT_KEY", key.to_string()),
        (
            "AZURE_STORAGE_ENDPOINT",
            format!("{}/{ACCOUNT}", endpoint()),
        ),
        ("AZURE_ALLOW_HTTP", "true".to_string()),
    ]
}

/// A fresh container (created with the `azure-storage-blob` SDK in the package's venv:
/// `object_store` does not create containers).
fn container(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let script = "import sys\nfrom azure.storage.blob import BlobServiceClient\n\
        cs = 'DefaultEndpointsProtocol=http;AccountName=%s;AccountKey=%s;BlobEndpoint=%s/%s;' \
        % (sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[1])\n\
        BlobServiceClient.from_connection_string(cs).create_container(sys.argv[4])\n";
    let out = std::process::Command::new(venv_python())
        .args(["-c", script, ACCOUNT, KEY, &endpoint(), &name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    name
}

fn store(container: &str) -> MicrosoftAzure {
    MicrosoftAzureBuilder::new()
        .with_account(ACCOUNT)
        .with_access_key(KEY)
        .with_container_name(container)
        .with_endpoint(format!("{}/{ACCOUNT}", endpoint()))
        .with_allow_http(true)
        .build()
        .unwrap()
}

/// The digits training set in `parts` Parquet files.
fn digits_parts(parts: usize) -> Vec<(String, Vec<u8>)> {
    let all = read_parquet(&repo().join("data/digits/train.parquet"));
    let all = arrow::compute::concat_batches(&all[0].schema(), &all).unwrap();
    let per = all.num_rows().div_ceil(parts);
    (0..parts)
        .map(|i| {
            let (start, dir) = (i * per, tempfile::tempdir().unwrap());
            let p = dir.path().join("x.parquet");
            write_parquet(
                &p,
                &[all.slice(start, per.min(all.num_rows() - start))],
                200,
            );
            (format!("part-{i:03}.parquet"), std::fs::read(&p).unwrap())
        })
        .collect()
}

async fn upload(container: &str, prefix: &str, files: &[(String, Vec<u8>)]) {
    let store = store(container);
    futures::stream::iter(files.iter().map(|(name, bytes)| {
        let store = &store;
        async move {
            let path = ObjectPath::from(format!("{prefix}/{name}"));
            store
                .put(&path, PutPayload::from(bytes.clone()))
                .await
                .unwrap();
        }
    }))
    .buffer_unordered(8)
    .collect::<Vec<_>>()
    .await;
}

/// `sluice <args>` in `dir` against Azurite with `key`: (exit code, stdout + stderr); no key
/// may appear in it.
fn sluice_with(dir: &Path, args: &[&str], key: &str) -> (i32, String) {
    let out = sluice()
        .args(args)
        .current_dir(dir)
        .envs(env(key))
        .output()
        .unwrap();
    let text = output_text(&out);
    for k in [KEY, WRONG_KEY] {
        assert!(!text.contains(k), "a key leaked into the output:\n{text}");
    }
    (out.status.code().unwrap_or(-1), text)
}

const STAGES: &str =
    "stages:\n- {type: cast, columns: {pixels: float32}}\n- {type: batch, size: 100}\n";

fn run_job(dir: &Path, source: &str, sink: &str) -> (i32, String) {
    let yaml = format!(
        "source: {{type: parquet, path: '{source}'}}\n{STAGES}sink: {{type: parquet, path: '{sink}'}}\n"
    );
    std::fs::write(dir.join("p.yaml"), yaml).unwrap();
    sluice_with(dir, &["run", "p.yaml"], KEY)
}

#[tokio::test(flavor = "multi_thread")]
async fn reads_a_multi_file_dataset_like_local_disk_and_writes_back() {
    let c = container("read");
    let parts = digits_parts(4);
    upload(&c, "digits/train", &parts).await;
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("local");
    std::fs::create_dir_all(&local).unwrap();
    for (name, bytes) in &parts {
        std::fs::write(local.join(name), bytes).unwrap();
    }
    let (code, text) = run_job(dir.path(), "local/*.parquet", "ref.parquet");
    assert_eq!(code, 0, "{text}");
    let reference: Vec<RecordBatch> = read_parquet(&dir.path().join("ref.parquet"));
    assert_eq!(rows(&reference), 1437);

    // Azure in, Azure out.
    let (code, text) = run_job(
        dir.path(),
        &format!("az://{c}/digits/train/*.parquet"),
        &format!("az://{c}/out/digits.parquet"),
    );
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("4 file(s)"), "{text}");
    let bytes = store(&c)
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
        "the Azure round trip differs from the local run"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_object_and_a_refused_key_are_clear_errors() {
    let c = container("errors");
    upload(&c, "digits", &digits_parts(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("az://{c}/digits/none.parquet");
    let (code, text) = sluice_with(dir.path(), &["inspect", &missing], KEY);
    assert_ne!(code, 0);
    assert!(
        text.contains(&missing) || text.contains("none.parquet"),
        "{text}"
    );
    assert!(text.contains("no files match"), "{text}");
    let present = format!("az://{c}/digits/part-000.parquet");
    let (code, text) = sluice_with(dir.path(), &["inspect", &present], KEY);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("1437 rows"), "{text}");
    // A key the server refuses: an error naming the object and the refusal, in bounded time.
    let started = std::time::Instant::now();
    let (code, text) = sluice_with(dir.path(), &["inspect", &present], WRONG_KEY);
    assert_ne!(code, 0);
    assert!(text.contains("part-000.parquet"), "{text}");
    assert!(
        text.contains("403") || text.to_lowercase().contains("auth"),
        "{text}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}
