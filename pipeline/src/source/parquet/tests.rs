//! Tests of the `mix` arithmetic: rows apportioned by weight, and what an epoch takes.

use super::mix::apportion;
use super::*;

#[test]
fn shares_are_apportioned_by_the_largest_remainders() {
    // Quotas 3.33…, 3.33…, 3.33…: the one row left goes to the first.
    assert_eq!(apportion(10, &[1.0, 1.0, 1.0]), [4, 3, 3]);
    // 7.5 and 2.5: both remainders equal, the earlier entry first.
    assert_eq!(apportion(10, &[3.0, 1.0]), [8, 2]);
    // 0.6, 2.4: the larger remainder wins.
    assert_eq!(apportion(3, &[1.0, 4.0]), [1, 2]);
    assert_eq!(apportion(0, &[1.0, 2.0]), [0, 0]);
}

#[test]
fn an_epoch_takes_the_most_rows_that_repeat_none() {
    let paths = ["a".to_string(), "b".to_string()];
    // b (300 rows, weight 1) limits: 3 × 300 of a, all of b.
    assert_eq!(
        mix_counts(&[3000, 300], &[3.0, 1.0], None, &paths),
        Ok(vec![900, 300])
    );
    // a limits when its weight is large: all of a, a tenth of that from b.
    assert_eq!(
        mix_counts(&[100, 300], &[10.0, 1.0], None, &paths),
        Ok(vec![100, 10])
    );
    assert_eq!(
        mix_counts(&[3000, 300], &[3.0, 1.0], Some(40), &paths),
        Ok(vec![30, 10])
    );
    let e = mix_counts(&[3000, 300], &[3.0, 1.0], Some(1201), &paths).unwrap_err();
    assert!(
        e.contains("would take 300.25 rows of `path` entry 1 (`b`), which has 300"),
        "{e}"
    );
    assert!(e.contains("allow at most 1200 rows"), "{e}");
    // Weights as large or as small as floats go: the same shares as 3 : 1.
    assert_eq!(
        mix_counts(&[3000, 300], &[3e307, 1e307], None, &paths),
        Ok(vec![900, 300])
    );
    assert_eq!(
        mix_counts(&[3000, 300], &[3e-300, 1e-300], None, &paths),
        Ok(vec![900, 300])
    );
    // A weight too small to matter next to the other: none of that entry.
    assert_eq!(
        mix_counts(&[3000, 300], &[1.0, 1e-300], None, &paths),
        Ok(vec![3000, 0])
    );
    let e = mix_counts(&[3000, 0], &[3.0, 1.0], None, &paths).unwrap_err();
    assert!(e.contains("entry 1 (`b`) has no rows"), "{e}");
}

/// `prefetch` units started in all while one is handed over: the source drains a unit without
/// polling the stream, so what is started then is what was started when it was taken.
#[test]
fn prefetch_units_are_started_while_one_is_handed_over() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    for prefetch in [1, 2, 4] {
        let started = Arc::new(AtomicUsize::new(0));
        let counter = started.clone();
        let units = futures::stream::iter(0..10).map(move |i| {
            counter.fetch_add(1, Ordering::SeqCst);
            futures::future::ready(i)
        });
        let mut reading = in_flight(units, prefetch);
        futures::executor::block_on(async {
            for taken in 0..5 {
                assert_eq!(reading.next().await, Some(taken));
                // Units `taken..taken + prefetch` are started: the one handed over and
                // `prefetch - 1` ahead of it.
                assert_eq!(
                    started.load(Ordering::SeqCst),
                    taken + prefetch,
                    "prefetch {prefetch}"
                );
            }
        });
    }
}
