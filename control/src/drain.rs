//! How long a draining process keeps serving before it closes its listeners. Pure: the clock
//! and the count of arrivals are passed in.
//!
//! The activator serves for a fixed grace period (`proxy.drain_grace_seconds`). The
//! queue-proxy serves until a quiet period has passed with no new request, as upstream's
//! drainer does (`knative.dev/pkg/network/handlers/drain.go`: every request that arrives while
//! draining re-arms the timer to the full period; `reference/queue-proxy.md` §6): while endpoint
//! removal lags (a slow controller, an activator that has not yet seen the pod go), traffic
//! still comes, and closing under it would answer it with connection errors.

use std::time::{Duration, Instant};

/// Where the process is in its drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainPhase {
    Serving,
    /// SIGTERM came: readiness fails, requests are still served for the grace period.
    Draining,
    /// The grace period is over: the listeners close and in-flight requests finish.
    Drained,
}

/// Which rule ends a role's grace period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainRule {
    /// A fixed period from the signal (the activator).
    Grace,
    /// A period with no new request: each arrival re-arms it (the queue-proxy).
    QuietPeriod,
}

/// How often the count of arrivals is read while a quiet period runs: a request that arrives
/// re-arms the period at most this much later than upstream's timer would.
pub const ARRIVALS_READ_EVERY: Duration = Duration::from_millis(100);

/// A quiet period under way.
#[derive(Clone, Debug)]
pub struct QuietPeriod {
    period: Duration,
    /// The count of arrivals last read.
    seen: u64,
    ends: Instant,
}

impl QuietPeriod {
    /// Starts at `now`, when `arrivals` requests have arrived so far.
    pub fn start(period: Duration, now: Instant, arrivals: u64) -> QuietPeriod {
        QuietPeriod {
            period,
            seen: arrivals,
            ends: now + period,
        }
    }

    /// Reads the count of arrivals at `now`: `None` once a whole period has passed with none,
    /// else when to read again. A request seen now re-arms the full period from now.
    pub fn observe(&mut self, now: Instant, arrivals: u64) -> Option<Instant> {
        if arrivals != self.seen {
            self.seen = arrivals;
            self.ends = now + self.period;
        }
        if now >= self.ends {
            return None;
        }
        Some(self.ends.min(now + ARRIVALS_READ_EVERY))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a quiet period of 1 s on simulated time: `arrivals_at(t)` is the count at
    /// `t` ms. Returns when it ended, in ms from the start.
    fn ends_at(arrivals_at: impl Fn(u64) -> u64) -> u64 {
        let start = Instant::now();
        let mut quiet = QuietPeriod::start(Duration::from_secs(1), start, arrivals_at(0));
        let mut now = start;
        loop {
            let ms = (now - start).as_millis() as u64;
            match quiet.observe(now, arrivals_at(ms)) {
                None => return ms,
                Some(next) => {
                    assert!(next > now, "it always moves on");
                    now = next;
                }
            }
        }
    }

    #[test]
    fn without_arrivals_it_ends_after_one_period() {
        assert_eq!(ends_at(|_| 7), 1_000);
    }

    #[test]
    fn each_arrival_re_arms_the_whole_period() {
        // A request every 300 ms until 2.5 s: it ends a period after the last one was seen.
        let ended = ends_at(|ms| ms.min(2_500) / 300);
        assert_eq!(ended, 2_400 + 1_000);
        // Upstream's timer re-arms at the arrival itself; here at the next read, at most
        // `ARRIVALS_READ_EVERY` later.
        let last_arrival = 2_400;
        assert!(ended - (last_arrival + 1_000) <= ARRIVALS_READ_EVERY.as_millis() as u64);
    }

    #[test]
    fn traffic_that_never_stops_keeps_it_serving() {
        let start = Instant::now();
        let mut quiet = QuietPeriod::start(Duration::from_secs(1), start, 0);
        for step in 1..=600u64 {
            // One request every read, for a minute.
            let now = start + ARRIVALS_READ_EVERY * step as u32;
            assert!(quiet.observe(now, step).is_some(), "ended at {step}");
        }
    }
}
