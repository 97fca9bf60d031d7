//! How long a failed watch waits before it tries again: short, so that a watch is back within
//! about a second of the API server answering again.
//!
//! kube-rs's default (client-go's reflector backoff: 0.8 s doubling to 30 s, reset only after
//! 120 s without a failure) grows over the refusals of an API server that is restarting, so a
//! watch came back up to 30 s after the server did, and missed every change made meanwhile
//! (the Go activator, on client-go, took 20–66 s). Here the delay doubles from
//! [`WATCH_BACKOFF_INITIAL`] to at most [`WATCH_BACKOFF_MAX`], each delay drawn from its upper
//! half (jitter, so that many activators do not retry in step), and it starts over at the
//! first event a watch delivers (kube-rs's `StreamBackoff` resets it on every `Ok`). Five
//! watches retrying once a second each is little load even for a struggling server.

use std::time::Duration;

use kube::runtime::utils::Backoff;

/// The first delay after a watch fails.
pub const WATCH_BACKOFF_INITIAL: Duration = Duration::from_millis(200);
/// The longest delay: a watch is back at most this long after the server answers again.
pub const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The watches' backoff: [`WATCH_BACKOFF_INITIAL`] doubling to [`WATCH_BACKOFF_MAX`], each
/// delay `d` drawn uniformly from `[d/2, d]`.
#[derive(Clone, Debug)]
pub struct WatchBackoff {
    /// The next delay before jitter.
    next: Duration,
    /// xorshift64 state for the jitter (never zero).
    rng: u64,
}

impl WatchBackoff {
    /// A backoff whose jitter starts from `seed` (any value; tests pass a fixed one).
    pub fn with_seed(seed: u64) -> WatchBackoff {
        WatchBackoff {
            next: WATCH_BACKOFF_INITIAL,
            // xorshift stays at zero forever; any other start works.
            rng: seed | 1,
        }
    }

    /// A backoff seeded from the clock and a counter, so that the watches of one process (and
    /// of activators started together) draw different delays.
    pub fn new() -> WatchBackoff {
        use std::sync::atomic::{AtomicU64, Ordering};
        static CREATED: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64);
        let count = CREATED.fetch_add(1, Ordering::Relaxed);
        WatchBackoff::with_seed(nanos ^ count.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// A number in [0, 1).
    fn unit(&mut self) -> f64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        // The top 53 bits fill an f64's mantissa exactly.
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Default for WatchBackoff {
    fn default() -> WatchBackoff {
        WatchBackoff::new()
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    /// Never ends: a watch is retried for as long as the process runs.
    fn next(&mut self) -> Option<Duration> {
        let full = self.next;
        self.next = (full * 2).min(WATCH_BACKOFF_MAX);
        Some(full.mul_f64(0.5 + 0.5 * self.unit()))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_BACKOFF_INITIAL;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_to_a_second_each_within_its_upper_half_and_start_over_on_reset() {
        for seed in [0, 1, 42, u64::MAX, 0xdead_beef] {
            let mut backoff = WatchBackoff::with_seed(seed);
            let full = [200, 400, 800, 1000, 1000, 1000, 1000, 1000];
            for (step, &millis) in full.iter().enumerate() {
                let full = Duration::from_millis(millis);
                let delay = backoff.next().expect("never ends");
                assert!(
                    delay >= full / 2 && delay <= full,
                    "seed {seed}, step {step}: {delay:?} outside [{:?}, {full:?}]",
                    full / 2
                );
            }
            // However long the outage, never more than the cap.
            for _ in 0..10_000 {
                assert!(backoff.next().unwrap() <= WATCH_BACKOFF_MAX);
            }
            backoff.reset();
            assert!(backoff.next().unwrap() <= WATCH_BACKOFF_INITIAL);
        }
    }

    #[test]
    fn the_jitter_spreads_delays_over_the_upper_half() {
        let mut backoff = WatchBackoff::with_seed(7);
        let delays: Vec<Duration> = (0..1_000)
            .map(|_| {
                backoff.reset();
                backoff.next().unwrap()
            })
            .collect();
        let (least, most) = (delays.iter().min().unwrap(), delays.iter().max().unwrap());
        assert!(*least < Duration::from_millis(110), "{least:?}");
        assert!(*most > Duration::from_millis(190), "{most:?}");
        // Two watches created together do not retry in step.
        let (mut a, mut b) = (WatchBackoff::new(), WatchBackoff::new());
        let a: Vec<Duration> = (0..5).map(|_| a.next().unwrap()).collect();
        let b: Vec<Duration> = (0..5).map(|_| b.next().unwrap()).collect();
        assert_ne!(a, b);
    }
}
