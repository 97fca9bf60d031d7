//! When a request's timers fire, and how long waits are graded. Pure: instants and durations
//! in, instants and verdicts out.

use std::time::Duration;

use monoio::time::Instant;

use crate::routing::Timeouts;

/// When each timer of a request fires. Time spent queued in the activator counts against all
/// of them, as upstream's timeout handler wraps the throttler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// End of the whole request (`timeoutSeconds`).
    pub total: Instant,
    /// Latest time for the first response byte: the earliest of `total`, arrival +
    /// `responseStartTimeoutSeconds` and arrival + `idleTimeoutSeconds` (before any write the
    /// request counts as idle).
    pub first_byte: Instant,
    /// Longest gap between response writes once the response has started.
    pub idle: Option<Duration>,
}

/// How far away "no deadline" is: a deadline past what an `Instant` can hold becomes this,
/// a century on. (Every source bounds revision timeouts far below, see
/// `routing::MAX_TIMEOUT_SECONDS`; this is the request path's own guard, never its rule.)
pub const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// `after` past `at`, saturating: an instant beyond what the clock can represent is "no
/// deadline" ([`NEVER`] from `at`), never a panic.
#[inline]
pub fn later(at: Instant, after: Duration) -> Instant {
    match at.checked_add(after) {
        Some(instant) => instant,
        None => at.checked_add(NEVER).unwrap_or(at),
    }
}

impl Deadlines {
    pub fn new(timeouts: &Timeouts, arrival: Instant) -> Deadlines {
        let total = later(arrival, timeouts.total);
        let mut first_byte = total;
        for limit in [timeouts.response_start, timeouts.idle]
            .into_iter()
            .flatten()
        {
            first_byte = first_byte.min(later(arrival, limit));
        }
        Deadlines {
            total,
            first_byte,
            idle: timeouts.idle,
        }
    }

    /// The deadline of the next read of the response body, made at `now`.
    pub fn next_body_read(&self, now: Instant) -> Instant {
        match self.idle {
            Some(idle) => self.total.min(later(now, idle)),
            None => self.total,
        }
    }
}

/// A wait in the queue at least this long counts as a warning (the fork's threshold).
pub const QUEUE_TIME_WARNING: Duration = Duration::from_secs(4);
/// A wait at least this long counts as an error (the fork's threshold).
pub const QUEUE_TIME_ERROR: Duration = Duration::from_secs(60);
/// A wait at least this long counts as critical (the fork's threshold).
pub const QUEUE_TIME_CRITICAL: Duration = Duration::from_secs(180);

/// Which of the fork's queue-time thresholds a wait reached; each one reached is counted once
/// (`activator_proxy_queue_time_{warning,error,critical}_total`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueTimeLevels {
    pub warning: bool,
    pub error: bool,
    pub critical: bool,
}

impl QueueTimeLevels {
    pub fn of(waited: Duration) -> QueueTimeLevels {
        QueueTimeLevels {
            warning: waited >= QUEUE_TIME_WARNING,
            error: waited >= QUEUE_TIME_ERROR,
            critical: waited >= QUEUE_TIME_CRITICAL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    #[test]
    fn the_first_byte_deadline_is_the_earliest_timer_counted_from_arrival() {
        let arrival = Instant::now();
        let rows: &[(&str, Timeouts, Duration, Duration)] = &[
            (
                "total only",
                Timeouts {
                    total: secs(300),
                    response_start: None,
                    idle: None,
                },
                secs(300),
                secs(300),
            ),
            (
                "response start caps the first byte",
                Timeouts {
                    total: secs(300),
                    response_start: Some(secs(10)),
                    idle: None,
                },
                secs(300),
                secs(10),
            ),
            (
                "idle caps the first byte too",
                Timeouts {
                    total: secs(300),
                    response_start: Some(secs(10)),
                    idle: Some(secs(5)),
                },
                secs(300),
                secs(5),
            ),
            (
                "never later than the total",
                Timeouts {
                    total: secs(3),
                    response_start: Some(secs(10)),
                    idle: Some(secs(5)),
                },
                secs(3),
                secs(3),
            ),
        ];
        for (name, timeouts, total, first_byte) in rows {
            let deadlines = Deadlines::new(timeouts, arrival);
            assert_eq!(deadlines.total, arrival + *total, "{name}");
            assert_eq!(deadlines.first_byte, arrival + *first_byte, "{name}");
        }
    }

    #[test]
    fn a_body_read_waits_at_most_the_idle_gap_and_never_past_the_total() {
        let arrival = Instant::now();
        let idle = Deadlines::new(
            &Timeouts {
                total: secs(60),
                response_start: None,
                idle: Some(secs(5)),
            },
            arrival,
        );
        assert_eq!(idle.next_body_read(arrival + secs(10)), arrival + secs(15));
        assert_eq!(idle.next_body_read(arrival + secs(58)), arrival + secs(60));
        let no_idle = Deadlines::new(&Timeouts::default(), arrival);
        assert_eq!(no_idle.next_body_read(arrival + secs(10)), no_idle.total);
    }

    #[test]
    fn a_timeout_past_what_the_clock_holds_is_no_deadline_not_a_panic() {
        let arrival = Instant::now();
        let huge = Timeouts {
            total: Duration::from_secs(u64::MAX),
            response_start: Some(Duration::MAX),
            idle: Some(Duration::from_secs(u64::MAX)),
        };
        let deadlines = Deadlines::new(&huge, arrival);
        assert!(deadlines.total >= arrival + NEVER);
        assert!(deadlines.first_byte >= arrival + NEVER);
        assert!(deadlines.next_body_read(arrival + secs(5)) >= arrival + NEVER);
        assert_eq!(later(arrival, secs(7)), arrival + secs(7));
    }

    #[test]
    fn each_queue_time_threshold_is_reached_at_its_boundary() {
        let rows = [
            (Duration::ZERO, [false, false, false]),
            (Duration::from_millis(3_999), [false, false, false]),
            (secs(4), [true, false, false]),
            (secs(59), [true, false, false]),
            (secs(60), [true, true, false]),
            (Duration::from_millis(179_999), [true, true, false]),
            (secs(180), [true, true, true]),
            (secs(3_600), [true, true, true]),
        ];
        for (waited, [warning, error, critical]) in rows {
            assert_eq!(
                QueueTimeLevels::of(waited),
                QueueTimeLevels {
                    warning,
                    error,
                    critical
                },
                "{waited:?}"
            );
        }
    }
}
