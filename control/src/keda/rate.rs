//! A route's request rate as KEDA's HTTP add-on computes it (`pkg/queue/bucketing.go` at
//! v0.15.0, itself Knative's autoscaler bucketing): the requests counted in each `granularity`
//! of a ring of buckets spanning `window`, averaged over the buckets that hold data. The value
//! is per bucket, which is requests per second only when the granularity is one second (the
//! add-on's default); kept so, since KEDA's targets were written against it.
//!
//! Pure: the wall-clock time is passed in, as a [`Duration`] since the Unix epoch (the add-on
//! indexes its buckets by Unix seconds).

use std::time::Duration;

#[cfg(test)]
mod tests;

/// Digits after the point a window average keeps (the add-on's `precision`).
const PRECISION: i32 = 3;

/// Why a window or granularity cannot make buckets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BucketsError {
    /// Below one second: the add-on indexes buckets by whole seconds of granularity (Go divides
    /// by zero there).
    GranularityUnderOneSecond(Duration),
    /// A window shorter than its granularity, or zero.
    WindowTooShort {
        window: Duration,
        granularity: Duration,
    },
}

/// Request counts in a ring of buckets (`RequestsBuckets`).
#[derive(Clone, Debug)]
pub struct RequestBuckets {
    /// Indexed by [`Self::index`] modulo their number.
    buckets: Vec<i64>,
    /// The first write's bucket, since the ring last started empty.
    first_write: Option<Duration>,
    /// The latest bucket written; `None` before the first write (Go's zero time: older than
    /// any window).
    last_write: Option<Duration>,
    granularity: Duration,
    window: Duration,
    /// The sum of every bucket, stale ones included until they are cleared.
    window_total: i64,
}

impl RequestBuckets {
    /// `window / granularity` buckets, rounded up.
    pub fn new(window: Duration, granularity: Duration) -> Result<RequestBuckets, BucketsError> {
        if granularity < Duration::from_secs(1) {
            return Err(BucketsError::GranularityUnderOneSecond(granularity));
        }
        if window < granularity {
            return Err(BucketsError::WindowTooShort {
                window,
                granularity,
            });
        }
        let count = window.as_nanos().div_ceil(granularity.as_nanos());
        Ok(RequestBuckets {
            buckets: vec![0; usize::try_from(count).unwrap_or(usize::MAX).min(1 << 20)],
            first_write: None,
            last_write: None,
            granularity,
            window,
            window_total: 0,
        })
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    pub fn granularity(&self) -> Duration {
        self.granularity
    }

    /// `time` down to a multiple of the granularity (Go's `Time.Truncate`).
    fn truncate(&self, time: Duration) -> Duration {
        let granularity = self.granularity.as_nanos();
        Duration::from_nanos(
            u64::try_from(time.as_nanos() / granularity * granularity).unwrap_or(u64::MAX),
        )
    }

    /// The bucket number of `time`: whole Unix seconds over whole seconds of granularity.
    fn index(&self, time: Duration) -> u64 {
        time.as_secs() / self.granularity.as_secs()
    }

    fn slot(&self, index: u64) -> usize {
        (index % self.buckets.len() as u64) as usize
    }

    /// Adds `value` to the bucket of `now`. Buckets skipped since the last write are cleared
    /// first; after a whole window without a write the ring starts again empty. A write older
    /// than the window is ignored.
    pub fn record(&mut self, now: Duration, value: i64) {
        let bucket_time = self.truncate(now);
        let write = self.index(now);
        if self.last_write != Some(bucket_time) {
            let within = self
                .last_write
                .is_none_or(|last| bucket_time + self.window > last);
            if !within {
                return;
            }
            if self.first_write.is_none_or(|first| first > bucket_time) {
                self.first_write = Some(bucket_time);
            }
            if self.last_write.is_none_or(|last| bucket_time > last) {
                match self.last_write {
                    Some(last) if bucket_time - last < self.window => {
                        for index in self.index(last) + 1..=write {
                            let slot = self.slot(index);
                            self.window_total -= self.buckets[slot];
                            self.buckets[slot] = 0;
                        }
                    }
                    _ => {
                        self.first_write = Some(bucket_time);
                        self.buckets.fill(0);
                        self.window_total = 0;
                    }
                }
                self.last_write = Some(bucket_time);
            }
        }
        let slot = self.slot(write);
        self.buckets[slot] += value;
        self.window_total += value;
    }

    /// The average bucket over the window at `now`: over the buckets since the first write
    /// while that is less than a window ago, less the buckets that have gone quiet since the
    /// last write; 0 once a whole window passed without one.
    pub fn window_average(&self, now: Duration) -> f64 {
        let now = self.truncate(now);
        let (Some(last), Some(first)) = (self.last_write, self.first_write) else {
            return 0.0;
        };
        let used =
            ((last.saturating_sub(first)).as_nanos() / self.granularity.as_nanos()) as f64 + 1.0;
        let buckets = used.min(self.buckets.len() as f64);
        if now <= last {
            return round(self.window_total as f64 / buckets);
        }
        if now - last < self.window {
            let mut total = self.window_total;
            for index in self.index(last) + 1..=self.index(now) {
                total -= self.buckets[self.slot(index)];
            }
            return round(total as f64 / buckets);
        }
        0.0
    }

    /// Whether nothing was written for more than a window before `now`.
    pub fn is_empty(&self, now: Duration) -> bool {
        let now = self.truncate(now);
        self.last_write
            .is_none_or(|last| now.saturating_sub(last) > self.window)
    }

    #[cfg(test)]
    fn buckets(&self) -> &[i64] {
        &self.buckets
    }
}

/// `value` rounded to [`PRECISION`] digits after the point, halves away from zero (Go's
/// `math.Round`).
fn round(value: f64) -> f64 {
    round_to(PRECISION, value)
}

fn round_to(digits: i32, value: f64) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}
