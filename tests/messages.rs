//! Messages say what really happened, the CLI behaves like a Unix tool, and the summary's
//! counts are right: a closed stdout, unwritable `--summary-json`/`--report` paths, local read
//! errors, encrypted and corrupt Parquet, page checksums, `inspect`'s own hints, `one_hot`
//! labels out of range, decoded bytes and dead-letter counts.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use arrow::array::{BinaryArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use common::*;

fn digits() -> PathBuf {
    repo().join("data/digits/train.parquet")
}

/// Runs `sluice ARGS` in `dir`; returns (exit code, stdout, stderr). A panic fails the test.
fn sluice_in(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = sluice().args(args).current_dir(dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (out.status.code(), stdout, stderr)
}

/// `sluice run p.yaml` in `dir` with `yaml` as p.yaml, expected to fail with exit code 1;
/// returns stderr.
fn run_fails(dir: &Path, yaml: &str) -> String {
    std::fs::write(dir.join("p.yaml"), yaml).unwrap();
    let (code, _, stderr) = sluice_in(dir, &["run", "p.yaml"]);
    assert_eq!(code, Some(1), "{stderr}");
    stderr
}

fn source_of(file: &str) -> String {
    format!(
        "source: {{type: parquet, path: '{file}'}}\nsink: {{type: parquet, path: out/x.parquet}}\n"
    )
}

/// `sluice inspect big.parquet | head -2`: the reader goes away, the command ends quietly
/// with exit code 0, never with a panic.
#[test]
fn a_closed_stdout_ends_inspect_quietly() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("big.parquet");
    let batch = RecordBatch::try_from_iter([("id", arc(Int64Array::from_iter_values(0..100_000)))])
        .unwrap();
    write_parquet(&path, &[batch], 100_000);
    // About 1.5 MB of lines: far more than a pipe holds.
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin!("sluice"))
        .args(["inspect", "-n", "100000"])
        .arg(&path)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 64];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
}

/// A run whose stdout is already closed still runs into its sink, writes its summary JSON
/// and exits with its own code.
#[test]
fn a_run_with_a_closed_stdout_still_finishes() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(
        t.path().join("p.yaml"),
        format!(
            "source: {{type: parquet, path: '{}'}}\nsink: {{type: parquet, path: x.parquet}}\n",
            digits().display()
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin!("sluice"))
        .args(["run", "p.yaml", "--summary-json", "s.json", "--no-report"])
        .current_dir(t.path())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(t.path().join("s.json")).unwrap()).unwrap();
    assert_eq!(summary["rows_written"], 1437);
    assert_eq!(rows(&read_parquet(&t.path().join("x.parquet"))), 1437);
}

/// `--summary-json` and `--report` paths that cannot be written are refused before the run
/// (exit code 2), naming the flag and why; nothing is read or written.
#[test]
fn unwritable_summary_and_report_paths_are_refused_before_the_run() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    std::fs::write(
        dir.join("p.yaml"),
        source_of(&digits().display().to_string()),
    )
    .unwrap();
    std::fs::create_dir(dir.join("out")).unwrap();
    std::fs::create_dir(dir.join("sdir")).unwrap();
    std::fs::write(dir.join("afile"), b"keep").unwrap();
    for (args, expected) in [
        (
            vec!["--summary-json", "nodir/s.json"],
            "error: --summary-json nodir/s.json: cannot be written: the directory nodir does not exist",
        ),
        (
            vec!["--summary-json", "sdir"],
            "error: --summary-json sdir: is a directory; give the path of a file",
        ),
        (
            vec!["--report", "afile"],
            "error: --report afile: is not a directory",
        ),
    ] {
        let mut all = vec!["run", "p.yaml"];
        all.extend(args);
        let (code, _, stderr) = sluice_in(dir, &all);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
        assert_eq!(
            files_under(&dir.join("out")),
            Vec::<String>::new(),
            "it ran"
        );
    }
    assert_eq!(std::fs::read(dir.join("afile")).unwrap(), b"keep");
    assert!(!dir.join("sluice-report").exists());
}

/// A local file shorter than its footer says is blamed on the file, not on an object store,
/// its retry budget or its reachability.
#[test]
fn a_cut_local_file_is_reported_as_local() {
    let t = tempfile::tempdir().unwrap();
    let full = t.path().join("full.parquet");
    let batches: Vec<RecordBatch> = (0..3)
        .map(|i| {
            RecordBatch::try_from_iter([(
                "id",
                arc(Int64Array::from_iter_values(i * 10_000..(i + 1) * 10_000)),
            )])
            .unwrap()
        })
        .collect();
    write_parquet(&full, &batches, 10_000);
    let bytes = std::fs::read(&full).unwrap();
    let n = bytes.len();
    let meta_len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let footer = n - 8 - meta_len;
    // The footer stays, the second half of the data goes: the last row groups (each a
    // third of it) end past the end of the file.
    let mut cut = bytes[..footer / 2].to_vec();
    cut.extend_from_slice(&bytes[footer..]);
    std::fs::write(t.path().join("cut.parquet"), &cut).unwrap();
    let err = run_fails(t.path(), &source_of("cut.parquet"));
    assert!(err.contains("cut.parquet (row group "), "{err}");
    assert!(
        err.contains("The local file is shorter than its footer says"),
        "{err}"
    );
    for wrong in ["object store", "retry", "reachable", "credentials"] {
        assert!(!err.contains(wrong), "`{wrong}`: {err}");
    }
}

/// An encrypted file (footer ending in `PARE`) is named as encrypted and refused as
/// unsupported, by `run` and `inspect`; it is not "not Parquet or truncated".
#[test]
fn encrypted_parquet_is_named_as_such() {
    let t = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(digits()).unwrap();
    let n = bytes.len();
    bytes[n - 4..].copy_from_slice(b"PARE");
    std::fs::write(t.path().join("e.parquet"), &bytes).unwrap();
    let expected = "e.parquet: encrypted Parquet (Parquet modular encryption) is not supported; decrypt it first";
    let err = run_fails(t.path(), &source_of("e.parquet"));
    assert!(err.contains(expected), "{err}");
    assert!(
        !err.contains("not Parquet") && !err.contains("truncated"),
        "{err}"
    );
    let (code, _, err) = sluice_in(t.path(), &["inspect", "e.parquet"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(expected), "{err}");
}

/// Encrypted columns under a plaintext footer (the file ends in `PAR1` and its footer decodes):
/// named as encrypted before any page is read, not a decode error from ciphertext.
#[test]
fn encrypted_columns_under_a_plaintext_footer_are_named_as_encrypted() {
    use parquet::encryption::encrypt::FileEncryptionProperties;
    let t = tempfile::tempdir().unwrap();
    let batches = read_parquet(&digits());
    let encryption = FileEncryptionProperties::builder(b"0123456789012345".to_vec())
        .with_plaintext_footer(true)
        .build()
        .unwrap();
    let props = parquet::file::properties::WriterProperties::builder()
        .with_file_encryption_properties(encryption)
        .build();
    let file = std::fs::File::create(t.path().join("e.parquet")).unwrap();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(file, batches[0].schema(), Some(props)).unwrap();
    for b in &batches {
        w.write(b).unwrap();
    }
    w.close().unwrap();
    let bytes = std::fs::read(t.path().join("e.parquet")).unwrap();
    assert_eq!(&bytes[bytes.len() - 4..], b"PAR1", "not a plaintext footer");
    let expected = "e.parquet: encrypted Parquet (Parquet modular encryption) is not supported; decrypt it first";
    let err = run_fails(t.path(), &source_of("e.parquet"));
    assert!(err.contains(expected), "{err}");
    let (code, _, err) = sluice_in(t.path(), &["inspect", "e.parquet"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(expected), "{err}");
}

/// A file that ends with Parquet's marker but whose footer does not decode is a corrupt
/// footer, not "not Parquet": the hint follows the file's bytes, not the error's wording.
#[test]
fn a_corrupt_footer_is_not_called_not_parquet() {
    let t = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(digits()).unwrap();
    let n = bytes.len();
    let meta_len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let meta = n - 8 - meta_len;
    bytes[meta..meta + 8].fill(0xff);
    std::fs::write(t.path().join("f.parquet"), &bytes).unwrap();
    let err = run_fails(t.path(), &source_of("f.parquet"));
    assert!(err.contains("f.parquet: cannot decode Parquet"), "{err}");
    assert!(err.contains("corrupt"), "{err}");
    assert!(!err.contains("not Parquet"), "{err}");
}

/// `inspect` neither suggests running `inspect` nor mentions a config file.
#[test]
fn inspect_hints_fit_inspect() {
    let t = tempfile::tempdir().unwrap();
    let (code, _, err) = sluice_in(t.path(), &["inspect", "nowhere/*.parquet"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no files match `nowhere/*.parquet`"), "{err}");
    assert!(err.contains("relative to the current directory"), "{err}");
    assert!(!err.contains("config"), "{err}");

    std::fs::write(t.path().join("fake.parquet"), "id,label\n1,2\n").unwrap();
    let (code, _, err) = sluice_in(t.path(), &["inspect", "fake.parquet"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("not Parquet or is truncated"), "{err}");
    assert!(!err.contains("sluice inspect"), "{err}");
    // `run` still points at `inspect`.
    let err = run_fails(t.path(), &source_of("fake.parquet"));
    assert!(
        err.contains("`sluice inspect` shows what can be read"),
        "{err}"
    );
}

/// A one_hot label out of range says what to change, not something about nulls.
#[test]
fn one_hot_out_of_range_gets_a_range_hint() {
    let t = tempfile::tempdir().unwrap();
    let err = run_fails(
        t.path(),
        &format!(
            "source: {{type: parquet, path: '{}'}}\nstages:\n  - {{type: one_hot, column: label, num_classes: 5}}\nsink: {{type: null}}\n",
            digits().display()
        ),
    );
    assert!(err.contains("outside 0..5"), "{err}");
    assert!(err.contains("set `num_classes` to at least "), "{err}");
    assert!(!err.contains("fill_null"), "{err}");
}

// --- page checksums ---------------------------------------------------------------------

fn read_varint(b: &[u8]) -> (u64, usize) {
    let (mut v, mut shift) = (0u64, 0);
    for (i, &byte) in b.iter().enumerate() {
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return (v, i + 1);
        }
        shift += 7;
    }
    panic!("truncated varint");
}

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// CRC-32 (IEEE), as Parquet's page checksums use it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Writes a one-column file of `rows` copies of `value` (non-null strings) in one
/// uncompressed PLAIN data page with statistics in its header.
fn write_one_page(path: &Path, value: &str, rows: usize) {
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::properties::{EnabledStatistics, WriterProperties};
    let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, false)]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![arc(StringArray::from_iter_values(std::iter::repeat_n(
            value, rows,
        )))],
    )
    .unwrap();
    let props = WriterProperties::builder()
        .set_compression(Compression::UNCOMPRESSED)
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_write_page_header_statistics(true)
        .build();
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// The file `write_one_page` wrote, its data page header given a CRC of the page's bytes
/// (the Parquet writer used here writes none); with `corrupt`, one byte of the page is then
/// flipped. The header keeps its length — the statistics value in it gives up the bytes the
/// CRC field takes — so every offset in the footer stays right.
fn with_page_crc(path: &Path, value: &str, corrupt: bool) -> Vec<u8> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let b = std::fs::read(path).unwrap();
    let reader = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let chunk = reader.metadata().row_group(0).column(0);
    let start = chunk.data_page_offset() as usize;
    let end = start + chunk.compressed_size() as usize;
    // PageHeader (Thrift compact): fields 1 (type), 2 (uncompressed size), 3 (compressed
    // size), each an i32 (0x15, zigzag varint); then 5, the data page header (0x2c).
    let mut p = start;
    let mut last = 0;
    for _ in 0..3 {
        assert_eq!(b[p], 0x15, "unexpected page header layout");
        let (v, n) = read_varint(&b[p + 1..]);
        last = v;
        p += 1 + n;
    }
    assert_eq!(b[p], 0x2c, "unexpected page header layout");
    let page_size = (last >> 1) as usize;
    let body = end - page_size;
    let crc = crc32(&b[body..end]) as i32;
    // Field 4 (crc, i32), and field 5 is then one id after it (0x1c).
    let mut field = vec![0x15];
    field.extend(varint(u64::from(((crc << 1) ^ (crc >> 31)) as u32)));
    let mut out = b[..p].to_vec();
    out.extend_from_slice(&field);
    out.push(0x1c);
    out.extend_from_slice(&b[p + 1..]);
    let mut stat = vec![value.len() as u8];
    stat.extend_from_slice(value.as_bytes());
    let at = p + out[p..body]
        .windows(stat.len())
        .position(|w| w == stat.as_slice())
        .expect("page statistics in the header");
    out[at] = (value.len() - field.len()) as u8;
    out.drain(at + 1..at + 1 + field.len());
    assert_eq!(out.len(), b.len());
    if corrupt {
        out[body + page_size / 2] ^= 0x01;
    }
    out
}

/// Page CRCs are verified: a file whose checksums match reads as before; a page whose bytes
/// changed after it was written is an error naming the file, row group and column, with no
/// output left.
#[test]
fn page_checksums_are_verified() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    std::fs::create_dir(dir.join("out")).unwrap();
    let value = "p".repeat(40);
    write_one_page(&dir.join("plain.parquet"), &value, 100);
    std::fs::write(
        dir.join("good.parquet"),
        with_page_crc(&dir.join("plain.parquet"), &value, false),
    )
    .unwrap();
    std::fs::write(
        dir.join("bad.parquet"),
        with_page_crc(&dir.join("plain.parquet"), &value, true),
    )
    .unwrap();

    std::fs::write(dir.join("p.yaml"), source_of("good.parquet")).unwrap();
    let (code, _, err) = sluice_in(dir, &["run", "p.yaml", "--no-report"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(rows(&read_parquet(&dir.join("out/x.parquet"))), 100);
    std::fs::remove_file(dir.join("out/x.parquet")).unwrap();

    let err = run_fails(dir, &source_of("bad.parquet"));
    assert!(
        err.contains("bad.parquet (row group 0, column `s`): cannot decode Parquet"),
        "{err}"
    );
    assert!(err.contains("checksum"), "{err}");
    assert_eq!(files_under(&dir.join("out")), Vec::<String>::new());

    let (code, _, err) = sluice_in(dir, &["inspect", "bad.parquet"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("checksum"), "{err}");
    assert!(!err.contains("sluice inspect"), "{err}");
}

// --- counts -----------------------------------------------------------------------------

/// Decoded bytes are the values' size, however many row groups: 2,000 one-row row groups of
/// one non-null int64 column are 16,000 bytes (the decoder's reserved capacity counted
/// megabytes).
#[test]
fn decoded_bytes_count_values_not_capacity() {
    let t = tempfile::tempdir().unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let batch =
        RecordBatch::try_new(schema, vec![arc(Int64Array::from_iter_values(0..2000))]).unwrap();
    write_parquet(&t.path().join("many.parquet"), &[batch], 1);
    std::fs::write(
        t.path().join("p.yaml"),
        "source: {type: parquet, path: many.parquet}\nsink: {type: null}\n",
    )
    .unwrap();
    let (code, stdout, err) = sluice_in(
        t.path(),
        &["run", "p.yaml", "--summary-json", "s.json", "--no-report"],
    );
    assert_eq!(code, Some(0), "{err}");
    let s = summary_json(&t.path().join("s.json"));
    assert_eq!(s["row_groups"], 2000);
    assert_eq!(s["bytes_decoded"], 16_000);
    assert!(stdout.contains("0.02 MB decoded"), "{stdout}");
}

/// Rows an image stage dead-letters are counted in the summary, text and JSON alike.
#[test]
fn image_dead_letters_are_counted_in_text_and_json() {
    let t = tempfile::tempdir().unwrap();
    let good_png = tiny_png();
    let imgs: Vec<Vec<u8>> = (0..100)
        .map(|i| match i {
            13 | 40 | 41 | 77 | 99 => b"\x89PNG\r\n\x1a\nnot really".to_vec(),
            _ => good_png.clone(),
        })
        .collect();
    let batch = RecordBatch::try_from_iter([
        ("id", arc(Int64Array::from_iter_values(0..100))),
        (
            "img",
            arc(BinaryArray::from_iter_values(
                imgs.iter().map(|v| v.as_slice()),
            )),
        ),
    ])
    .unwrap();
    write_parquet(&t.path().join("imgs.parquet"), &[batch], 50);
    std::fs::write(
        t.path().join("p.yaml"),
        "source: {type: parquet, path: imgs.parquet}\nstages:\n  - {type: image, column: img, format: png, shape: [2, 2, 3], on_error: skip, dead_letter: {type: file, path: dlq}}\nsink: {type: null}\n",
    )
    .unwrap();
    let (code, stdout, err) = sluice_in(
        t.path(),
        &["run", "p.yaml", "--summary-json", "s.json", "--no-report"],
    );
    assert_eq!(code, Some(0), "{err}");
    let s = summary_json(&t.path().join("s.json"));
    assert_eq!(s["stages"][0]["rows_removed"], 5);
    assert_eq!(s["records_dead_lettered"], 5);
    assert!(stdout.contains("5 record(s) dead-lettered"), "{stdout}");
    let lines: usize = files_under(&t.path().join("dlq"))
        .iter()
        .map(|f| {
            std::fs::read_to_string(t.path().join("dlq").join(f))
                .unwrap()
                .lines()
                .count()
        })
        .sum();
    assert_eq!(lines, 5);
}

/// The `--summary-json` file a run wrote.
fn summary_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}
