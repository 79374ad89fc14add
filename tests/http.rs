//! `http://` sources against a real HTTP server (Python's http.server with Range requests,
//! PyPI `rangehttpserver`, started by `scripts/services.sh`): files named by URL read as they
//! do from local disk, and a missing URL is a clear error. `https://` against the same folder
//! served over TLS with a certificate of the suite's test CA: read with the CA named by
//! `storage.options.ca_certificate`, refused clearly without it. (A plain HTTP server has no
//! listing and no credentials: a glob or prefix needs WebDAV, and refused credentials are
//! tested on S3 and Azure.)
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};

use common::*;

/// The server's URL and the folder it serves.
fn server() -> (String, PathBuf) {
    let url = std::env::var("SLUICE_TEST_HTTP").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_HTTP is not set: the HTTP tests need the HTTP server. Run the suite with \
             scripts/test.sh, or `eval \"$(scripts/services.sh start)\"` first"
        )
    });
    let root = std::env::var("SLUICE_TEST_HTTP_ROOT").unwrap();
    (url, PathBuf::from(root))
}

/// The digits training set in two files under a fresh folder of the server's root: the URLs.
fn serve_digits(name: &str) -> (Vec<String>, Vec<PathBuf>) {
    let (url, root) = server();
    let dir = root.join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let all = read_parquet(&repo().join("data/digits/train.parquet"));
    let all = arrow::compute::concat_batches(&all[0].schema(), &all).unwrap();
    let half = all.num_rows() / 2;
    let mut urls = Vec::new();
    let mut files = Vec::new();
    for (i, (start, len)) in [(0, half), (half, all.num_rows() - half)]
        .into_iter()
        .enumerate()
    {
        let p = dir.join(format!("part-{i}.parquet"));
        write_parquet(&p, &[all.slice(start, len)], 300);
        urls.push(format!(
            "{url}/{}/part-{i}.parquet",
            dir.file_name().unwrap().to_string_lossy()
        ));
        files.push(p);
    }
    (urls, files)
}

fn run(dir: &Path, sources: &[String]) -> (i32, String) {
    run_cast_job(dir, sources, "")
}

#[test]
fn files_named_by_url_read_as_from_local_disk() {
    let (urls, files) = serve_digits("read");
    let local: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (code, text) = run(a.path(), &local);
    assert_eq!(code, 0, "{text}");
    let (code, text) = run(b.path(), &urls);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("2 file(s)"), "{text}");
    let want = read_parquet(&a.path().join("out.parquet"));
    let got = read_parquet(&b.path().join("out.parquet"));
    assert_eq!(rows(&got), 1437);
    let schema = want[0].schema();
    assert_eq!(
        arrow::compute::concat_batches(&schema, &got).unwrap(),
        arrow::compute::concat_batches(&schema, &want).unwrap(),
        "read over HTTP differs from the local read"
    );
}

#[test]
fn a_missing_url_is_a_clear_error() {
    let (urls, _) = serve_digits("missing");
    let missing = urls[0].replace("part-0", "none");
    let dir = tempfile::tempdir().unwrap();
    let out = sluice()
        .args(["inspect", &missing])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("none.parquet") && err.contains("no files match"),
        "{err}"
    );
    assert!(
        !err.contains("PROPFIND"),
        "no listing a plain HTTP server cannot answer: {err}"
    );
}

/// The HTTPS server's URL (the same folder as the HTTP server's) and its CA's PEM file.
fn https() -> (String, String) {
    let url = std::env::var("SLUICE_TEST_HTTPS")
        .expect("SLUICE_TEST_HTTPS is not set; use scripts/test.sh");
    (url, std::env::var("SLUICE_TEST_TLS_CA").unwrap())
}

#[test]
fn files_over_https_read_as_from_local_disk_with_the_servers_ca_named() {
    let (urls, files) = serve_digits("tls");
    let (base, ca) = https();
    let (plain, _) = server();
    let secure: Vec<String> = urls.iter().map(|u| u.replace(&plain, &base)).collect();
    assert!(secure[0].starts_with("https://"));
    let local: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (code, text) = run(a.path(), &local);
    assert_eq!(code, 0, "{text}");
    let (code, text) = run_cast_job(
        b.path(),
        &secure,
        &format!("{{options: {{ca_certificate: '{ca}', timeout: 30s}}}}"),
    );
    assert_eq!(code, 0, "{text}");
    let want = read_parquet(&a.path().join("out.parquet"));
    let got = read_parquet(&b.path().join("out.parquet"));
    let schema = want[0].schema();
    assert_eq!(
        arrow::compute::concat_batches(&schema, &got).unwrap(),
        arrow::compute::concat_batches(&schema, &want).unwrap(),
        "read over HTTPS differs from the local read"
    );
}

/// Without the CA the server's certificate is not trusted: one clear error within the default
/// retry budget (object_store retries it as a connection error: 10 retries, each backoff drawn
/// at random up to twice the one before, capped at 15 s — under 30 s in earlier runs, 38 s
/// once under the suite's load; at most ~56 s of backoff). A `ca_certificate` that is not
/// there, or not a certificate, is named with the file.
#[test]
fn an_untrusted_certificate_or_a_bad_ca_file_is_a_clear_error() {
    let (urls, _) = serve_digits("untrusted");
    let (base, _) = https();
    let (plain, _) = server();
    let secure = vec![urls[0].replace(&plain, &base)];
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let (code, text) = run(dir.path(), &secure);
    assert_eq!(code, 1, "{text}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(120),
        "{:?}",
        started.elapsed()
    );
    assert!(text.contains("certificate"), "{text}");
    assert!(text.contains("ca_certificate"), "names the way out: {text}");

    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    for (file, says) in [
        (dir.path().join("none.pem"), "cannot read"),
        (not_pem, "holds no PEM certificate"),
    ] {
        let (code, text) = run_cast_job(
            dir.path(),
            &secure,
            &format!("{{options: {{ca_certificate: '{}'}}}}", file.display()),
        );
        assert_eq!(code, 1, "{text}");
        assert!(
            text.contains("storage option `ca_certificate`") && text.contains(says),
            "{text}"
        );
    }
}

/// A sink on an HTTP URL is refused before anything is read (the HTTP store cannot take the
/// sinks' uploads in parts); nothing is written there.
#[test]
fn a_sink_on_http_is_refused_before_the_run() {
    let (url, root) = server();
    let dir = tempfile::tempdir().unwrap();
    let name = format!("sink-{}", std::process::id());
    std::fs::write(
        dir.path().join("w.yaml"),
        format!(
            "source: {{type: parquet, path: '{}'}}\nsink: {{type: parquet, path: '{url}/{name}/out.parquet'}}\n",
            repo().join("data/digits/test.parquet").display()
        ),
    )
    .unwrap();
    let out = sluice()
        .args(["run", "w.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a sink cannot write to http(s)://"), "{err}");
    assert!(!err.contains("rows"), "refused before the run: {err}");
    assert!(!root.join(&name).exists());
}
