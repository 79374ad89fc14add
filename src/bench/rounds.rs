//! A variant's ratio to the raw decode round by round: each of its runs against the raw run of
//! the same round. The table's ratios divide each side's fastest run, which on a VM whose speed
//! drifts over the minutes of a bench can pair a lucky run with an unlucky one (the same
//! pipeline read 0.79× and 0.68× in two benches of 2026-12-02); runs a few seconds apart share
//! the machine's state, so the median of the paired ratios, with their range, says how far one
//! table's figure can be trusted.

use serde::Serialize;

use super::child::Measured;

/// The paired ratios of one variant over the rounds in which it and the raw decode both ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Paired {
    /// Rounds with both runs.
    pub(super) rounds: usize,
    /// Throughput ÷ the raw decode's in the same round: median, lowest, highest.
    pub(super) median: f64,
    pub(super) min: f64,
    pub(super) max: f64,
    /// Samples per CPU-second ÷ the raw decode's in the same round (median), where both
    /// runs measured their CPU time.
    pub(super) per_cpu_median: Option<f64>,
}

/// `runs[r]`: the variant's run in round `r` (`None`: it did not run or failed); `raw[r]` the
/// same for the raw decode. `None` when no round has both.
pub(super) fn paired(raw: &[Option<Measured>], runs: &[Option<Measured>]) -> Option<Paired> {
    let both: Vec<(&Measured, &Measured)> = raw
        .iter()
        .zip(runs)
        .filter_map(|(r, v)| Some((r.as_ref()?, v.as_ref()?)))
        .filter(|(r, v)| r.rows > 0 && v.rows > 0 && r.seconds > 0.0 && v.seconds > 0.0)
        .collect();
    // Rates are rows / seconds; both sides read the same rows, but say so in the arithmetic.
    let rate = |m: &Measured| m.rows as f64 / m.seconds;
    let mut ratios: Vec<f64> = both.iter().map(|(r, v)| rate(v) / rate(r)).collect();
    let per_cpu = |m: &Measured| Some(m.rows as f64 / m.cpu_seconds.filter(|c| *c > 0.0)?);
    let mut cpu: Vec<f64> = both
        .iter()
        .filter_map(|(r, v)| Some(per_cpu(v)? / per_cpu(r)?))
        .collect();
    let median_of = |xs: &mut Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        let n = xs.len();
        match n {
            0 => None,
            _ if n % 2 == 1 => Some(xs[n / 2]),
            _ => Some((xs[n / 2 - 1] + xs[n / 2]) / 2.0),
        }
    };
    let median = median_of(&mut ratios)?;
    Some(Paired {
        rounds: ratios.len(),
        median,
        min: ratios[0],
        max: ratios[ratios.len() - 1],
        per_cpu_median: if cpu.len() == ratios.len() {
            median_of(&mut cpu)
        } else {
            None
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rows: usize, seconds: f64, cpu: Option<f64>) -> Option<Measured> {
        Some(Measured {
            rows,
            seconds,
            peak_rss_mib: 1.0,
            start_rss_mib: None,
            libtorch_rss_mib: None,
            cpu_seconds: cpu,
            bottleneck: None,
        })
    }

    #[test]
    fn each_run_is_divided_by_the_raw_run_of_its_own_round() {
        // The machine slows down in round 2: both runs take twice as long, the pair's ratio
        // stays 0.5. The fastest runs (raw 1 s in round 1, the variant 1.5 s in round 3)
        // would read 0.67×.
        let raw = [
            run(100, 1.0, Some(2.0)),
            run(100, 2.0, Some(4.0)),
            run(100, 1.2, Some(2.0)),
        ];
        let v = [
            run(100, 2.0, Some(4.0)),
            run(100, 4.0, Some(8.0)),
            run(100, 1.5, Some(2.5)),
        ];
        let p = paired(&raw, &v).unwrap();
        assert_eq!(p.rounds, 3);
        assert_eq!((p.min, p.median), (0.5, 0.5));
        assert!((p.max - 0.8).abs() < 1e-12, "{p:?}");
        assert_eq!(p.per_cpu_median, Some(0.5));
    }

    #[test]
    fn rounds_missing_a_side_are_left_out_and_even_counts_take_the_middle_two() {
        let raw = [
            run(10, 1.0, None),
            None,
            run(10, 1.0, None),
            run(10, 1.0, None),
        ];
        let v = [
            run(10, 2.0, None),
            run(10, 1.0, None),
            run(10, 4.0, None),
            None,
        ];
        let p = paired(&raw, &v).unwrap();
        assert_eq!(p.rounds, 2);
        assert_eq!((p.min, p.median, p.max), (0.25, 0.375, 0.5));
        assert_eq!(p.per_cpu_median, None, "no CPU times");
        assert_eq!(paired(&raw[1..2], &v[1..2]), None);
    }
}
