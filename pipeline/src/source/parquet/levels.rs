//! A page's levels checked run by run, without decoding them into a buffer one by one.
//!
//! Why by hand: parquet's own decoder of the RLE / bit-packed hybrid encoding is public only
//! under the crate's `experimental` feature, and it writes every level out as an `i16`. On the
//! tabular bench (2M lists of 128 float32) decoding, zero-filling and re-reading those levels
//! was ~6 % of the whole pipeline's CPU time. A page of full lists holds few runs — its
//! definition levels one run of the maximum, its repetition levels a `0` followed by a run of
//! `1`s per list — so each run is checked as a whole: a run of `c` equal levels costs one test,
//! and only bit-packed groups (8 levels each) are looked at level by level.
//!
//! The encoding (Parquet's `Encodings.md`): runs, each a ULEB128 header; an even header `h` is
//! `h / 2` repetitions of one value stored in `ceil(width / 8)` little-endian bytes, an odd
//! header `h` is `h / 2` groups of 8 values packed `width` bits each, least significant bit
//! first. The last group may be padded past the page's levels.

/// Calls `check(first, value, count)` for each run of the first `n` levels in `bytes`
/// (`width`-bit levels): once per repeated run (its count cut at `n`), once per stretch of
/// equal values in a bit-packed run. `false` as soon as `check` is, or when `bytes` hold fewer
/// than `n` levels or do not parse.
fn runs(
    bytes: &[u8],
    width: u8,
    n: usize,
    mut check: impl FnMut(usize, u32, usize) -> bool,
) -> bool {
    if width == 0 || width > 16 {
        // Levels of 0 bits (a maximum of 0) are not stored at all; levels beyond 16 bits do
        // not exist (levels are `i16`).
        return false;
    }
    let value_bytes = usize::from(width).div_ceil(8);
    let mask = (1u32 << width) - 1;
    let (mut at, mut i) = (0usize, 0usize);
    while i < n {
        let Some(header) = uleb128(bytes, &mut at) else {
            return false;
        };
        if header & 1 == 0 {
            let count = (header >> 1) as usize;
            let Some(stored) = bytes.get(at..at + value_bytes) else {
                return false;
            };
            at += value_bytes;
            let value = stored
                .iter()
                .rev()
                .fold(0u32, |v, &b| (v << 8) | u32::from(b));
            let count = count.min(n - i);
            if count == 0 || !check(i, value, count) {
                return false;
            }
            i += count;
        } else {
            let groups = (header >> 1) as usize;
            let count = (groups * 8).min(n - i);
            // Only the bytes of the levels used need be there.
            let used = (count * usize::from(width)).div_ceil(8);
            let Some(packed) = bytes.get(at..at + used) else {
                return false;
            };
            at += groups * usize::from(width);
            if count == 0 {
                return false;
            }
            // Equal neighbours are handed to `check` as one run (a list's `0` and its `1`s
            // in a group of 8 are two calls, not eight).
            let level = |k: usize| {
                if width == 1 {
                    // Repetition levels, the common case: one byte holds the level.
                    return u32::from(packed[k / 8] >> (k % 8)) & 1;
                }
                let bit = k * usize::from(width);
                // The (at most 3) bytes holding level `k`, as one little-endian word.
                let word = (0..3).fold(0u32, |w, b| {
                    w | packed
                        .get(bit / 8 + b)
                        .map_or(0, |&x| u32::from(x) << (8 * b))
                });
                (word >> (bit % 8)) & mask
            };
            let (mut first, mut value) = (0, level(0));
            for k in 1..=count {
                let next = if k < count { level(k) } else { u32::MAX };
                if next != value {
                    if !check(i + first, value, k - first) {
                        return false;
                    }
                    (first, value) = (k, next);
                }
            }
            i += count;
        }
    }
    true
}

/// An unsigned LEB128 number (a run's header) at `bytes[*at..]`, advancing `at`; `None` when
/// it is cut off or longer than 32 bits.
fn uleb128(bytes: &[u8], at: &mut usize) -> Option<u32> {
    let mut value = 0u32;
    for shift in (0..35).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        value |= u32::from(b & 0x7f).checked_shl(shift)?;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The bit width of levels whose maximum is `max`.
pub(super) fn width(max: i16) -> u8 {
    (16 - (max.max(0) as u16).leading_zeros()) as u8
}

/// Whether the first `n` levels in `bytes` all equal `max` (every value present).
pub(super) fn all_max(bytes: &[u8], max: i16, n: usize) -> bool {
    runs(bytes, width(max), n, |_, v, _| v == max as u32)
}

/// Whether the first `n` repetition levels in `bytes` (a maximum of 1) are `n / size` lists of
/// exactly `size` values: a 0 at every multiple of `size`, 1 everywhere else.
pub(super) fn lists_of(bytes: &[u8], size: usize, n: usize) -> bool {
    // The position in the current list, carried from run to run: `runs` calls `check` in
    // order, so a `%` per level (a 64-bit division, ~40 cycles here, on each of the 8 levels
    // of every bit-packed group — ~4 % of the tabular bench's CPU) is not needed.
    let mut at = 0usize;
    size > 0
        && n.is_multiple_of(size)
        && runs(bytes, 1, n, |_, v, c| {
            let ok = match v {
                // Every one of these levels starts a list: lists of one, or one level.
                0 => size == 1 || (c == 1 && at == 0),
                // None of these levels does: the run stays inside one list, after its first.
                1 => at != 0 && at + c <= size,
                _ => false,
            };
            at += c;
            if at >= size {
                // Once per list (a run of 0s for lists of one may cross several).
                at %= size;
            }
            ok
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `levels` in the hybrid encoding as parquet's writer encodes them (its RLE encoder,
    /// reached through a column writer of one page: the bytes after the page's 4-byte length).
    fn encoded(levels: &[i16], max: i16) -> Vec<u8> {
        use parquet::basic::Encoding;
        use parquet::column::page::{Page, PageWriteSpec, PageWriter};
        use parquet::column::writer::get_column_writer;
        use parquet::schema::parser::parse_message_type;
        use parquet::schema::types::SchemaDescriptor;
        use std::sync::{Arc, Mutex};

        #[derive(Default, Clone)]
        struct Pages(Arc<Mutex<Vec<Page>>>);
        impl PageWriter for Pages {
            fn write_page(
                &mut self,
                page: parquet::column::page::CompressedPage,
            ) -> parquet::errors::Result<PageWriteSpec> {
                self.0.lock().unwrap().push(page.compressed_page().clone());
                Ok(PageWriteSpec::new())
            }
            fn close(&mut self) -> parquet::errors::Result<()> {
                Ok(())
            }
        }
        // An optional int32 inside `max` nested optional groups: definition levels up to `max`.
        let mut schema = String::from("message m {");
        for g in 0..max - 1 {
            schema += &format!(" optional group g{g} {{");
        }
        schema += " optional int32 v;";
        schema += &" }".repeat(max as usize);
        let descr = SchemaDescriptor::new(Arc::new(parse_message_type(&schema).unwrap()));
        let pages = Pages::default();
        let props = Arc::new(
            parquet::file::properties::WriterProperties::builder()
                .set_dictionary_enabled(false)
                .set_writer_version(parquet::file::properties::WriterVersion::PARQUET_1_0)
                .build(),
        );
        let mut w = get_column_writer(descr.column(0), props, Box::new(pages.clone()));
        let present = levels.iter().filter(|&&l| l == max).count();
        let values = vec![7i32; present];
        match &mut w {
            parquet::column::writer::ColumnWriter::Int32ColumnWriter(w) => {
                w.write_batch(&values, Some(levels), None).unwrap();
            }
            _ => unreachable!(),
        }
        w.close().unwrap();
        let page = pages.0.lock().unwrap()[0].clone();
        let Page::DataPage {
            buf,
            def_level_encoding,
            ..
        } = page
        else {
            panic!("a v1 data page");
        };
        assert_eq!(def_level_encoding, Encoding::RLE);
        let len = u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize;
        buf[4..4 + len].to_vec()
    }

    #[test]
    fn widths_of_maxima() {
        assert_eq!(
            (width(0), width(1), width(2), width(3), width(4)),
            (0, 1, 2, 2, 3)
        );
        assert_eq!(width(255), 8);
        assert_eq!(width(256), 9);
    }

    /// Levels as parquet's writer encodes them, in repeated and bit-packed runs alike, checked
    /// against the same test made level by level.
    #[test]
    fn runs_check_what_a_level_by_level_walk_checks() {
        let size = 4;
        let lists = |n: usize| -> Vec<i16> { (0..n).map(|i| i16::from(i % size != 0)).collect() };
        let mut cases: Vec<(Vec<i16>, i16)> = vec![
            (vec![1; 1000], 1),
            (vec![3; 77], 3),
            (lists(400), 1),
            (lists(4), 1),
            (vec![0; 9], 1),
        ];
        let mut broken = lists(400);
        broken[13] = 0; // a list of 1 and one of 3
        cases.push((broken, 1));
        let mut broken = vec![2i16; 300];
        broken[299] = 1; // one value missing, last
        cases.push((broken, 2));
        let mut broken = vec![2i16; 300];
        broken[5] = 0;
        cases.push((broken, 2));
        // Runs of every length around a group of 8.
        let mut mixed: Vec<i16> = (0..200)
            .map(|i| if i % 9 < 5 { 3 } else { i % 3 })
            .collect();
        mixed.extend([3; 40]);
        cases.push((mixed, 3));
        for (levels, max) in cases {
            let bytes = encoded(&levels, max);
            let n = levels.len();
            let all = levels.iter().all(|&l| l == max);
            assert_eq!(all_max(&bytes, max, n), all, "{levels:?}");
            if max == 1 {
                let is_lists = n % size == 0
                    && levels
                        .iter()
                        .enumerate()
                        .all(|(i, &l)| l == i16::from(i % size != 0));
                assert_eq!(lists_of(&bytes, size, n), is_lists, "{levels:?}");
            }
            // Fewer levels than asked for: never a pass.
            assert!(!all_max(&bytes, max, n + 9));
        }
    }

    #[test]
    fn hand_written_runs_and_bad_bytes() {
        // 127 repeated 1s (header 254 = 0xfe 0x01), value byte 1.
        let ones = [0xfe, 0x01, 0x01];
        assert!(all_max(&ones, 1, 127));
        assert!(!all_max(&ones, 1, 128), "one level short");
        // Lists of 128: a packed group (0 then seven 1s: 0b1111_1110), then 120 repeated 1s.
        let list = [0x03, 0xfe, 0xf0, 0x01, 0x01];
        assert!(lists_of(&list, 128, 128));
        assert!(!lists_of(&list, 64, 128), "lists of 128 read as 64");
        assert!(!lists_of(&list, 128, 120), "not whole lists");
        // A header cut off, a header longer than 32 bits, a repeated run of 0 levels.
        assert!(!all_max(&[0x80], 1, 1));
        assert!(!all_max(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01], 1, 1));
        assert!(!all_max(&[0x00, 0x01], 1, 1));
        assert!(!all_max(&[], 1, 1));
        assert!(all_max(&[], 1, 0));
        // Levels of 9 bits: a repeated value in two bytes, a packed group across bytes.
        assert!(all_max(&[10, 0x00, 0x01], 256, 5));
        assert!(!all_max(&[10, 0x00, 0x01], 257, 5));
        let mut packed = [0u8; 10];
        packed[0] = 0x03;
        for k in 0..8 {
            let bit = 9 * k;
            let word = 257u32 << (bit % 8);
            for b in 0..3 {
                if let Some(x) = packed.get_mut(1 + bit / 8 + b) {
                    *x |= (word >> (8 * b)) as u8;
                }
            }
        }
        assert!(all_max(&packed, 257, 8));
        assert!(!all_max(&packed[..9], 257, 8), "the last level cut off");
        assert!(all_max(&packed[..9], 257, 7), "the last level not needed");
    }
}
