//! The `image` stage against libtorch's own kernels — what torchvision runs: `resize` (and
//! the resize of `random_resized_crop`) is `F.resize(antialias=True)`, i.e.
//! `torch._C._nn._upsample_bilinear2d_aa`; `RandomCrop`'s padding is `F.pad` (constant,
//! `replicate` for edge, `reflect`); a flip is `Tensor.flip`.
#![cfg(feature = "torch")]
#![allow(clippy::unwrap_used)]

use crate::common;

use arrow::array::{Array, AsArray, FixedSizeBinaryArray, RecordBatch};
use arrow::datatypes::Float32Type;
use futures::StreamExt;
use sluice::pipeline::Pipeline;
use tch::{Kind, Tensor};

const H: usize = 37;
const W: usize = 53;

/// Four RGB images of `H`×`W` with varied pixels, and the Parquet file holding them.
fn images(dir: &std::path::Path) -> Vec<Vec<u8>> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let imgs: Vec<Vec<u8>> = (0..4)
        .map(|_| {
            (0..H * W * 3)
                .map(|i| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    // Smooth gradients plus noise: both kinds of content a resize meets.
                    ((i % (W * 3)) as u64 * 2 + (state >> 58)) as u8
                })
                .collect()
        })
        .collect();
    let col = FixedSizeBinaryArray::try_from_iter(imgs.iter()).unwrap();
    let batch = RecordBatch::try_from_iter([("image", common::arc(col))]).unwrap();
    common::write_parquet(&dir.join("images.parquet"), &[batch], 4);
    imgs
}

/// The stage's output rows (CHW float32, pixel / 255) for `ops` and `seed`.
fn sluice_rows(dir: &std::path::Path, ops: &str, seed: u64) -> Vec<Vec<f32>> {
    let yaml = format!(
        "source: {{type: parquet, path: '{}/images.parquet'}}\n\
         stages:\n  - {{type: image, column: image, shape: [{H}, {W}, 3], seed: {seed}, ops: [{ops}]}}\n",
        dir.display()
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut stream = Pipeline::from_yaml(&yaml).unwrap().stream();
        let mut rows = Vec::new();
        while let Some(b) = stream.next().await {
            let b = b.unwrap();
            let list = b.data.column(0).as_fixed_size_list();
            for r in 0..list.len() {
                rows.push(
                    list.value(r)
                        .as_primitive::<Float32Type>()
                        .values()
                        .to_vec(),
                );
            }
        }
        rows
    })
}

/// One HWC image as a `[1, 3, H, W]` float tensor.
fn chw(img: &[u8]) -> Tensor {
    Tensor::from_slice(img)
        .reshape([1, H as i64, W as i64, 3])
        .permute([0, 3, 1, 2])
        .to_kind(Kind::Float)
}

/// A tensor's values in order, as the stage's rows hold them.
fn flat(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.contiguous().view([-1])).unwrap()
}

/// The largest difference between a stage row and the reference (of the same length).
fn worst(row: &[f32], want: &[f32]) -> f32 {
    assert_eq!(row.len(), want.len());
    row.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max)
}

/// libtorch's antialiased bilinear resize of one HWC image to `[oh, ow]`, as `[1, 3, oh, ow]`
/// / 255.
fn torch_resize(img: &[u8], [oh, ow]: [i64; 2], flip_h: bool) -> Tensor {
    let out = chw(img).internal_upsample_bilinear2d_aa([oh, ow], false, None, None) / 255.0;
    if flip_h { out.flip([3]) } else { out }
}

#[test]
fn resize_matches_libtorch_antialiased_bilinear() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = images(dir.path());
    // Shrinking both ways (~2.3×, the antialiasing filter), enlarging both ways (plain
    // bilinear), one of each, a non-integer ratio, and flipped.
    for (size, flip) in [
        ([16, 24], false),
        ([80, 100], false),
        ([20, 90], false),
        ([37, 20], false),
        ([29, 41], true),
    ] {
        let ops = format!(
            "{{resize: {{size: [{}, {}]}}}}{}",
            size[0],
            size[1],
            if flip {
                ", {horizontal_flip: {p: 1.0}}"
            } else {
                ""
            }
        );
        let got = sluice_rows(dir.path(), &ops, 0);
        assert_eq!(got.len(), imgs.len());
        for (r, (row, img)) in got.iter().zip(&imgs).enumerate() {
            let worst = worst(row, &flat(&torch_resize(img, size.map(|v| v as i64), flip)));
            // Sums of the same weighted taps in another order: float rounding only.
            assert!(
                worst < 2e-5,
                "resize to {size:?} (flip {flip}), row {r}: differs from libtorch by {worst}"
            );
        }
    }
}

/// `center_crop` as torchvision's `F.center_crop` (ported line by line onto libtorch): pad
/// with zeros to the crop size where the image is smaller (`(crop − size) // 2` before,
/// the rest after), then cut at `round((size − crop) / 2)`, rounding half to even as Python.
#[test]
fn center_crop_matches_torchvision() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = images(dir.path());
    // 37×53: (37 − 20) / 2 = 8.5 and (53 − 30) / 2 = 11.5 round to 8 and 12.
    for [ch, cw] in [[20i64, 30], [41, 60], [30, 60], [37, 53]] {
        let ops = format!("{{center_crop: {{size: [{ch}, {cw}]}}}}");
        let got = sluice_rows(dir.path(), &ops, 0);
        for (r, (row, img)) in got.iter().zip(&imgs).enumerate() {
            let (h, w) = (H as i64, W as i64);
            let mut t = chw(img) / 255.0;
            let (ph, pw) = ((ch - h).max(0), (cw - w).max(0));
            if ph > 0 || pw > 0 {
                t = t.constant_pad_nd([pw / 2, (pw + 1) / 2, ph / 2, (ph + 1) / 2]);
            }
            let (ih, iw) = (h + ph, w + pw);
            let top = ((ih - ch) as f64 / 2.0).round_ties_even() as i64;
            let left = ((iw - cw) as f64 / 2.0).round_ties_even() as i64;
            let worst = worst(row, &flat(&t.narrow(2, top, ch).narrow(3, left, cw)));
            assert!(
                worst < 1e-6,
                "crop [{ch}, {cw}], row {r}: differs by {worst}"
            );
        }
    }
}

/// `normalize` after a resize: torchvision's `Normalize` of the resized image,
/// `(x / 255 − mean) / std` per channel.
#[test]
fn normalize_matches_torchvision_formula() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = images(dir.path());
    let (mean, std) = ([0.4914f32, 0.4822, 0.4465], [0.2470f32, 0.2435, 0.2616]);
    let ops =
        format!("{{resize: {{size: [20, 30]}}}}, {{normalize: {{mean: {mean:?}, std: {std:?}}}}}");
    let got = sluice_rows(dir.path(), &ops, 0);
    for (r, (row, img)) in got.iter().zip(&imgs).enumerate() {
        let m = Tensor::from_slice(&mean).view([1, 3, 1, 1]);
        let s = Tensor::from_slice(&std).view([1, 3, 1, 1]);
        let worst = worst(row, &flat(&((torch_resize(img, [20, 30], false) - m) / s)));
        assert!(
            worst < 1e-4,
            "row {r}: differs from torchvision's by {worst}"
        );
    }
}

/// `t` padded by libtorch as torchvision's `F.pad` with `mode`: `[left, right, top, bottom]`;
/// `constant` holds `fill`.
fn torch_pad(t: &Tensor, mode: &str, pad: [i64; 4], fill: f64) -> Tensor {
    match mode {
        "constant" => (t - fill).constant_pad_nd(pad) + fill,
        "edge" => t.replication_pad2d(pad),
        _ => t.reflection_pad2d(pad),
    }
}

/// The offset (top, left) of the `[oh, ow]` window of `padded` (at most `max` from the
/// top-left on each axis), flipped or not, that `row` is. Sluice scales by 1/255 and the
/// reference divides, so the last bit may differ.
fn window_of(
    row: &[f32],
    padded: &Tensor,
    [oh, ow]: [i64; 2],
    max: [i64; 2],
) -> Option<(i64, i64)> {
    (0..=max[0])
        .flat_map(|top| (0..=max[1]).map(move |left| (top, left)))
        .find(|&(top, left)| {
            let win = padded.narrow(2, top, oh).narrow(3, left, ow);
            worst(row, &flat(&win)) < 1e-6 || worst(row, &flat(&win.flip([3]))) < 1e-6
        })
}

/// Every output of `random_crop` with padding is one window (at some offset, flipped or not)
/// of the image padded by libtorch's `constant_pad_nd`, `replication_pad2d` (torchvision's
/// `edge`) or `reflection_pad2d` (`reflect`); over the rows, windows that reach into the
/// padding occur.
#[test]
fn random_crop_padding_matches_libtorch_pad() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = images(dir.path());
    let p = 4i64;
    for mode in ["constant", "edge", "reflect"] {
        let ops = format!(
            "{{random_crop: {{size: [{H}, {W}], padding: {p}, padding_mode: {mode}}}}}, \
             {{horizontal_flip: {{p: 0.5}}}}"
        );
        // Several epochs' worth of draws: the same images, other windows.
        let mut reached_padding = 0;
        for seed in 0..6 {
            let got = sluice_rows(dir.path(), &ops, seed);
            for (r, (row, img)) in got.iter().zip(&imgs).enumerate() {
                let padded = torch_pad(&chw(img), mode, [p; 4], 0.0) / 255.0;
                let hit = window_of(row, &padded, [H as i64, W as i64], [2 * p, 2 * p]);
                let (top, left) = hit.unwrap_or_else(|| {
                    panic!("{mode}, seed {seed}, row {r}: no window of libtorch's padded image")
                });
                reached_padding += usize::from(top != p || left != p);
            }
        }
        assert!(
            reached_padding > 12,
            "{mode}: {reached_padding} of 24 windows in the padding"
        );
    }
}

/// `pad_if_needed`: torchvision pads by `padding`, then pads that image again by each axis'
/// shortfall (`F.pad` twice); every output is a window of libtorch's pad kernels applied
/// twice, for `constant` (with a `fill`), `edge` and `reflect`.
#[test]
fn random_crop_pad_if_needed_matches_libtorch_padding_twice() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = images(dir.path());
    let p = 2i64;
    // 37×53 padded by 2 is 41×57: 4 rows and 3 columns short of 45×60 on each side.
    let (oh, ow) = (45i64, 60i64);
    let (qy, qx) = (oh - (H as i64 + 2 * p), ow - (W as i64 + 2 * p));
    let fill = 77.0;
    for mode in ["constant", "edge", "reflect"] {
        let ops = format!(
            "{{random_crop: {{size: [{oh}, {ow}], padding: {p}, padding_mode: {mode}, \
             pad_if_needed: true{}}}}}, {{horizontal_flip: {{p: 0.5}}}}",
            if mode == "constant" { ", fill: 77" } else { "" }
        );
        let mut offsets = std::collections::BTreeSet::new();
        for seed in 0..6 {
            let got = sluice_rows(dir.path(), &ops, seed);
            for (r, (row, img)) in got.iter().zip(&imgs).enumerate() {
                let once = torch_pad(&chw(img), mode, [p; 4], fill);
                let twice = torch_pad(&once, mode, [qx, qx, qy, qy], fill) / 255.0;
                // The twice-padded image is `q` larger than the window on each axis.
                let hit = window_of(row, &twice, [oh, ow], [qy, qx]);
                let (top, left) = hit.unwrap_or_else(|| {
                    panic!(
                        "{mode}, seed {seed}, row {r}: no window of libtorch's twice-padded image"
                    )
                });
                offsets.insert((top, left));
            }
        }
        assert!(offsets.len() > 8, "{mode}: windows at {offsets:?}");
    }
}
