//! The add-on's own bucketing tests (`pkg/queue/bucketing_test.go` at v0.15.0), on a clock of
//! our choosing instead of `time.Now()`.

use super::*;

const SECOND: Duration = Duration::from_secs(1);

/// A wall-clock time that is not on a second's boundary, as `time.Now()` in the add-on's tests.
fn unaligned() -> Duration {
    Duration::from_millis(1_719_403_200_437)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn the_window_average_counts_the_buckets_since_the_first_write_and_clears_quiet_ones() {
    let now = unaligned();
    let mut buckets = RequestBuckets::new(secs(5), SECOND).unwrap();
    // firstWrite in use: without it this would be 0.2.
    buckets.record(now, 1);
    assert_eq!(buckets.window_average(now), 1.0);
    for i in 1..5 {
        buckets.record(now + secs(i), i as i64 + 1);
    }
    assert_eq!(buckets.window_average(now + secs(4)), 15.0 / 5.0);
    // `now` lagging behind the last write.
    assert_eq!(
        buckets.window_average(now + Duration::from_millis(3600)),
        15.0 / 5.0
    );
    // A short hole: the buckets of seconds 5 and 6 are now-stale seconds 0 and 1.
    assert_eq!(
        buckets.window_average(now + secs(6)),
        (15.0 - 1.0 - 2.0) / 5.0
    );
    // A long hole.
    assert_eq!(buckets.window_average(now + secs(10)), 0.0);
    // A write after a hole.
    buckets.record(now + secs(6), 91);
    assert_eq!(
        buckets.window_average(now + secs(6)),
        (15.0 - 1.0 - 2.0 + 91.0) / 5.0
    );
    // Much later: the ring starts again.
    let now = now + secs(60);
    buckets.record(now, 1984);
    assert_eq!(buckets.window_average(now), 1984.0);
    // An earlier time within the window.
    buckets.record(now - secs(3), 4);
    assert_eq!(buckets.window_average(now), (4.0 + 1984.0) / 4.0);
    let now = now + SECOND;
    buckets.record(now, 5);
    assert_eq!(buckets.window_average(now), (4.0 + 1984.0 + 5.0) / 5.0);
    buckets.record(now - secs(3), 10);
    assert_eq!(
        buckets.window_average(now),
        (4.0 + 10.0 + 1984.0 + 5.0) / 5.0
    );
    // Too early, and exactly a window early: ignored.
    buckets.record(now - secs(6), 10);
    buckets.record(now - secs(5), 10);
    assert_eq!(
        buckets.window_average(now),
        (4.0 + 10.0 + 1984.0 + 5.0) / 5.0
    );
    // Exactly a window without data clears it.
    buckets.record(now + secs(5), 10);
    assert_eq!(buckets.window_average(now + secs(5)), 10.0);
}

#[test]
fn writes_in_descending_time_average_as_ascending_ones() {
    let now = unaligned();
    let mut buckets = RequestBuckets::new(secs(5), SECOND).unwrap();
    for i in (0..=8).rev() {
        buckets.record(now + secs(i), 5);
    }
    assert_eq!(buckets.window_average(now + secs(5)), 5.0);
}

#[test]
fn a_sudden_stop_decays_to_zero_bucket_by_bucket() {
    // 2024-06-26 12:00:00 UTC, whose Unix seconds are a multiple of 5: bucket 0.
    let now = Duration::from_secs(1_719_403_200);
    let mut buckets = RequestBuckets::new(secs(5), SECOND).unwrap();
    assert_eq!(buckets.buckets(), [0, 0, 0, 0, 0]);
    assert_eq!(buckets.window_average(now), 0.0);
    let steps: &[(u64, i64, f64, [i64; 5])] = &[
        (0, 1, 1.0, [1, 0, 0, 0, 0]),
        (1, 2, 1.5, [1, 2, 0, 0, 0]),
        (2, 3, 2.0, [1, 2, 3, 0, 0]),
        (3, 4, 2.5, [1, 2, 3, 4, 0]),
        (4, 5, 3.0, [1, 2, 3, 4, 5]),
    ];
    for (at, value, average, contents) in steps {
        buckets.record(now + secs(*at), *value);
        assert_eq!(buckets.window_average(now + secs(*at)), *average, "{at}");
        assert_eq!(buckets.buckets(), contents, "{at}");
    }
    // Quiet seconds lower the average; the buckets change only at the next write.
    assert_eq!(buckets.window_average(now + secs(5)), 2.8);
    assert_eq!(buckets.window_average(now + secs(6)), 2.4);
    assert_eq!(buckets.buckets(), [1, 2, 3, 4, 5]);
    let steps: &[(u64, i64, f64, [i64; 5])] = &[
        (7, 8, 3.4, [0, 0, 8, 4, 5]),
        (8, 9, 4.4, [0, 0, 8, 9, 5]),
        (9, 10, 5.4, [0, 0, 8, 9, 10]),
        (10, 11, 7.6, [11, 0, 8, 9, 10]),
        (11, 12, 10.0, [11, 12, 8, 9, 10]),
    ];
    for (at, value, average, contents) in steps {
        buckets.record(now + secs(*at), *value);
        assert_eq!(buckets.window_average(now + secs(*at)), *average, "{at}");
        assert_eq!(buckets.buckets(), contents, "{at}");
    }
    for (at, average) in [(12, 8.4), (13, 6.6), (14, 4.6), (15, 2.4), (16, 0.0)] {
        assert_eq!(buckets.window_average(now + secs(at)), average, "{at}");
    }
    // A request after the average reached 0 starts the window again.
    buckets.record(now + secs(17), 1);
    assert_eq!(buckets.window_average(now + secs(17)), 1.0);
    assert_eq!(buckets.buckets(), [0, 0, 1, 0, 0]);
}

#[test]
fn a_write_after_a_hole_clears_the_buckets_it_skipped() {
    let now = unaligned();
    let mut buckets = RequestBuckets::new(secs(5), SECOND).unwrap();
    for i in 0..5 {
        buckets.record(now + secs(i), i as i64 + 1);
    }
    assert_eq!(buckets.buckets().iter().sum::<i64>(), 15);
    assert_eq!(buckets.window_average(now + secs(4)), 3.0);
    // The write at second 8 clears the buckets of seconds 5 to 8 (those of seconds 0 to 3):
    // second 4's 5 and the new 2 are left.
    buckets.record(now + secs(8), 2);
    assert_eq!(buckets.buckets().iter().sum::<i64>(), 5 + 2);
}

#[test]
fn a_coarser_granularity_sums_a_buckets_writes() {
    let start = Duration::from_secs(1_719_403_200);
    let mut buckets = RequestBuckets::new(secs(120), secs(5)).unwrap();
    buckets.record(start, 1);
    buckets.record(start + secs(3), 11);
    buckets.record(start + secs(6), 1);
    assert_eq!(buckets.buckets().len(), 24);
    assert_eq!(buckets.buckets().iter().sum::<i64>(), 13);
    assert_eq!(buckets.window_average(start + secs(6)), 13.0 / 2.0);
    assert!(!buckets.is_empty(start + secs(6)));
    assert!(buckets.is_empty(start + secs(6 + 125)));
    assert!(RequestBuckets::new(secs(60), SECOND)
        .unwrap()
        .is_empty(start));
}

#[test]
fn windows_and_granularities_that_make_no_buckets_are_refused() {
    assert_eq!(
        RequestBuckets::new(secs(60), Duration::from_millis(500)).unwrap_err(),
        BucketsError::GranularityUnderOneSecond(Duration::from_millis(500))
    );
    assert_eq!(
        RequestBuckets::new(Duration::ZERO, SECOND).unwrap_err(),
        BucketsError::WindowTooShort {
            window: Duration::ZERO,
            granularity: SECOND
        }
    );
    // Rounded up, as the add-on: 7 s of 2 s buckets is 4 of them.
    assert_eq!(
        RequestBuckets::new(secs(7), secs(2))
            .unwrap()
            .buckets()
            .len(),
        4
    );
}

#[test]
fn averages_keep_three_digits_halves_away_from_zero() {
    assert_eq!(round_to(6, 3.6e-17), 0.0);
    assert_eq!(round_to(3, -3.6e-17), 0.0);
    assert_eq!(round_to(3, 0.0004), 0.0);
    assert_eq!(round_to(3, 1.2345), 1.235);
    assert_eq!(round_to(4, 1.2345), 1.2345);
    assert_eq!(round_to(6, 12345.0), 12345.0);
    let mut buckets = RequestBuckets::new(secs(3), SECOND).unwrap();
    let now = Duration::from_secs(1_719_403_200);
    buckets.record(now, 1);
    buckets.record(now + secs(1), 0);
    buckets.record(now + secs(2), 0);
    assert_eq!(buckets.window_average(now + secs(2)), 0.333);
}
