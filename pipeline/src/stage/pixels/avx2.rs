//! The AVX2 kernels of [`super`] (and F16C's conversion to float16), chosen at run time by
//! the dispatching functions there: the RGB row kernels (`pshufb` de-interleave, then the
//! `u8 → f32` conversion, multiply and add, stored as float32 or rounded to float16), the
//! whole-image crops they run in, and the streamed copy to a batch's buffer.

use half::f16;
use std::arch::x86_64::{
    __m128i, __m256, _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128, _mm_or_si128, _mm_sfence,
    _mm_shuffle_epi8, _mm_srli_si128, _mm_storeu_si128, _mm256_add_ps, _mm256_cvtepi32_ps,
    _mm256_cvtepu8_epi32, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_loadu_si256, _mm256_mul_ps,
    _mm256_set1_ps, _mm256_storeu_ps, _mm256_stream_si256,
};

/// `pshufb` masks that gather channel `k` of 16 RGB pixels (48 bytes in three 16-byte
/// registers) into one register: `[k][register][lane]`, 0x80 = zero. Mirrored: lane `j`
/// takes pixel `15 - j`.
const fn masks(mirror: bool) -> [[[u8; 16]; 3]; 3] {
    let mut m = [[[0x80u8; 16]; 3]; 3];
    let mut k = 0;
    while k < 3 {
        let mut j = 0;
        while j < 16 {
            let pixel = if mirror { 15 - j } else { j };
            let byte = 3 * pixel + k;
            m[k][byte / 16][j] = (byte % 16) as u8;
            j += 1;
        }
        k += 1;
    }
    m
}

/// [`super::rgb_crop`], every row and fill compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn rgb_crop(
    src: &[u8],
    h: usize,
    w: usize,
    out: [usize; 2],
    win: &super::Window,
    scale: [f32; 3],
    bias: [f32; 3],
    pad: [f32; 3],
    dst: &mut [f32],
) {
    super::crop(
        src,
        h,
        w,
        out,
        win,
        super::Pad::Rows(pad),
        dst,
        |px, mirror, d| {
            if d[0].len() >= 16 {
                // SAFETY: AVX2 is present (this function's contract); `crop` passes
                // matching lengths, at least 16 pixels here.
                unsafe { rgb_row(px, mirror, scale, bias, d) }
            } else {
                super::portable(px, mirror, scale, bias, d)
            }
        },
    );
}

/// `dst = src` with non-temporal stores (write-combined, not read into the cache first)
/// where `dst` is 32-byte aligned, plain stores for its unaligned head and its tail; then
/// a store fence, so that the bytes are visible to whichever thread is handed the buffer
/// next (a release on a channel orders ordinary stores, not streamed ones).
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn stream(src: &[u8], dst: &mut [u8]) {
    let head = dst.as_ptr().align_offset(32).min(dst.len());
    dst[..head].copy_from_slice(&src[..head]);
    let (src, dst) = (&src[head..], &mut dst[head..]);
    let body = dst.len() / 32 * 32;
    for (s, d) in src[..body].chunks_exact(32).zip(dst.chunks_exact_mut(32)) {
        // SAFETY: `s` is 32 readable bytes (unaligned load); `d` is 32 writable bytes
        // starting 32-byte aligned (`head` aligned the first, and each is 32 bytes on).
        unsafe {
            _mm256_stream_si256(d.as_mut_ptr().cast(), _mm256_loadu_si256(s.as_ptr().cast()))
        };
    }
    dst[body..].copy_from_slice(&src[body..]);
    _mm_sfence();
}

/// [`super::rgb_crop_u8`], every row and fill compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn rgb_crop_u8(
    src: &[u8],
    h: usize,
    w: usize,
    out: [usize; 2],
    win: &super::Window,
    pad: [u8; 3],
    dst: &mut [u8],
) {
    let pad = super::prefill(pad, dst);
    super::crop(src, h, w, out, win, pad, dst, |px, mirror, d| {
        if d[0].len() >= 16 {
            // SAFETY: AVX2 is present (this function's contract); `crop` passes
            // matching lengths, at least 16 pixels here.
            unsafe { rgb_row_u8(px, mirror, d) }
        } else {
            super::portable_u8(px, mirror, d)
        }
    });
}

/// The three channels of 16 RGB pixels (48 bytes in three registers), each gathered into
/// one register by `pshufb` with `masks`.
#[inline]
#[target_feature(enable = "avx2")]
fn channels(block: &[u8], mask: &[[__m128i; 3]; 3]) -> [__m128i; 3] {
    let load = |bytes: &[u8]| -> __m128i {
        assert!(bytes.len() >= 16);
        // SAFETY: 16 readable bytes (asserted); unaligned load.
        unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
    };
    let r = [load(block), load(&block[16..]), load(&block[32..])];
    let channel = |m: &[__m128i; 3]| {
        _mm_or_si128(
            _mm_or_si128(_mm_shuffle_epi8(r[0], m[0]), _mm_shuffle_epi8(r[1], m[1])),
            _mm_shuffle_epi8(r[2], m[2]),
        )
    };
    // Called directly, not through `array::map`: `core`'s `map` is not compiled for AVX2,
    // so it could not inline an AVX2 closure and called it per channel, its registers
    // passed through memory (with `mask_registers`' maps: ~10 % of the uint8 images run).
    [channel(&mask[0]), channel(&mask[1]), channel(&mask[2])]
}

/// The `pshufb` masks of `mirror` in registers.
#[inline]
#[target_feature(enable = "avx2")]
fn mask_registers(mirror: bool) -> [[__m128i; 3]; 3] {
    let table = if mirror { &MIRRORED } else { &STRAIGHT };
    // SAFETY: each mask is 16 readable bytes; unaligned loads.
    let load = |m: &[u8; 16]| unsafe { _mm_loadu_si128(m.as_ptr().cast()) };
    let channel = |k: &[[u8; 16]; 3]| [load(&k[0]), load(&k[1]), load(&k[2])];
    // Not `array::map` (see `channels`).
    [channel(&table[0]), channel(&table[1]), channel(&table[2])]
}

/// [`super::portable_u8`] 16 pixels at a time (the last block overlapping the one before
/// it when `n` is not a multiple of 16).
///
/// # Safety
/// The CPU must support AVX2; `n >= 16`, `px.len() == 3 n` and every `d[k].len() == n`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn rgb_row_u8(px: &[u8], mirror: bool, d: [&mut [u8]; 3]) {
    let n = d[0].len();
    debug_assert!(n >= 16 && px.len() == 3 * n);
    let mask = mask_registers(mirror);
    let planes = d;
    let mut a = 0;
    loop {
        let start = a.min(n - 16);
        let v = channels(&px[3 * start..3 * start + 48], &mask);
        let o = if mirror { n - 16 - start } else { start };
        for k in 0..3 {
            let out = &mut planes[k][o..o + 16];
            // SAFETY: `out` is 16 writable bytes; unaligned store.
            unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), v[k]) };
        }
        if start == n - 16 {
            break;
        }
        a += 16;
    }
}

static STRAIGHT: [[[u8; 16]; 3]; 3] = masks(false);
static MIRRORED: [[[u8; 16]; 3]; 3] = masks(true);

/// The body of [`rgb_row`] and [`rgb_row_f16`], 16 pixels at a time; the last block
/// overlaps the one before it when `n` is not a multiple of 16 (its values are rewritten,
/// identical). `$store(out, y)` writes the 8 values `y` to `out` (8 elements). A macro, not
/// a generic function: each expansion is compiled inside its own `target_feature`
/// function, so the intrinsics (F16C's conversion among them) inline there.
macro_rules! rgb_row_body {
    ($px:expr, $mirror:expr, $scale:expr, $bias:expr, $planes:expr, $store:expr) => {{
        let (px, mirror, scale, bias, planes) = ($px, $mirror, $scale, $bias, $planes);
        let n = planes[0].len();
        debug_assert!(n >= 16 && px.len() == 3 * n);
        let mask = mask_registers(mirror);
        let s: [__m256; 3] = [
            _mm256_set1_ps(scale[0]),
            _mm256_set1_ps(scale[1]),
            _mm256_set1_ps(scale[2]),
        ];
        let b: [__m256; 3] = [
            _mm256_set1_ps(bias[0]),
            _mm256_set1_ps(bias[1]),
            _mm256_set1_ps(bias[2]),
        ];
        let mut a = 0;
        loop {
            let start = a.min(n - 16);
            let channels = channels(&px[3 * start..3 * start + 48], &mask);
            let o = if mirror { n - 16 - start } else { start };
            for k in 0..3 {
                let (out, v) = (&mut planes[k][o..o + 16], channels[k]);
                for (half, bytes) in [v, _mm_srli_si128::<8>(v)].into_iter().enumerate() {
                    let f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
                    let y = _mm256_add_ps(_mm256_mul_ps(f, s[k]), b[k]);
                    $store(&mut out[8 * half..8 * half + 8], y);
                }
            }
            if start == n - 16 {
                break;
            }
            a += 16;
        }
    }};
}

/// [`super::rgb_row`] 16 pixels at a time (`rgb_row_body`).
///
/// # Safety
/// The CPU must support AVX2; `n >= 16`, `px.len() == 3 n` and every `d[k].len() == n`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn rgb_row(
    px: &[u8],
    mirror: bool,
    scale: [f32; 3],
    bias: [f32; 3],
    d: [&mut [f32]; 3],
) {
    rgb_row_body!(px, mirror, scale, bias, d, |dst: &mut [f32], y| {
        assert!(dst.len() == 8);
        // SAFETY: `dst` is 8 writable f32 (asserted); unaligned store.
        unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), y) };
    });
}

/// [`rgb_row`] rounded to float16 as it is stored (F16C's `vcvtps2ph`, to nearest even).
///
/// # Safety
/// The CPU must support AVX2 and F16C; `n >= 16`, `px.len() == 3 n` and every
/// `d[k].len() == n`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn rgb_row_f16(
    px: &[u8],
    mirror: bool,
    scale: [f32; 3],
    bias: [f32; 3],
    d: [&mut [f16]; 3],
) {
    rgb_row_body!(px, mirror, scale, bias, d, |dst: &mut [f16], y| {
        assert!(dst.len() == 8);
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(y);
        // SAFETY: `dst` is 8 writable f16, 16 bytes (asserted); unaligned store.
        unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), h) };
    });
}

/// [`super::rgb_crop_f16`], every row and fill compiled for AVX2 and F16C.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn rgb_crop_f16(
    src: &[u8],
    h: usize,
    w: usize,
    out: [usize; 2],
    win: &super::Window,
    scale: [f32; 3],
    bias: [f32; 3],
    pad: [f32; 3],
    dst: &mut [f16],
) {
    let pad = [
        f16::from_f32_const(pad[0]),
        f16::from_f32_const(pad[1]),
        f16::from_f32_const(pad[2]),
    ];
    super::crop(
        src,
        h,
        w,
        out,
        win,
        super::Pad::Rows(pad),
        dst,
        |px, mirror, d| {
            if d[0].len() >= 16 {
                // SAFETY: AVX2 and F16C are present (this function's contract); `crop`
                // passes matching lengths, at least 16 pixels here.
                unsafe { rgb_row_f16(px, mirror, scale, bias, d) }
            } else {
                super::portable_f16(px, mirror, scale, bias, d)
            }
        },
    );
}

/// [`super::to_f16`]: 8 values per `vcvtps2ph` (to nearest even), the rest one by one.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn to_f16(src: &[f32], dst: &mut [f16]) {
    assert!(src.len() == dst.len(), "to_f16: lengths");
    let body = src.len() / 8 * 8;
    for (s, d) in src[..body].chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
        // SAFETY: `s` is 8 readable f32, `d` 8 writable f16 (16 bytes); unaligned.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
            _mm_storeu_si128(d.as_mut_ptr().cast(), h);
        }
    }
    for (d, s) in dst[body..].iter_mut().zip(&src[body..]) {
        *d = f16::from_f32_const(*s);
    }
}
