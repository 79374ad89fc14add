//! The list decoder against arrow-rs's reader of the same rows: the same batches, whatever
//! the lists' type, the pages, the rows skipped and the other columns; nulls and lists of
//! another size read by arrow-rs from where they start.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, FixedSizeListArray, Float32Array, Float64Array, Int16Array, Int32Array,
    Int64Array, RecordBatch, StringArray, StructArray, UInt8Array,
};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::properties::WriterProperties;

use super::super::list_column::levels_are_lists;
use super::{Rows, UnitDecoder};
use crate::source::reader::{Chunks, FetchedChunks, LocalChunks, ObjectReader};

fn list(values: ArrayRef, size: i32, nulls: Option<NullBuffer>) -> ArrayRef {
    let item = Arc::new(Field::new("item", values.data_type().clone(), false));
    Arc::new(FixedSizeListArray::new(item, size, values, nulls))
}

/// `n` rows: `x` lists of 4 float32, `d` lists of 2 float64, `i` lists of 3 int32, `l` lists
/// of 1 int64, `u` lists of 5 uint8, `h` lists of 2 int16, a string and a struct column;
/// `null_at` rows with a null `x`.
fn batch(first: usize, n: usize, null_at: &[usize]) -> RecordBatch {
    let f32s = Float32Array::from_iter_values((0..n * 4).map(|v| (first * 4 + v) as f32 * 0.5));
    let f64s = Float64Array::from_iter_values((0..n * 2).map(|v| (first * 2 + v) as f64 / 3.0));
    let i32s = Int32Array::from_iter_values((0..n * 3).map(|v| (first * 3 + v) as i32 - 7));
    let i64s = Int64Array::from_iter_values((0..n).map(|v| (first + v) as i64 * 1_000_003));
    let u8s = UInt8Array::from_iter_values((0..n * 5).map(|v| ((first * 5 + v) * 37 % 256) as u8));
    let i16s = Int16Array::from_iter_values((0..n * 2).map(|v| (first * 2 + v) as i16 - 900));
    let nulls = (!null_at.is_empty())
        .then(|| NullBuffer::from_iter((first..first + n).map(|r| !null_at.contains(&r))));
    let names = StringArray::from_iter_values((first..first + n).map(|r| format!("row {r}")));
    let inner = StructArray::from(vec![
        (
            Arc::new(Field::new("k", DataType::Int64, false)),
            Arc::new(Int64Array::from_iter_values(
                (first..first + n).map(|r| r as i64),
            )) as ArrayRef,
        ),
        (
            Arc::new(Field::new("k2", DataType::Int32, false)),
            Arc::new(Int32Array::from_iter_values(
                (first..first + n).map(|r| r as i32 * 3),
            )) as ArrayRef,
        ),
    ]);
    RecordBatch::try_from_iter([
        ("x", list(Arc::new(f32s), 4, nulls)),
        ("name", Arc::new(names) as ArrayRef),
        ("d", list(Arc::new(f64s), 2, None)),
        ("s", Arc::new(inner) as ArrayRef),
        ("i", list(Arc::new(i32s), 3, None)),
        ("l", list(Arc::new(i64s), 1, None)),
        ("u", list(Arc::new(u8s), 5, None)),
        ("h", list(Arc::new(i16s), 2, None)),
    ])
    .unwrap()
}

/// A file of 1,000 rows in one row group, small pages, dictionary pages for the first
/// values; its reader metadata and local chunks.
fn file(dir: &std::path::Path, null_at: &[usize]) -> (ArrowReaderMetadata, Chunks) {
    let (metadata, reader, size) = written(dir, null_at);
    (metadata, local(&reader, size))
}

/// Writes the file; its reader metadata, object reader and size.
fn written(dir: &std::path::Path, null_at: &[usize]) -> (ArrowReaderMetadata, ObjectReader, u64) {
    let path = dir.join("lists.parquet");
    let props = WriterProperties::builder()
        .set_data_page_size_limit(1024)
        .set_write_batch_size(64)
        .set_dictionary_page_size_limit(512)
        .build();
    write(dir, &path, &batch(0, 1000, null_at), props)
}

/// Writes `rb` to `path` (in `dir`) with `props`; the file's reader metadata, object reader
/// and size.
fn write(
    dir: &std::path::Path,
    path: &std::path::Path,
    rb: &RecordBatch,
    props: WriterProperties,
) -> (ArrowReaderMetadata, ObjectReader, u64) {
    let mut writer = ArrowWriter::try_new(
        std::fs::File::create(path).unwrap(),
        rb.schema(),
        Some(props),
    )
    .unwrap();
    writer.write(rb).unwrap();
    writer.close().unwrap();
    let metadata = ArrowReaderMetadata::load(
        &std::fs::File::open(path).unwrap(),
        ArrowReaderOptions::new(),
    )
    .unwrap();
    let location = crate::storage::resolve_output(path.to_str().unwrap(), dir).unwrap();
    let size = std::fs::metadata(path).unwrap().len();
    (metadata, ObjectReader::new(&location, size), size)
}

/// The whole file `reader` reads (`size` bytes) as local chunks.
fn local(reader: &ObjectReader, size: u64) -> Chunks {
    let chunks = LocalChunks::open(reader, std::slice::from_ref(&(0..size)), true);
    Chunks::Local(chunks.unwrap().unwrap())
}

/// The batches of `rows` through `decoder` and through arrow-rs's reader alone; whether the
/// list decoder was used and had fallen back at the end.
fn both(rows: Rows) -> (Vec<RecordBatch>, Vec<RecordBatch>, bool, bool) {
    let arrow: Vec<RecordBatch> = (rows.arrow(0, rows.mask.clone()).unwrap())
        .collect::<Result<_, _>>()
        .unwrap();
    let mut decoder = rows.decoder().unwrap();
    let ours: Vec<RecordBatch> = (&mut decoder).collect::<Result<_, _>>().unwrap();
    let (lists, fell_back) = match &decoder {
        UnitDecoder::Lists(d) => (true, d.slow.is_some()),
        UnitDecoder::Arrow(_) => (false, false),
    };
    (ours, arrow, lists, fell_back)
}

fn assert_same(ours: &[RecordBatch], arrow: &[RecordBatch]) {
    assert_eq!(ours.len(), arrow.len());
    for (a, b) in ours.iter().zip(arrow) {
        assert_eq!(a.num_columns(), b.num_columns());
        assert_eq!(a.schema().fields(), b.schema().fields());
        for (x, y) in a.columns().iter().zip(b.columns()) {
            assert_eq!(x.as_ref(), y.as_ref());
        }
    }
}

fn rows(metadata: ArrowReaderMetadata, chunks: Chunks, mask: Option<&[usize]>) -> Rows {
    let descr = metadata.metadata().file_metadata().schema_descr_ptr();
    let mask = match mask {
        Some(roots) => parquet::arrow::ProjectionMask::roots(&descr, roots.iter().copied()),
        None => parquet::arrow::ProjectionMask::all(),
    };
    Rows {
        chunks,
        metadata,
        mask,
        rg: 0,
        skip: 0,
        take: 1000,
        batch_rows: 128,
        huge_lists: true,
    }
}

#[test]
fn lists_decode_as_arrow_rs_decodes_them() {
    let dir = tempfile::tempdir().unwrap();
    let (metadata, chunks) = file(dir.path(), &[]);
    // Every column; lists only; one list alone; lists after skipping rows, taking fewer,
    // batches that do not divide the rows.
    let cases: [(Option<&[usize]>, usize, usize, usize); 5] = [
        (None, 0, 1000, 128),
        (Some(&[0, 2, 4, 5, 6, 7]), 0, 1000, 100),
        (Some(&[0]), 0, 1000, 1000),
        (None, 333, 500, 77),
        (Some(&[2, 4]), 999, 1, 8),
    ];
    for (mask, skip, take, batch_rows) in cases {
        let mut r = rows(metadata.clone(), chunks.clone(), mask);
        (r.skip, r.take, r.batch_rows) = (skip, take, batch_rows);
        let (ours, arrow, lists, fell_back) = both(r);
        assert!(lists && !fell_back, "{mask:?} {skip} {take}");
        assert_eq!(ours.iter().map(|b| b.num_rows()).sum::<usize>(), take);
        assert_same(&ours, &arrow);
    }
    // No list in the projection: arrow-rs's reader.
    let (ours, arrow, lists, _) = both(rows(metadata.clone(), chunks.clone(), Some(&[1, 3])));
    assert!(!lists);
    assert_same(&ours, &arrow);
    // A struct read in part (`s.k2` without `s.k`) next to a list: arrow-rs's reader alone.
    let descr = metadata.metadata().file_metadata().schema_descr_ptr();
    let leaf = |path: &str| {
        (0..descr.num_columns())
            .find(|&l| descr.column(l).path().string() == path)
            .unwrap()
    };
    let mut r = rows(metadata, chunks, None);
    r.mask = parquet::arrow::ProjectionMask::leaves(&descr, [leaf("x.list.item"), leaf("s.k2")]);
    let (ours, arrow, lists, _) = both(r);
    assert!(!lists);
    assert_eq!(ours[0].num_columns(), 2);
    assert_same(&ours, &arrow);
}

#[test]
fn a_null_list_is_read_by_arrow_rs_from_its_batch_on() {
    let dir = tempfile::tempdir().unwrap();
    let (metadata, chunks) = file(dir.path(), &[700, 701, 950]);
    let (ours, arrow, lists, fell_back) = both(rows(metadata, chunks, None));
    assert!(lists && fell_back);
    assert_same(&ours, &arrow);
    let nulls: usize = ours.iter().map(|b| b.column(0).null_count()).sum();
    assert_eq!(nulls, 3);
}

/// Column chunks fetched whole (as from an object store) decode as the local file does;
/// bytes outside them are an error naming the range.
#[tokio::test]
async fn fetched_chunks_decode_as_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (metadata, reader, _) = written(dir.path(), &[]);
    let columns = metadata.metadata().row_group(0).columns();
    let ranges: Vec<_> = (columns.iter())
        .map(|c| c.byte_range())
        .map(|(start, len)| start..start + len)
        .collect();
    let fetched = FetchedChunks::fetch(&reader, ranges.clone()).await.unwrap();
    let mut r = rows(metadata, Chunks::Fetched(fetched.clone()), Some(&[0, 1, 5]));
    (r.skip, r.take) = (10, 900);
    let (ours, arrow, lists, fell_back) = both(r);
    assert!(lists && !fell_back);
    assert_same(&ours, &arrow);

    use parquet::file::reader::ChunkReader;
    let chunks = Chunks::Fetched(fetched);
    let first = ranges[0].clone();
    assert!(
        chunks
            .get_bytes(first.start, (first.end - first.start) as usize)
            .is_ok()
    );
    // The end of the last chunk: nothing to read there, but an empty read is fine.
    let end = ranges.iter().map(|r| r.end).max().unwrap();
    assert!(chunks.get_bytes(end, 0).unwrap().is_empty());
    assert!(chunks.get_read(end).is_err(), "no byte to read there");
    let e = chunks.get_bytes(0, 4).unwrap_err().to_string();
    assert!(
        e.contains("bytes 0..4 are outside the column chunks"),
        "{e}"
    );
}

#[test]
fn levels_are_lists_of_their_size_only() {
    let lists = |n: usize, size: usize| -> (Vec<i16>, Vec<i16>) {
        let rep = (0..n * size).map(|i| i16::from(i % size != 0)).collect();
        (vec![2; n * size], rep)
    };
    let (def, rep) = lists(5, 4);
    assert!(levels_are_lists(&def, &rep, 2, 4));
    assert!(!levels_are_lists(&def, &rep, 2, 2), "lists of 4 read as 2");
    assert!(
        !levels_are_lists(&def, &rep, 2, 5),
        "20 values are not lists of 5"
    );
    assert!(
        !levels_are_lists(&def, &rep, 3, 4),
        "values below the maximum level"
    );
    let mut null = def.clone();
    null[6] = 1;
    assert!(!levels_are_lists(&null, &rep, 2, 4), "a null value");
    let mut longer = rep.clone();
    longer[8] = 1;
    assert!(!levels_are_lists(&def, &longer, 2, 4), "a list of 8");
    let (def, rep) = lists(3, 1);
    assert!(levels_are_lists(&def, &rep, 2, 1));
}

/// How the test's images are written.
#[derive(Clone, Copy, Default)]
struct Images<'a> {
    /// Rows whose image is null.
    null_at: &'a [usize],
    /// Every value one of three (a dictionary throughout).
    repeat: bool,
    /// DELTA_BYTE_ARRAY, no dictionary: parquet decodes each value into a buffer of its own.
    delta: bool,
}

/// Writes `n` rows of a fixed-size binary `image` (48 bytes) and an int64 `label`, pages of 40
/// rows, a dictionary tried for the first 20 values; its reader metadata, object reader and
/// size.
fn images(
    dir: &std::path::Path,
    n: usize,
    how: Images<'_>,
) -> (ArrowReaderMetadata, ObjectReader, u64) {
    use arrow::array::FixedSizeBinaryArray;
    use parquet::basic::Encoding;
    use parquet::schema::types::ColumnPath;
    let path = dir.join("images.parquet");
    let values = (0..n).map(|r| {
        let v = if how.repeat { r % 3 } else { r };
        (!how.null_at.contains(&r)).then(|| (0..48).map(|k| (v * 7 + k) as u8).collect::<Vec<u8>>())
    });
    let image = FixedSizeBinaryArray::try_from_sparse_iter_with_size(values, 48).unwrap();
    let label = Int64Array::from_iter_values((0..n).map(|r| r as i64));
    let rb = RecordBatch::try_from_iter([
        ("image", Arc::new(image) as ArrayRef),
        ("label", Arc::new(label) as ArrayRef),
    ])
    .unwrap();
    let mut props = WriterProperties::builder()
        .set_data_page_size_limit(1920)
        .set_write_batch_size(10)
        .set_dictionary_page_size_limit(960);
    if how.delta {
        let image = ColumnPath::from("image");
        props = props
            .set_column_dictionary_enabled(image.clone(), false)
            .set_column_encoding(image, Encoding::DELTA_BYTE_ARRAY);
    }
    write(dir, &path, &rb, props.build())
}

/// [`images`] read from the local file.
fn local_images(dir: &std::path::Path, n: usize, how: Images<'_>) -> (ArrowReaderMetadata, Chunks) {
    let (metadata, reader, size) = images(dir, n, how);
    (metadata, local(&reader, size))
}

/// The rows of `batches` as one batch.
fn all_rows(batches: &[RecordBatch]) -> RecordBatch {
    arrow::compute::concat_batches(&batches[0].schema(), batches).unwrap()
}

#[test]
fn fixed_size_binary_is_handed_over_as_decoded_without_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let (metadata, chunks) = local_images(dir.path(), 500, Images::default());
    // Both columns; the images alone; after skipping rows, taking fewer, odd batch sizes.
    let cases: [(Option<&[usize]>, usize, usize, usize); 4] = [
        (None, 0, 500, 64),
        (Some(&[0]), 0, 500, 500),
        (None, 123, 300, 37),
        (Some(&[0]), 499, 1, 8),
    ];
    for (mask, skip, take, batch_rows) in cases {
        let mut r = rows(metadata.clone(), chunks.clone(), mask);
        (r.skip, r.take, r.batch_rows) = (skip, take, batch_rows);
        let (ours, arrow, here, fell_back) = both(r);
        assert!(here && !fell_back, "{mask:?} {skip} {take}");
        assert!(
            ours.iter()
                .all(|b| b.num_rows() <= batch_rows && b.num_rows() > 0)
        );
        let (a, b) = (all_rows(&ours), all_rows(&arrow));
        assert_eq!(a.schema(), b.schema());
        assert_eq!(a, b, "{mask:?} {skip} {take} {batch_rows}");
        if take > 100 {
            // Pages of 40 rows: batches are cut where a page ends (each batch a slice of the
            // page it was decoded from), so there are more of them than arrow-rs's.
            assert!(
                ours.len() > arrow.len(),
                "{} vs {}",
                ours.len(),
                arrow.len()
            );
        }
    }
}

/// Values that are not in long runs within pages are copied, in batches as arrow-rs's: a
/// dictionary of repeated values, DELTA_BYTE_ARRAY (each value decoded into a buffer of its
/// own, which could lie next to another's), pages fetched whole from an object store (a slice
/// of an uncompressed page would keep the whole fetched chunk alive).
#[tokio::test]
async fn fixed_size_binary_not_in_pages_runs_is_copied_into_whole_batches() {
    let dir = tempfile::tempdir().unwrap();
    for how in [
        Images {
            repeat: true,
            ..Images::default()
        },
        Images {
            delta: true,
            ..Images::default()
        },
    ] {
        let (metadata, chunks) = local_images(dir.path(), 300, how);
        let (ours, arrow, here, fell_back) = both(rows(metadata, chunks, None));
        assert!(here && !fell_back);
        assert_same(&ours, &arrow);
    }
    let (metadata, reader, _) = images(dir.path(), 300, Images::default());
    let columns = metadata.metadata().row_group(0).columns();
    let ranges: Vec<_> = (columns.iter())
        .map(|c| c.byte_range())
        .map(|(start, len)| start..start + len)
        .collect();
    let fetched = FetchedChunks::fetch(&reader, ranges).await.unwrap();
    let mut r = rows(metadata, Chunks::Fetched(fetched), None);
    (r.skip, r.take) = (10, 250);
    let (ours, arrow, here, fell_back) = both(r);
    assert!(here && !fell_back);
    assert_same(&ours, &arrow);
}

#[test]
fn a_null_image_is_read_by_arrow_rs_from_its_batch_on() {
    let dir = tempfile::tempdir().unwrap();
    let how = Images {
        null_at: &[250, 251, 390],
        ..Images::default()
    };
    let (metadata, chunks) = local_images(dir.path(), 400, how);
    let (ours, arrow, here, fell_back) = both(rows(metadata, chunks, None));
    assert!(here && fell_back);
    assert_eq!(all_rows(&ours), all_rows(&arrow));
    let nulls: usize = ours.iter().map(|b| b.column(0).null_count()).sum();
    assert_eq!(nulls, 3);
}

/// The pages each list column read whole and decoded with parquet's reader.
fn pages_read(decoder: &UnitDecoder) -> Vec<(usize, usize)> {
    let UnitDecoder::Lists(d) = decoder else {
        return Vec::new();
    };
    (d.lists.iter())
        .filter_map(|c| match c {
            super::Column::List(l) => Some((l.whole_pages, l.decoded_pages)),
            super::Column::Binary(_) => None,
        })
        .collect()
}

/// Pages stored `PLAIN` (v1 and v2 pages) are read whole, dictionary-encoded ones by
/// parquet's reader, and the lists are arrow-rs's either way.
#[test]
fn plain_pages_are_read_whole_and_dictionary_pages_decoded() {
    use parquet::file::properties::WriterVersion;
    let dir = tempfile::tempdir().unwrap();
    let (metadata, chunks) = file(dir.path(), &[]);
    let mut decoder = rows(metadata, chunks, Some(&[0, 2])).decoder().unwrap();
    (&mut decoder).for_each(|b| drop(b.unwrap()));
    let read = pages_read(&decoder);
    assert_eq!(read.len(), 2);
    assert!(
        read.iter()
            .all(|&(whole, decoded)| whole > 0 && decoded > 0),
        "{read:?}"
    );
    for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
        let props = WriterProperties::builder()
            .set_writer_version(version)
            .set_dictionary_enabled(false)
            .set_data_page_size_limit(1024)
            .set_write_batch_size(64)
            .build();
        let path = dir.path().join("plain.parquet");
        let (metadata, reader, size) = write(dir.path(), &path, &batch(0, 1000, &[]), props);
        for (skip, take, batch_rows) in [(0, 1000, 128), (333, 500, 77)] {
            let mut r = rows(metadata.clone(), local(&reader, size), None);
            (r.skip, r.take, r.batch_rows) = (skip, take, batch_rows);
            let (ours, arrow, lists, fell_back) = both(r.clone());
            assert!(lists && !fell_back);
            assert_same(&ours, &arrow);
            let mut decoder = r.decoder().unwrap();
            (&mut decoder).for_each(|b| drop(b.unwrap()));
            let read = pages_read(&decoder);
            assert_eq!(read.len(), 6, "{version:?}");
            // Version 2 stores integers DELTA_BINARY_PACKED: parquet's reader decodes them.
            let plain = if version == WriterVersion::PARQUET_1_0 {
                6
            } else {
                2
            };
            assert!(
                read[..plain].iter().all(|&(w, d)| w > 1 && d == 0),
                "{version:?} {read:?}"
            );
            assert!(
                read[plain..].iter().all(|&(w, d)| w == 0 && d > 0),
                "{version:?} {read:?}"
            );
        }
    }
}
