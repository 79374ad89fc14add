//! The innermost loop of the `image` stage's common case (integer crop, flips, normalize):
//! one row of interleaved RGB `u8` pixels to three planes of normalized `f32`
//! (`v * scale + bias` per channel), straight or mirrored.
//!
//! A portable version, and on x86-64 an AVX2 one chosen at run time. Both compute every value
//! as one `u8 → f32` conversion, one multiply and one add (never a fused multiply-add), so
//! their output is bit-identical and a run's batches do not depend on the CPU they ran on.

/// Asks the CPU to start loading `bytes` into its caches (a hint: no effect on results).
/// The image stage calls it for the next image while it converts the current one, so the
/// source pixels — rows scattered over a shuffle window, usually not cached — arrive in
/// time instead of stalling the conversion.
#[inline]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        #[allow(unsafe_code)]
        // SAFETY: a prefetch never faults and does not change memory; the address is valid.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast())
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Pixels per pass of the portable conversion (a stack buffer of 3 × this many).
const CHUNK: usize = 64;

/// `px` holds `n` RGB pixels (`3 n` bytes) and each `dK` `n` values. Straight:
/// `dK[i] = px[3 i + K] * scale[K] + bias[K]`; mirrored: the same into `dK[n - 1 - i]`.
/// (The row kernels on their own, dispatched like [`rgb_crop`]: what the tests compare.)
#[cfg(test)]
fn rgb_row(px: &[u8], mirror: bool, scale: [f32; 3], bias: [f32; 3], d: [&mut [f32]; 3]) {
    let n = d[0].len();
    assert!(
        px.len() == 3 * n && d[1].len() == n && d[2].len() == n,
        "rgb_row: {} bytes for {n} pixels",
        px.len()
    );
    #[cfg(target_arch = "x86_64")]
    if n >= 16 && std::arch::is_x86_feature_detected!("avx2") {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2 (checked just above); the lengths were checked.
        unsafe {
            avx2::rgb_row(px, mirror, scale, bias, d)
        };
        return;
    }
    portable(px, mirror, scale, bias, d);
}

/// An integer crop window of an image (top-left in source pixels; negative or past the edge
/// reads the zero padding), mirrored horizontally and/or vertically.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub top: i64,
    pub left: i64,
    pub flip_h: bool,
    pub flip_v: bool,
}

/// The columns of every output row of a [`Window`] that come from the image: output columns
/// `lo..hi` (after the horizontal flip) are source pixels `first..first + (hi - lo)` of the
/// row; the rest is padding.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Columns {
    pub lo: usize,
    pub hi: usize,
    pub first: usize,
}

impl Window {
    /// The part of each output row (`ow` wide) inside an image `w` pixels wide.
    pub(crate) fn columns(&self, w: usize, ow: usize) -> Columns {
        // Output columns whose source column is inside the image: [x0, x1) before flipping.
        let x0 = (-self.left).clamp(0, ow as i64) as usize;
        let x1 = ((w as i64 - self.left).clamp(0, ow as i64) as usize).max(x0);
        let (lo, hi) = if self.flip_h {
            (ow - x1, ow - x0)
        } else {
            (x0, x1)
        };
        Columns {
            lo,
            hi,
            first: (self.left + x0 as i64).max(0) as usize,
        }
    }

    /// The source row of output row `y` (of `oh`), or `None` when it is padding.
    pub(crate) fn source_row(&self, y: usize, h: usize, oh: usize) -> Option<usize> {
        let yy = if self.flip_v { oh - 1 - y } else { y };
        usize::try_from(self.top + yy as i64)
            .ok()
            .filter(|&sy| sy < h)
    }
}

/// Images up to this many bytes (64 KiB) are converted into a staging copy that stays in the
/// L1/L2 cache and then streamed to their destination ([`rgb_crop`]).
const STAGED_BYTES: usize = 64 * 1024;

thread_local! {
    /// Each pool thread's staging copies for [`rgb_crop`], [`rgb_crop_u8`], [`rgb_crop_f16`]
    /// and [`to_f16`].
    static STAGING_F32: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    static STAGING_U8: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    static STAGING_F16: std::cell::RefCell<Vec<half::f16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Element types whose every bit pattern is a value (`f32`, `u8`, `f16`): a staging copy of
/// them may be streamed as bytes.
trait Plain: Copy + Default + 'static {}
impl Plain for f32 {}
impl Plain for u8 {}
impl Plain for half::f16 {}

/// `write` into this thread's staging copy (`dst`'s length, in the cache), then that copy
/// streamed to `dst` (`avx2::stream`); an image over [`STAGED_BYTES`] is written straight to
/// `dst`. The caller has checked that the CPU has AVX2, and `write` writes every element (the
/// staging copy holds the last image's values).
#[cfg(target_arch = "x86_64")]
fn staged<T: Plain>(
    staging: &'static std::thread::LocalKey<std::cell::RefCell<Vec<T>>>,
    dst: &mut [T],
    write: impl FnOnce(&mut [T]),
) {
    if std::mem::size_of_val(dst) > STAGED_BYTES {
        write(dst);
        return;
    }
    staging.with_borrow_mut(|s| {
        s.resize(dst.len(), T::default());
        write(s);
        let bytes = std::mem::size_of_val(dst);
        #[allow(unsafe_code)]
        // SAFETY: both slices are `bytes` long and live for this call; `T` is `f32`, `u8` or
        // `f16` (`Plain`), so its bytes may be read and written as `u8`; the CPU has AVX2
        // (the caller checked).
        unsafe {
            let from = std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), bytes);
            let to = std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u8>(), bytes);
            avx2::stream(from, to);
        }
    });
}

/// A whole RGB image (`h`×`w`, HWC `u8`) through `win` into normalized CHW `f32` (`out`
/// = [height, width] of the output); padding is written as `pad` (per channel).
/// On x86-64 with AVX2 the whole image runs in one AVX2 function (rows and padding fills
/// inlined, no per-row dispatch), into a staging copy that the cache holds, which is then
/// streamed to `dst` with non-temporal stores: `dst` is a batch's buffer, a few of which are
/// in flight (queued, or tensors the trainer holds), more than the last-level cache, and a
/// plain store first reads each line from memory. Measured on the bench host (writing 12 KiB
/// per image, 4–8 batches of 256 in flight, a micro-benchmark): 1.45 µs per image with plain
/// stores, 0.55 streamed; the images bench child's CPU time fell ~8 %. (An earlier try,
/// before the loader made tensors in place and while it still copied each batch right after,
/// measured ~2 % less CPU.)
#[allow(clippy::too_many_arguments)]
pub(crate) fn rgb_crop(
    src: &[u8],
    h: usize,
    w: usize,
    out: [usize; 2],
    win: &Window,
    scale: [f32; 3],
    bias: [f32; 3],
    pad: [f32; 3],
    dst: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        staged(&STAGING_F32, dst, |d| {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX2 (checked just above).
            unsafe {
                avx2::rgb_crop(src, h, w, out, win, scale, bias, pad, d)
            };
        });
        return;
    }
    rgb_crop_cached(src, h, w, out, win, scale, bias, pad, dst);
}

/// [`rgb_crop`] with plain stores straight into `dst`: for an image the caller reads again at
/// once (`dtype: float16` rounds it next), which streamed stores would take out of the cache.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rgb_crop_cached(
    src: &[u8],
    h: usize,
    w: usize,
    out: [usize; 2],
    win: &Window,
    scale: [f32; 3],
    bias: [f32; 3],
    pad: [f32; 3],
    dst: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe {
            avx2::rgb_crop(src, h, w, out, win, scale, bias, pad, dst)
        };
        return;
    }
    crop(src, h, w, out, win, Pad::Rows(pad), dst, |px, m, d| {
        portable(px, m, scale, bias, d)
    });
}

/// `dst[i]` = `src[i]` rounded to float16 (IEEE binary16, to nearest, ties to even): on
/// x86-64 with AVX2 and F16C by `vcvtps2ph`, through a staging copy streamed to `dst` as
/// [`rgb_crop`] writes its batch buffers; elsewhere `half`'s slice conversion, the same
/// rounding. (Not `half`'s conversion on x86-64 too: it calls an F16C function for every 8
/// values, which made `dtype: float16` slower than float32 on the images bench.)
pub(crate) fn to_f16(src: &[f32], dst: &mut [half::f16]) {
    use half::slice::HalfFloatSliceExt;
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2 and F16C (checked just above).
        staged(&STAGING_F16, dst, |d| unsafe { avx2::to_f16(src, d) });
        return;
    }
    dst.convert_from_f32_slice(src);
}

/// Whether this x86-64 CPU has AVX2 and F16C (every AVX2 CPU made has F16C; a VM may hide it).
#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
}

/// [`rgb_crop`] rounded to float16 (`dtype: float16`): on x86-64 with AVX2 and F16C in one
/// pass, each value rounded as it is stored (images up to the staging size to the staging
/// copy, then streamed to `dst`; larger ones straight to `dst`); elsewhere [`rgb_crop_cached`]
/// into `scratch` (`dst`'s length), then [`to_f16`]. Either way every value is
/// [`rgb_crop`]'s, rounded to nearest even.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rgb_crop_f16(
    src: &[u8],
    h: usize,
    w: usize,
    out: [usize; 2],
    win: &Window,
    scale: [f32; 3],
    bias: [f32; 3],
    pad: [f32; 3],
    dst: &mut [half::f16],
    scratch: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2 and F16C (checked just above).
        staged(&STAGING_F16, dst, |d| unsafe {
            avx2::rgb_crop_f16(src, h, w, out, win, scale, bias, pad, d)
        });
        return;
    }
    rgb_crop_cached(src, h, w, out, win, scale, bias, pad, scratch);
    to_f16(scratch, dst);
}

/// [`portable`] rounded to float16, for the AVX2 kernel's rows of fewer than 16 pixels.
#[cfg(target_arch = "x86_64")]
fn portable_f16(
    px: &[u8],
    mirror: bool,
    scale: [f32; 3],
    bias: [f32; 3],
    d: [&mut [half::f16]; 3],
) {
    let n = d[0].len();
    assert!(n <= 16, "portable_f16: rows of at most 16 pixels");
    let mut f = [[0.0f32; 16]; 3];
    let [f0, f1, f2] = &mut f;
    portable(
        px,
        mirror,
        scale,
        bias,
        [&mut f0[..n], &mut f1[..n], &mut f2[..n]],
    );
    for (plane, values) in d.into_iter().zip(&f) {
        for (o, v) in plane.iter_mut().zip(values) {
            *o = half::f16::from_f32_const(*v);
        }
    }
}

/// [`rgb_crop`] to CHW `u8` pixels (`dtype: uint8`: no normalize), padding written as `pad`:
/// a byte de-interleave, `pshufb` on x86-64 with AVX2, staged and streamed to `dst` as
/// [`rgb_crop`] is. (Before it the uint8 output took the float32 path and rounded every value
/// back: 2.7× slower than float32 output.)
pub(crate) fn rgb_crop_u8(
    src: &[u8],
    h: usize,
    w: usize,
    out: [usize; 2],
    win: &Window,
    pad: [u8; 3],
    dst: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        staged(&STAGING_U8, dst, |d| {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX2 (checked just above).
            unsafe {
                avx2::rgb_crop_u8(src, h, w, out, win, pad, d)
            };
        });
        return;
    }
    crop(src, h, w, out, win, prefill(pad, dst), dst, portable_u8);
}

/// Writes `pad` over each of the three planes of `dst` (one `memset` each), for [`crop`] to
/// write only the window's pixels: filled row by row, a CIFAR image's 4-pixel margins of bytes
/// were ~200 calls to `memset` (4 % of the `uint8` images bench's CPU).
fn prefill(pad: [u8; 3], dst: &mut [u8]) -> Pad<u8> {
    let plane = dst.len() / 3;
    for (p, v) in dst.chunks_mut(plane.max(1)).zip(pad) {
        p.fill(v);
    }
    Pad::Written
}

/// How [`crop`] writes the padding.
#[derive(Clone, Copy)]
enum Pad<T> {
    /// Row by row, these values per channel.
    Rows([T; 3]),
    /// Already written over the whole image.
    Written,
}

/// One row of RGB pixels to three planes of bytes, straight or mirrored.
pub(crate) fn portable_u8(px: &[u8], mirror: bool, d: [&mut [u8]; 3]) {
    let [d0, d1, d2] = d;
    let n = d0.len();
    for (i, p) in px.chunks_exact(3).enumerate() {
        let o = if mirror { n - 1 - i } else { i };
        d0[o] = p[0];
        d1[o] = p[1];
        d2[o] = p[2];
    }
}

/// A crop of an image with any number of channels (`[h, w, ch]`, HWC `u8`) through `win` into
/// CHW `dst` (`out` = [height, width]): each pixel value as `value(channel, pixel)`, padding as
/// `pad` (one value per channel, `ch` of them). The general path of both output types (the RGB kernels above are the
/// common case's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn crop_channels<T: Copy>(
    src: &[u8],
    [h, w, ch]: [usize; 3],
    [oh, ow]: [usize; 2],
    win: &Window,
    pad: &[T],
    dst: &mut [T],
    value: impl Fn(usize, u8) -> T,
) {
    let plane = oh * ow;
    let Columns { lo, hi, first } = win.columns(w, ow);
    for y in 0..oh {
        let o = y * ow;
        let sy = win.source_row(y, h, oh).filter(|_| lo < hi);
        for (k, &fill) in pad.iter().enumerate() {
            let row = &mut dst[k * plane + o..k * plane + o + ow];
            let Some(sy) = sy else {
                row.fill(fill);
                continue;
            };
            row[..lo].fill(fill);
            row[hi..].fill(fill);
            let from = (sy * w + first) * ch + k;
            let px = src[from..].iter().step_by(ch).take(hi - lo);
            let row = &mut row[lo..hi];
            if win.flip_h {
                row.iter_mut()
                    .rev()
                    .zip(px)
                    .for_each(|(o, p)| *o = value(k, *p));
            } else {
                row.iter_mut().zip(px).for_each(|(o, p)| *o = value(k, *p));
            }
        }
    }
}

/// The crop loop around a row kernel (inlined into each caller, so that the AVX2 caller's
/// fills and row kernel are compiled for AVX2 too), for `f32`, `u8` or `f16` output.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn crop<T: Copy>(
    src: &[u8],
    h: usize,
    w: usize,
    [oh, ow]: [usize; 2],
    win: &Window,
    pad: Pad<T>,
    dst: &mut [T],
    row: impl Fn(&[u8], bool, [&mut [T]; 3]),
) {
    let plane = oh * ow;
    assert!(
        dst.len() == 3 * plane && src.len() == 3 * h * w,
        "rgb_crop: sizes"
    );
    let Columns { lo, hi, first } = win.columns(w, ow);
    let (d0, rest) = dst.split_at_mut(plane);
    let (d1, d2) = rest.split_at_mut(plane);
    let mut planes = [d0, d1, d2];
    for y in 0..oh {
        let o = y * ow;
        let [r0, r1, r2] = planes.each_mut().map(|p| &mut p[o..o + ow]);
        let sy = win.source_row(y, h, oh).filter(|_| lo < hi);
        if let Pad::Rows(pad) = pad {
            for (r, b) in [&mut *r0, &mut *r1, &mut *r2].into_iter().zip(pad) {
                match sy {
                    None => r.fill(b),
                    Some(_) => {
                        r[..lo].fill(b);
                        r[hi..].fill(b);
                    }
                }
            }
        }
        let Some(sy) = sy else {
            continue;
        };
        let at = (sy * w + first) * 3;
        let px = &src[at..at + (hi - lo) * 3];
        row(
            px,
            win.flip_h,
            [&mut r0[lo..hi], &mut r1[lo..hi], &mut r2[lo..hi]],
        );
    }
}

/// Two passes per chunk of a row: the contiguous `u8 → f32` conversion vectorises, the
/// strided de-interleave then reads from L1; separate loops for mirrored and straight rows
/// (no branch per pixel).
pub(crate) fn portable(
    px: &[u8],
    mirror: bool,
    scale: [f32; 3],
    bias: [f32; 3],
    d: [&mut [f32]; 3],
) {
    let [d0, d1, d2] = d;
    let n = d0.len();
    let [s0, s1, s2] = scale;
    let [c0, c1, c2] = bias;
    let mut f = [0.0f32; 3 * CHUNK];
    let mut a = 0;
    while a < n {
        let m = CHUNK.min(n - a);
        let t = &mut f[..3 * m];
        for (v, p) in t.iter_mut().zip(&px[3 * a..3 * (a + m)]) {
            *v = f32::from(*p);
        }
        if mirror {
            let e = n - a;
            let (o0, o1, o2) = (&mut d0[e - m..e], &mut d1[e - m..e], &mut d2[e - m..e]);
            for i in 0..m {
                o0[m - 1 - i] = t[3 * i] * s0 + c0;
                o1[m - 1 - i] = t[3 * i + 1] * s1 + c1;
                o2[m - 1 - i] = t[3 * i + 2] * s2 + c2;
            }
        } else {
            let (o0, o1, o2) = (&mut d0[a..a + m], &mut d1[a..a + m], &mut d2[a..a + m]);
            for i in 0..m {
                o0[i] = t[3 * i] * s0 + c0;
                o1[i] = t[3 * i + 1] * s1 + c1;
                o2[i] = t[3 * i + 2] * s2 + c2;
            }
        }
        a += m;
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn expected(px: &[u8], mirror: bool, scale: [f32; 3], bias: [f32; 3]) -> [Vec<f32>; 3] {
        let n = px.len() / 3;
        [0, 1, 2].map(|k| {
            (0..n)
                .map(|i| {
                    let p = if mirror { n - 1 - i } else { i };
                    f32::from(px[3 * p + k]) * scale[k] + bias[k]
                })
                .collect()
        })
    }

    type RowFn = fn(&[u8], bool, [f32; 3], [f32; 3], [&mut [f32]; 3]);

    fn run(f: RowFn, px: &[u8], mirror: bool, scale: [f32; 3], bias: [f32; 3]) -> [Vec<f32>; 3] {
        let n = px.len() / 3;
        let mut out = [vec![f32::NAN; n], vec![f32::NAN; n], vec![f32::NAN; n]];
        let [a, b, c] = &mut out;
        f(px, mirror, scale, bias, [a, b, c]);
        out
    }

    #[test]
    fn a_cifar_row_by_hand() {
        // 32 pixels: pixel i = (i, 100 + i, 255 - i); scale 2, 1, 0.5; bias -1, 0, 1.
        let px: Vec<u8> = (0..32u8).flat_map(|i| [i, 100 + i, 255 - i]).collect();
        let (s, b) = ([2.0, 1.0, 0.5], [-1.0, 0.0, 1.0]);
        let straight = run(rgb_row, &px, false, s, b);
        assert_eq!(straight[0][5], 9.0);
        assert_eq!(straight[1][31], 131.0);
        assert_eq!(straight[2][0], 128.5);
        let mirrored = run(rgb_row, &px, true, s, b);
        assert_eq!(mirrored[0][31 - 5], 9.0);
        assert_eq!(mirrored[1][0], 131.0);
        assert_eq!(mirrored[2][31], 128.5);
    }

    /// An RGB image (`h`, `w`, its bytes), an output size and a window over it: inside,
    /// overlapping the padding or outside, flipped or not.
    fn crops() -> impl Strategy<Value = (usize, usize, Vec<u8>, [usize; 2], Window)> {
        let image = (1usize..40, 1usize..40).prop_flat_map(|(h, w)| {
            (
                Just(h),
                Just(w),
                proptest::collection::vec(any::<u8>(), 3 * h * w),
            )
        });
        let window = (-8i64..40, -8i64..40, any::<bool>(), any::<bool>()).prop_map(
            |(top, left, flip_h, flip_v)| Window {
                top,
                left,
                flip_h,
                flip_v,
            },
        );
        (image, proptest::array::uniform2(1usize..40), window)
            .prop_map(|((h, w, src), out, win)| (h, w, src, out, win))
    }

    /// `to_f16` (staged and streamed, or not) rounds as `half`'s software conversion does, for
    /// every length around the staging limit's and for values across float16's range:
    /// subnormals, ties, the largest finite and overflow to infinity.
    #[test]
    fn float16_rounding_is_the_software_definition() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let special = [
            0.0,
            -0.0,
            65504.0,
            65520.0,
            1e-8,
            5.96e-8,
            2.98e-8,
            1.0 + 1.0 / 2048.0,
        ];
        for len in [0, 1, 7, 8, 9, 3072, STAGED_BYTES / 2, STAGED_BYTES / 2 + 3] {
            let src: Vec<f32> = (0..len)
                .map(|i| match special.get(i) {
                    Some(v) => *v,
                    // Finite values from 2^-30 to 2^17, either sign.
                    None => {
                        let w = next();
                        let exp = 97 + (w % 48) as u32;
                        f32::from_bits(((w >> 32) as u32 & 0x807f_ffff) | (exp << 23))
                    }
                })
                .collect();
            let mut got = vec![half::f16::from_bits(0x7e00); len];
            to_f16(&src, &mut got);
            for (i, (g, v)) in got.iter().zip(&src).enumerate() {
                let want = half::f16::from_f32_const(*v);
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "length {len}, value {i}: {v:e}"
                );
            }
        }
    }

    /// The streamed copy writes every byte, whatever the destination's alignment (an
    /// unaligned head, whole 32-byte blocks, a tail) and length, and nothing around it.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_streamed_copy_is_a_copy() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let src: Vec<u8> = (0..160u8).map(|v| v.wrapping_mul(37)).collect();
        for offset in 0..32 {
            for len in 0..=128 {
                let mut dst = [0xeeu8; 128 + 32];
                let d = &mut dst[offset..offset + len];
                #[allow(unsafe_code)]
                // SAFETY: the CPU has AVX2 (checked above).
                unsafe {
                    avx2::stream(&src[..len], d)
                };
                assert_eq!(&dst[offset..offset + len], &src[..len], "{offset} {len}");
                assert!(dst[..offset].iter().all(|&v| v == 0xee), "{offset} {len}");
                assert!(
                    dst[offset + len..].iter().all(|&v| v == 0xee),
                    "{offset} {len}"
                );
            }
        }
    }

    proptest! {
        /// The whole-image crop (AVX2 where the CPU has it) equals the portable loop bit for
        /// bit, for every window (inside, overlapping the padding, outside) and flip.
        #[test]
        fn every_crop_is_the_portable_one((h, w, src, out, win) in crops()) {
            let (scale, bias, pad) = ([0.5, -2.0, 3.0], [-1.0, 0.25, 7.0], [9.5, -3.0, 0.125]);
            let n = 3 * out[0] * out[1];
            let mut want = vec![f32::NAN; n];
            crop(&src, h, w, out, &win, Pad::Rows(pad), &mut want, |px, m, d| portable(px, m, scale, bias, d));
            let mut got = vec![f32::NAN; n];
            rgb_crop(&src, h, w, out, &win, scale, bias, pad, &mut got);
            prop_assert_eq!(got, want);
        }

        /// The float16 crop (one pass with AVX2 and F16C, else the float32 crop converted)
        /// is the float32 crop rounded to nearest even, for every window and flip, padding and
        /// scales that round (scale 0.3 makes most values inexact in float16).
        #[test]
        fn the_f16_crop_is_the_f32_crop_rounded((h, w, src, out, win) in crops()) {
            let (scale, bias, pad) = ([0.3, -2.0, 1e-5], [-1.0, 0.25, 7.0], [9.5, -3.1, 0.1]);
            let n = 3 * out[0] * out[1];
            let mut f = vec![f32::NAN; n];
            rgb_crop(&src, h, w, out, &win, scale, bias, pad, &mut f);
            let mut got = vec![half::f16::NAN; n];
            let mut scratch = vec![0.0; n];
            rgb_crop_f16(&src, h, w, out, &win, scale, bias, pad, &mut got, &mut scratch);
            let want: Vec<u16> = f.iter().map(|v| half::f16::from_f32_const(*v).to_bits()).collect();
            let got: Vec<u16> = got.iter().map(|v| v.to_bits()).collect();
            prop_assert_eq!(got, want);
        }

        /// The `u8` crop (AVX2 where the CPU has it, and the portable loop) gives the pixel
        /// values the `f32` crop gives with scale 1 and bias 0, for every window and flip.
        #[test]
        fn the_u8_crop_is_the_f32_crop_of_the_pixels((h, w, src, out, win) in crops()) {
            let n = 3 * out[0] * out[1];
            let mut want = vec![f32::NAN; n];
            rgb_crop(&src, h, w, out, &win, [1.0; 3], [0.0; 3], [7.0, 0.0, 255.0], &mut want);
            let want: Vec<u8> = want.iter().map(|v| *v as u8).collect();
            let mut got = vec![1u8; n];
            rgb_crop_u8(&src, h, w, out, &win, [7, 0, 255], &mut got);
            prop_assert_eq!(&got, &want);
            let mut portable = vec![1u8; n];
            crop(&src, h, w, out, &win, Pad::Rows([7, 0, 255]), &mut portable, portable_u8);
            prop_assert_eq!(portable, want);
        }

        /// The dispatched version (AVX2 where the CPU has it) equals the definition bit for
        /// bit, for every length (blocks of 16 and an overlapping tail, and the short rows the
        /// portable code handles), straight and mirrored.
        #[test]
        fn every_version_is_the_definition(
            px in (0usize..200).prop_flat_map(|n| proptest::collection::vec(any::<u8>(), 3 * n)),
            mirror in any::<bool>(),
            scale in proptest::array::uniform3(-10.0f32..10.0),
            bias in proptest::array::uniform3(-10.0f32..10.0),
        ) {
            let want = expected(&px, mirror, scale, bias);
            prop_assert_eq!(&run(rgb_row, &px, mirror, scale, bias), &want);
            prop_assert_eq!(&run(portable, &px, mirror, scale, bias), &want);
        }
    }
}
