//! What travels for one bucket of gradients: dense f32 or f16 through the collective's own
//! all-reduce, bf16 and top-k pairs through an all-gather summed in rank order (in f32, so
//! every rank computes bitwise the same sum on every backend).

use half::{bf16, f16};
use sluice_pipeline::collective::Collective;

use crate::TrainError;

/// Sums `buf` over the ranks in f32 (`all_reduce_f32`). Returns the bytes this rank sent.
pub(super) fn dense_f32(c: &dyn Collective, buf: &mut [f32]) -> Result<u64, TrainError> {
    c.all_reduce_f32(buf)?;
    Ok(buf.len() as u64 * 4)
}

/// Sums `buf` over the ranks with f16 on the wire (sums accumulate in f32, rounded once).
pub(super) fn dense_f16(
    c: &dyn Collective,
    buf: &mut [f32],
    half: &mut Vec<f16>,
) -> Result<u64, TrainError> {
    half.clear();
    half.extend(buf.iter().map(|&x| f16::from_f32(x)));
    c.all_reduce_f16(half)?;
    for (d, s) in buf.iter_mut().zip(half.iter()) {
        *d = s.to_f32();
    }
    Ok(buf.len() as u64 * 2)
}

/// Sums `buf` over the ranks with bfloat16 on the wire: every rank's values rounded to bf16
/// once, summed in rank order in f32 (the result stays f32).
pub(super) fn dense_bf16(c: &dyn Collective, buf: &mut [f32]) -> Result<u64, TrainError> {
    let mut send = Vec::with_capacity(buf.len() * 2);
    for &x in buf.iter() {
        send.extend_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes());
    }
    let sent = send.len() as u64;
    let all = c.all_gather(send)?;
    buf.fill(0.0);
    for (rank, msg) in all.iter().enumerate() {
        if msg.len() != buf.len() * 2 {
            return Err(malformed(rank, "bf16"));
        }
        for (d, b) in buf.iter_mut().zip(msg.chunks_exact(2)) {
            *d += bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
        }
    }
    Ok(sent)
}

/// Top-k: this rank sends the `k` values of `acc` largest in magnitude (ties by the lower
/// index, so the choice is deterministic) as little-endian (u32 index, f32 value) pairs;
/// `out` becomes the sum of every rank's pairs, and `acc` keeps what was not sent (the
/// sent entries are zeroed) for error feedback. `order` is scratch. Returns the bytes sent.
pub(super) fn top_k(
    c: &dyn Collective,
    acc: &mut [f32],
    k: usize,
    out: &mut [f32],
    order: &mut Vec<u32>,
) -> Result<u64, TrainError> {
    let n = acc.len();
    let k = k.clamp(1, n.max(1)).min(n);
    order.clear();
    order.extend(0..n as u32);
    if k < n {
        let by_magnitude = |a: &u32, b: &u32| {
            acc[*b as usize]
                .abs()
                .total_cmp(&acc[*a as usize].abs())
                .then(a.cmp(b))
        };
        order.select_nth_unstable_by(k - 1, by_magnitude);
        order.truncate(k);
        order.sort_unstable();
    }
    let mut send = Vec::with_capacity(order.len() * 8);
    for &i in order.iter() {
        send.extend_from_slice(&i.to_le_bytes());
        send.extend_from_slice(&acc[i as usize].to_le_bytes());
        acc[i as usize] = 0.0;
    }
    let sent = send.len() as u64;
    let all = c.all_gather(send)?;
    out.fill(0.0);
    for (rank, msg) in all.iter().enumerate() {
        if msg.len() % 8 != 0 {
            return Err(malformed(rank, "top-k"));
        }
        for pair in msg.chunks_exact(8) {
            let i = u32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]) as usize;
            let v = f32::from_le_bytes([pair[4], pair[5], pair[6], pair[7]]);
            *out.get_mut(i).ok_or_else(|| malformed(rank, "top-k"))? += v;
        }
    }
    Ok(sent)
}

fn malformed(rank: usize, what: &str) -> TrainError {
    TrainError::Config(format!(
        "rank {rank} sent a malformed {what} gradient message: do all ranks run the same Sluice and the same `trainer.allreduce.compression`?"
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use sluice_pipeline::collective::LocalCollective;

    use super::*;

    fn on_two<T: Send + 'static>(
        f: impl Fn(usize, &dyn Collective) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let hs: Vec<_> = LocalCollective::group(2)
            .into_iter()
            .enumerate()
            .map(|(r, c)| {
                let f = f.clone();
                std::thread::spawn(move || f(r, &c))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// Each rank sends its 2 largest magnitudes; the sum holds both ranks' pairs, what was
    /// not sent stays in the residual, and the bytes are 8 per pair.
    #[test]
    fn top_k_sends_the_largest_and_keeps_the_rest() {
        let out = on_two(|r, c| {
            let mut acc = if r == 0 {
                vec![0.1f32, -5.0, 0.2, 3.0, 0.0]
            } else {
                vec![4.0f32, 0.0, 0.0, -0.5, 1.0]
            };
            let mut sum = vec![0.0; 5];
            let sent = top_k(c, &mut acc, 2, &mut sum, &mut Vec::new()).unwrap();
            (acc, sum, sent)
        });
        assert_eq!(out[0].1, vec![4.0, -5.0, 0.0, 3.0, 1.0]);
        assert_eq!(out[1].1, out[0].1);
        assert_eq!(out[0].0, vec![0.1, 0.0, 0.2, 0.0, 0.0]);
        assert_eq!(out[1].0, vec![0.0, 0.0, 0.0, -0.5, 0.0]);
        assert_eq!((out[0].2, out[1].2), (16, 16));
    }

    #[test]
    fn bf16_sums_in_f32_identically_everywhere() {
        let out = on_two(|r, c| {
            let mut buf = vec![1.0f32 + r as f32, 1e-3, 1.0 / 3.0];
            let sent = dense_bf16(c, &mut buf).unwrap();
            (buf, sent)
        });
        assert_eq!(out[0], out[1]);
        assert_eq!(out[0].1, 6);
        assert_eq!(out[0].0[0], 3.0);
        assert!((out[0].0[1] - 2e-3).abs() < 2e-5);
        assert_ne!(out[0].0[2], 2.0 / 3.0, "rounded to bf16 before the sum");
        assert!((out[0].0[2] - 2.0 / 3.0).abs() < 4e-3);
    }
}
