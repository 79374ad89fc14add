//! Tests of the `image` stage's input: decoding PNG and JPEG, bad rows (an error naming
//! their lineage, or skipped), and the `dead_letter` setting for the skipped rows.

use super::*;
#[cfg(feature = "image")]
use arrow::array::BinaryArray;
#[cfg(feature = "image")]
use arrow::datatypes::Schema;

#[test]
#[cfg(feature = "image")] // encodes its PNGs and JPEGs with the `image` crate
fn png_and_jpeg_decode() {
    use image::ImageEncoder;
    let (h, w) = (6usize, 5usize);
    let raw: Vec<u8> = (0..h * w * 3).map(|i| (i * 7 % 256) as u8).collect();
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&raw, w as u32, h as u32, image::ExtendedColorType::Rgb8)
        .unwrap();
    let flat = vec![128u8; h * w * 3];
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 95)
        .write_image(&flat, w as u32, h as u32, image::ExtendedColorType::Rgb8)
        .unwrap();
    let arr = BinaryArray::from_iter_values([png.as_slice(), jpeg.as_slice()]);
    let data = RecordBatch::try_from_iter([("img", Arc::new(arr) as ArrayRef)]).unwrap();
    let origin = Origin::Object {
        url: Name::from("file:///x"),
        row_group: 0,
    };
    let input = Batch::new(data, Lineage::new(origin, 0, 2, 0));
    let st = build_stage(
        [h, w, 3],
        &input,
        vec![identity(3)],
        OnError::Fail,
        ImageFormat::Auto,
    );
    let out = st.apply(input).unwrap();
    let v = row(&out, 0);
    for c in 0..3 {
        for i in 0..h * w {
            assert_eq!(v[c * h * w + i], raw[i * 3 + c] as f32);
        }
    }
    assert!(row(&out, 1).iter().all(|x| (x - 128.0).abs() <= 2.0));
}

#[test]
#[cfg(feature = "image")] // decodes PNG/JPEG bytes
fn bad_images_fail_with_lineage_or_are_skipped() {
    let arr = BinaryArray::from_opt_vec(vec![
        Some(&[1u8; 12][..]),
        Some(&[1u8; 11][..]),
        Some(b"\x89PNG\r\n\x1a\n garbage".as_slice()),
        None,
        Some(&[2u8; 12][..]),
    ]);
    let data = RecordBatch::try_from_iter([("img", Arc::new(arr) as ArrayRef)]).unwrap();
    let origin = Origin::Object {
        url: Name::from("file:///bad.parquet"),
        row_group: 3,
    };
    let input = Batch::new(data, Lineage::new(origin, 100, 5, 0));
    let fail = build_stage([2, 2, 3], &input, vec![], OnError::Fail, ImageFormat::Raw);
    let e = fail.apply(input.clone()).unwrap_err().to_string();
    assert!(e.contains("11 bytes, but shape [2, 2, 3] needs 12"), "{e}");
    assert!(
        e.contains("file:///bad.parquet row group 3, row 101"),
        "{e}"
    );
    assert!(e.contains("and 2 more"), "{e}");
    let auto = build_stage([2, 2, 3], &input, vec![], OnError::Fail, ImageFormat::Png);
    let e = auto.apply(input.slice(2, 1)).unwrap_err().to_string();
    assert!(e.contains("cannot decode the Png image"), "{e}");
    assert!(e.contains("row 102"), "{e}");
    let skip = build_stage([2, 2, 3], &input, vec![], OnError::Skip, ImageFormat::Raw);
    let out = skip.apply(input).unwrap();
    assert_eq!(out.num_rows(), 2);
    assert_eq!(out.lineage.spans()[0].first, 100);
    assert_eq!(out.lineage.spans()[1].first, 104);
    let _ = Schema::empty();
}

/// `dead_letter` holds what `on_error: skip` removes, in files.
#[test]
fn dead_letter_needs_skip_and_a_file() {
    let input = batch([2, 2, 3], 1, |_, _, _, _| 0);
    let with = |on_error, dl| {
        let mut c = config([2, 2, 3], vec![], on_error, ImageFormat::Raw);
        c.dead_letter = Some(dl);
        build(
            &stage_ref(),
            &c,
            &input.data.schema(),
            &crate::stage::BuildContext::default(),
        )
        .map(|_| ())
        .unwrap_err()
        .to_string()
    };
    let file = crate::config::DeadLetterConfig::File(crate::config::DeadLetterFile {
        path: "bad/".into(),
        storage: Default::default(),
    });
    let e = with(OnError::Fail, file);
    assert!(
        e.contains(
            "`dead_letter` takes the rows `on_error: skip` removes: set `on_error: skip` too"
        ),
        "{e}"
    );
    let kafka = crate::config::DeadLetterConfig::Kafka(crate::config::DeadLetterKafka {
        topic: "bad".into(),
        brokers: None,
        properties: Default::default(),
    });
    let e = with(OnError::Skip, kafka);
    assert!(e.contains("writes its dead letters to files"), "{e}");
}
