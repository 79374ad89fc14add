//! Corrupt Parquet input: truncated, bit-flipped and wrongly-sized copies of a small valid
//! file (five row groups of five columns, zstd, several pages per column chunk), each read by
//! `sluice run` into a Parquet file, in file order or through a global shuffle (`Reading`).
//! Whatever the damage, the run never panics, aborts or
//! hangs, the input is left byte for byte as it was, and a run that fails exits 1 with an
//! `error:` naming the file and leaves nothing at (or next to) the sink's path.
//!
//! A file cut short, a footer that does not add up, a footer length that points outside the
//! file, bytes after the footer, a manifest that gets the size or the row count wrong: no valid
//! file looks like that, so each of these must fail. A flipped bit inside the footer's metadata
//! or the data pages, or bytes before the file, may go unnoticed (a flipped digit of a statistic,
//! a value that still decodes; the `parquet` crate writes no page checksums): there the run may
//! also succeed, and the test prints how many were caught and whether an undetected one changed
//! the rows.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use arrow::array::{BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use common::{Rng, arc, files_under, int64_values, read_parquet, run_in_for};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};

const ROWS: usize = 1000;
const ROWS_PER_GROUP: usize = 200;
/// Seed of the positions of the random truncations and bit flips.
const SEED: u64 = 0xC0AA_0F7E_5EED_0032;
/// A run over a 1,000-row file takes well under a second: one still running after this long
/// is hung (a hang detector, not a timing check).
const HANG: Duration = Duration::from_secs(60);

/// The valid file: ids 0..1000, a nullable float, a dictionary-encoded string, a bool and a
/// fixed-size list of 4 float32 (read by the source's own list reader), in row groups of 200
/// rows and pages of 50, zstd.
fn write_original(path: &Path) {
    let ids: Vec<i64> = (0..ROWS as i64).collect();
    let x: Vec<Option<f64>> = ids
        .iter()
        .map(|i| (i % 7 != 0).then_some(*i as f64 / 4.0))
        .collect();
    let names: Vec<String> = ids.iter().map(|i| format!("row-{}", i % 37)).collect();
    let flags: Vec<bool> = ids.iter().map(|i| i % 3 == 0).collect();
    let batch = RecordBatch::try_from_iter([
        ("id", arc(Int64Array::from(ids))),
        ("x", arc(Float64Array::from(x))),
        ("name", arc(StringArray::from_iter_values(names))),
        ("flag", arc(BooleanArray::from(flags))),
        ("emb", arc(embeddings())),
    ])
    .unwrap();
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap()))
        .set_max_row_group_row_count(Some(ROWS_PER_GROUP))
        .set_data_page_row_count_limit(50)
        .set_write_batch_size(50)
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

/// Rows of 4 float32 without nulls: the shape of embeddings and feature vectors.
fn embeddings() -> arrow::array::FixedSizeListArray {
    let values =
        arrow::array::Float32Array::from_iter_values((0..ROWS * 4).map(|v| v as f32 * 0.25));
    let item = std::sync::Arc::new(arrow::datatypes::Field::new(
        "item",
        arrow::datatypes::DataType::Float32,
        false,
    ));
    arrow::array::FixedSizeListArray::new(item, 4, arc(values), None)
}

/// Where things are in the valid file.
#[derive(Debug)]
struct Layout {
    len: usize,
    /// Length of the footer's metadata (the `u32` before the closing magic).
    footer_len: usize,
    /// Where the footer's metadata starts.
    metadata: usize,
    /// Column chunks: (start, length).
    chunks: Vec<(usize, usize)>,
    /// End of the last column chunk (page indexes, if any, lie between it and the footer).
    data_end: usize,
}

fn layout_of(path: &Path, bytes: &[u8]) -> Layout {
    let reader = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let metadata = reader.metadata();
    assert_eq!(metadata.num_row_groups(), ROWS / ROWS_PER_GROUP);
    let chunks: Vec<(usize, usize)> = metadata
        .row_groups()
        .iter()
        .flat_map(|rg| {
            rg.columns().iter().map(|c| {
                let (start, len) = c.byte_range();
                (start as usize, len as usize)
            })
        })
        .collect();
    let len = bytes.len();
    assert_eq!(&bytes[..4], b"PAR1");
    assert_eq!(&bytes[len - 4..], b"PAR1");
    let footer_len = u32::from_le_bytes(bytes[len - 8..len - 4].try_into().unwrap()) as usize;
    let metadata = len - 8 - footer_len;
    let data_end = chunks.iter().map(|(s, l)| s + l).max().unwrap();
    assert!(
        chunks.iter().all(|(_, l)| *l > 16) && data_end > 1024 && data_end <= metadata,
        "unexpected layout: {chunks:?}, data to {data_end}, footer at {metadata} of {len}"
    );
    Layout {
        len,
        footer_len,
        metadata,
        chunks,
        data_end,
    }
}

/// One damaged file.
#[derive(Debug)]
struct Variant {
    /// File stem, unique (`v07-truncated-half`).
    name: String,
    /// What was done to it.
    what: String,
    /// Only an error is right: no valid file looks like this.
    must_fail: bool,
    /// The file as it lies on disk.
    bytes: Vec<u8>,
    /// Read through a manifest claiming (size, rows), instead of by path.
    manifest: Option<(u64, u64)>,
}

fn add(
    out: &mut Vec<Variant>,
    name: &str,
    what: String,
    must_fail: bool,
    bytes: Vec<u8>,
    manifest: Option<(u64, u64)>,
) {
    out.push(Variant {
        name: format!("v{:02}-{name}", out.len()),
        what,
        must_fail,
        bytes,
        manifest,
    });
}

fn flipped(bytes: &[u8], at: usize, bit: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out[at] ^= 1u8 << bit;
    out
}

fn with_footer_len(bytes: &[u8], value: u32) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let len = out.len();
    out[len - 8..len - 4].copy_from_slice(&value.to_le_bytes());
    out
}

fn variants(original: &[u8], l: &Layout) -> Vec<Variant> {
    let mut rng = Rng(SEED);
    let mut out = Vec::new();
    let len = l.len;

    // Cut short: the closing magic is gone, so none of these is a Parquet file (unless a
    // prefix happens to end in `PAR1` itself: then it is only "may read").
    let mut cuts: Vec<(String, usize)> = [
        ("empty", 0),
        ("magic-only", 4),
        ("5-bytes", 5),
        ("100-bytes", 100),
        ("half", len / 2),
        ("at-footer", l.metadata),
        ("mid-footer", l.metadata + l.footer_len / 2),
        ("before-footer-length", len - 8),
        ("9-short", len - 9),
        ("5-short", len - 5),
        ("1-short", len - 1),
    ]
    .iter()
    .map(|(name, cut)| (name.to_string(), *cut))
    .collect();
    if l.data_end < l.metadata {
        cuts.push(("at-page-index".to_string(), l.data_end));
    }
    for k in 0..3 {
        cuts.push((format!("random-{k}"), 9 + rng.below(len - 10)));
    }
    for (name, cut) in cuts {
        let bytes = original[..cut].to_vec();
        let must_fail = cut <= 8 || !bytes.ends_with(b"PAR1");
        add(
            &mut out,
            &format!("truncated-{name}"),
            format!("cut to {cut} of {len} bytes"),
            must_fail,
            bytes,
            None,
        );
    }
    add(
        &mut out,
        "magic-twice",
        "8 bytes: `PAR1PAR1`".to_string(),
        true,
        b"PAR1PAR1".to_vec(),
        None,
    );

    // The closing magic damaged.
    for at in [len - 4, len - 1] {
        let bit = rng.below(8);
        add(
            &mut out,
            &format!("closing-magic-flip-{}", len - at),
            format!("bit {bit} of byte {at} (the closing magic) flipped"),
            true,
            flipped(original, at, bit),
            None,
        );
    }
    // The opening magic damaged: readers work from the footer and need not look at it.
    let (at, bit) = (rng.below(4), rng.below(8));
    add(
        &mut out,
        "opening-magic-flip",
        format!("bit {bit} of byte {at} (the opening magic) flipped"),
        false,
        flipped(original, at, bit),
        None,
    );

    // The footer length: out of the file, or zero, must fail; off by a little may parse.
    let fl = l.footer_len as u32;
    for (name, value, must_fail) in [
        ("zero", 0, true),
        ("max", u32::MAX, true),
        ("past-start", (len - 8 + 1) as u32, true),
        ("bit-30", fl ^ (1 << 30), true),
        ("bit-0", fl ^ 1, false),
        ("bit-2", fl ^ 4, false),
    ] {
        add(
            &mut out,
            &format!("footer-length-{name}"),
            format!("footer length {fl} replaced by {value}"),
            must_fail,
            with_footer_len(original, value),
            None,
        );
    }

    // Bits flipped in the footer's metadata.
    for _ in 0..5 {
        let at = l.metadata + rng.below(l.footer_len);
        let bit = rng.below(8);
        add(
            &mut out,
            &format!("footer-flip-{at}"),
            format!(
                "bit {bit} of byte {at} (footer metadata, bytes {}..{}) flipped",
                l.metadata,
                len - 8
            ),
            false,
            flipped(original, at, bit),
            None,
        );
    }

    // Bits flipped in column chunks: page headers (the first bytes of a chunk), then pages.
    for k in 0..8 {
        let (start, size) = l.chunks[rng.below(l.chunks.len())];
        let (at, part) = if k < 2 {
            (start + rng.below(8), "a page header")
        } else {
            (start + 8 + rng.below(size - 8), "page data")
        };
        let bit = rng.below(8);
        add(
            &mut out,
            &format!("chunk-flip-{at}"),
            format!(
                "bit {bit} of byte {at} ({part} of the column chunk at bytes {start}..{}) flipped",
                start + size
            ),
            false,
            flipped(original, at, bit),
            None,
        );
    }
    // Bits flipped in the list column's chunks (the last of each row group's five).
    for k in 0..4 {
        let (start, size) = l.chunks[rng.below(l.chunks.len() / 5) * 5 + 4];
        let at = if k == 0 {
            start + rng.below(8)
        } else {
            start + 8 + rng.below(size - 8)
        };
        let bit = rng.below(8);
        add(
            &mut out,
            &format!("list-flip-{at}"),
            format!(
                "bit {bit} of byte {at} (the list column's chunk at bytes {start}..{}) flipped",
                start + size
            ),
            false,
            flipped(original, at, bit),
            None,
        );
    }
    if l.data_end < l.metadata {
        let at = l.data_end + rng.below(l.metadata - l.data_end);
        let bit = rng.below(8);
        add(
            &mut out,
            &format!("page-index-flip-{at}"),
            format!(
                "bit {bit} of byte {at} (page indexes, bytes {}..{}) flipped",
                l.data_end, l.metadata
            ),
            false,
            flipped(original, at, bit),
            None,
        );
    }
    // A hole of zeros, as a crash can leave in a file that was being written.
    let start = 4 + rng.below(l.data_end - 4 - 512);
    let mut zeroed = original.to_vec();
    zeroed[start..start + 512].fill(0);
    add(
        &mut out,
        "zeroed-512",
        format!("bytes {start}..{} zeroed", start + 512),
        false,
        zeroed,
        None,
    );

    // The wrong size: bytes before the file (every offset in the footer is now off), or after
    // it (the footer is not at the end).
    let mut shifted = b"NOT PARQUET DATA".to_vec();
    shifted.extend_from_slice(original);
    add(
        &mut out,
        "16-bytes-before",
        "16 bytes put before the file".to_string(),
        false,
        shifted,
        None,
    );
    let mut random: Vec<u8> = (0..37).map(|_| rng.next_u64() as u8).collect();
    if random.ends_with(b"PAR1") {
        random[36] = b'!';
    }
    for (name, tail) in [
        ("1-zero-after", &[0u8][..]),
        ("100-zeros-after", &[0u8; 100][..]),
        ("37-random-bytes-after", &random[..]),
    ] {
        let mut bytes = original.to_vec();
        bytes.extend_from_slice(tail);
        add(
            &mut out,
            name,
            format!("{} bytes appended after the footer", tail.len()),
            true,
            bytes,
            None,
        );
    }
    // The file intact, a manifest wrong about it.
    let (size, row_count) = (len as u64, ROWS as u64);
    for (name, claimed_size, claimed_rows) in [
        ("size-1-more", size + 1, row_count),
        ("size-1-less", size - 1, row_count),
        ("size-doubled", 2 * size, row_count),
        ("size-zero", 0, row_count),
        ("rows-1-more", size, row_count + 1),
    ] {
        add(
            &mut out,
            &format!("manifest-{name}"),
            format!(
                "intact file, but the manifest says {claimed_size} bytes and {claimed_rows} rows (it has {size} and {row_count})"
            ),
            true,
            original.to_vec(),
            Some((claimed_size, claimed_rows)),
        );
    }
    out
}

/// How a copy is read: in file order, or through a global shuffle whose blocks hold ~250 rows
/// (each row group's span from its first row to its last decoded, its rows filtered out) or
/// ~2 (a row's own pages decoded). The file's pages are too few for a block to skip any
/// (that way of reading meets damage in `pipeline/tests/global_shuffle.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    InOrder,
    GlobalSpans,
    GlobalRows,
}

impl Reading {
    const ALL: [Reading; 3] = [Reading::InOrder, Reading::GlobalSpans, Reading::GlobalRows];

    fn stages(self) -> &'static str {
        match self {
            Reading::InOrder => "",
            Reading::GlobalSpans => {
                "  - {type: shuffle, mode: global, seed: 3, max_memory: 40 KiB, batch_rows: 64}\n"
            }
            Reading::GlobalRows => {
                "  - {type: shuffle, mode: global, seed: 3, max_memory: 1 KiB, batch_rows: 64}\n"
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Reading::InOrder => "in order",
            Reading::GlobalSpans => "global/spans",
            Reading::GlobalRows => "global/rows",
        }
    }
}

/// Runs `sluice run` on `v` in a directory of its own (the file, its config, `out/` for the
/// sink), the file mapped into memory or read with `pread` (`memory_map`), as `reading` says;
/// returns that directory, the file's name and the process output.
fn run(
    root: &Path,
    v: &Variant,
    memory_map: bool,
    reading: Reading,
) -> (PathBuf, String, std::process::Output) {
    let dir = root.join(format!("{}-{reading:?}", v.name));
    std::fs::create_dir_all(dir.join("out")).unwrap();
    let file = format!("{}.parquet", v.name);
    std::fs::write(dir.join(&file), &v.bytes).unwrap();
    let source = match v.manifest {
        Some((size, row_count)) => {
            let manifest = format!(
                "{{\"files\": [{{\"path\": \"{file}\", \"size\": {size}, \"rows\": {row_count}}}]}}"
            );
            std::fs::write(dir.join("manifest.json"), manifest).unwrap();
            "manifest: manifest.json".to_string()
        }
        None => format!("path: {file}"),
    };
    std::fs::write(
        dir.join("p.yaml"),
        format!(
            "source:\n  type: parquet\n  {source}\n  batch_rows: 64\n  memory_map: {memory_map}\nstages:\n{}  - {{type: batch, size: 50}}\nruntime: {{threads: 2}}\nsink: {{type: parquet, path: out/x.parquet, row_group_size: 100}}\n",
            reading.stages()
        ),
    )
    .unwrap();
    let out = run_in_for(
        &dir,
        &["run", "p.yaml", "--no-report", "--progress", "never"],
        HANG,
    );
    (dir, file, out)
}

/// What became of `v`: how the table shows it, or what is wrong.
fn judge(
    root: &Path,
    v: &Variant,
    memory_map: bool,
    reading: Reading,
    reference: &[RecordBatch],
) -> Result<&'static str, String> {
    let (dir, file, out) = run(root, v, memory_map, reading);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let said = format!(
        "\n--- stderr ---\n{}",
        stderr.chars().take(3000).collect::<String>()
    );
    if std::fs::read(dir.join(&file)).unwrap() != v.bytes {
        return Err(format!("the input file was changed{said}"));
    }
    if stderr.contains("panicked") {
        return Err(format!("sluice panicked{said}"));
    }
    match out.status.code() {
        Some(1) => {
            let left = files_under(&dir.join("out"));
            if !left.is_empty() {
                return Err(format!("exit 1, but {left:?} left under out/{said}"));
            }
            if !stderr.lines().any(|l| l.starts_with("error: ")) {
                return Err(format!("exit 1 without an `error:` line{said}"));
            }
            if !stderr.contains(&file) {
                return Err(format!("the error does not name the file `{file}`{said}"));
            }
            if stderr.contains("internal error") {
                return Err(format!(
                    "reported as an internal error (a bug in Sluice), not as a damaged file{said}"
                ));
            }
            Ok("error")
        }
        Some(0) if v.must_fail => Err(format!("read without an error (exit 0){said}")),
        Some(0) => {
            let left = files_under(&dir.join("out"));
            if left != ["x.parquet"] {
                return Err(format!("exit 0, but out/ holds {left:?}{said}"));
            }
            let got = read_parquet(&dir.join("out/x.parquet"));
            Ok(if got == reference {
                "read, same rows"
            } else {
                "read, rows CHANGED"
            })
        }
        _ => Err(format!(
            "exit status {:?}: not a clean error (101: a panic, 134: an abort, no code: killed by a signal, or after the {} s hang timeout){said}",
            out.status,
            HANG.as_secs()
        )),
    }
}

#[test]
fn corrupt_parquet_is_a_clean_error_naming_the_file() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("original.parquet");
    write_original(&path);
    let original = std::fs::read(&path).unwrap();
    let layout = layout_of(&path, &original);

    // The harness first: the intact file goes through, every row.
    let intact = Variant {
        name: "intact".to_string(),
        what: "the file as written".to_string(),
        must_fail: false,
        bytes: original.clone(),
        manifest: None,
    };
    let references = Reading::ALL.map(|reading| {
        let (dir, _, out) = run(root.path(), &intact, true, reading);
        common::assert_ok(&out);
        assert_eq!(files_under(&dir.join("out")), ["x.parquet"]);
        let reference = read_parquet(&dir.join("out/x.parquet"));
        let mut ids = int64_values(&reference, "id");
        if reading != Reading::InOrder {
            assert_ne!(ids, (0..ROWS as i64).collect::<Vec<_>>(), "not shuffled");
            ids.sort_unstable();
        }
        assert_eq!(ids, (0..ROWS as i64).collect::<Vec<_>>(), "{reading:?}");
        reference
    });

    let all = variants(&original, &layout);
    let must_fail = all.iter().filter(|v| v.must_fail).count();
    assert!(
        must_fail >= 25 && all.len() - must_fail >= 15,
        "{must_fail} must-fail variants of {}",
        all.len()
    );
    let mut problems = Vec::new();
    let mut table = Vec::new();
    let mut caught = 0;
    // Every other copy is read with `pread`, the others mapped into memory, and every third
    // in order, through a global shuffle's spans or through its pages: each way of reading a
    // local file meets each kind of damage (the variants come in kinds of several).
    for (i, v) in all.iter().enumerate() {
        let class = if v.must_fail { "must fail" } else { "may read" };
        let memory_map = i % 2 == 0;
        let reading = Reading::ALL[i % 3];
        let how = format!(
            "{}, {}",
            if memory_map { "mapped" } else { "pread" },
            reading.name()
        );
        match judge(root.path(), v, memory_map, reading, &references[i % 3]) {
            Ok(outcome) => {
                if !v.must_fail && outcome == "error" {
                    caught += 1;
                }
                table.push(format!(
                    "  {:<36} {class:<9}  {how:<20}  {outcome:<17}  {}",
                    v.name, v.what
                ));
            }
            Err(problem) => problems.push(format!(
                "{} ({class}, {how}: {}): {problem}",
                v.name, v.what
            )),
        }
    }
    eprintln!(
        "{} damaged copies of a {}-byte Parquet file ({must_fail} must fail; {caught} of the {} others were caught):\n{}",
        all.len(),
        layout.len,
        all.len() - must_fail,
        table.join("\n")
    );
    assert!(
        problems.is_empty(),
        "{} of {} damaged Parquet files were not a clean error naming the file:\n\n{}",
        problems.len(),
        all.len(),
        problems.join("\n\n")
    );
}
