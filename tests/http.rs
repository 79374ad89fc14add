//! `http://` sources against a real HTTP server (Python's http.server with Range requests,
//! PyPI `rangehttpserver`, started by `scripts/services.sh`): files named by URL read as they
//! do from local disk, and a missing URL is a clear error. (A plain HTTP server has no
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
    let list: Vec<String> = sources.iter().map(|s| format!("'{s}'")).collect();
    std::fs::write(
        dir.join("p.yaml"),
        format!(
            "source: {{type: parquet, path: [{}]}}\nstages:\n- {{type: cast, columns: {{pixels: float32}}}}\nsink: {{type: parquet, path: out.parquet}}\n",
            list.join(", ")
        ),
    )
    .unwrap();
    let out = sluice()
        .arg("run")
        .arg("p.yaml")
        .current_dir(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
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
