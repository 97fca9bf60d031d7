//! The queue-proxy's autoscaler stat, sans-IO: from the pod's load (all requests and those an
//! activator sent, cumulative, read at a given time) to the `Stat` Knative's autoscaler scrapes
//! from `:9090/metrics`, with upstream's semantics (release-1.18 `RequestStats` in
//! knative.dev/networking `pkg/http/stats/request.go`, `pkg/queue/protobuf_stats_reporter.go`;
//! `reference/queue-proxy.md` §5).
//!
//! * The stat is remade every [`REPORTING_PERIOD`] (a ticker, as upstream's `main.go`), not at
//!   each scrape: a scrape reads the last window; two scrapes within a period read the same
//!   stat, and a scrape before the first window reads only the pod name.
//! * A window's concurrency is the time-weighted average of the requests in flight over it, the
//!   proxied ones apart; its counts are the requests that arrived in it, divided by the period
//!   in seconds (a rate). The load carries over from one window to the next.
//! * `process_uptime` is the seconds since the reporter started; `timestamp` is never set.
//!
//! The load comes as the activator reporter's cumulative [`Totals`], so a window costs a read
//! per shard, not an event per request.

use std::time::Duration;

use kactivator_api::autoscaler::Stat;

use crate::autoscaler::stats::Totals;

/// How often the stat is remade (upstream's `reportingPeriod`, 1 s), and what its counts are
/// divided by.
pub const REPORTING_PERIOD: Duration = Duration::from_secs(1);

/// The pod's load at one instant, summed over the shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodTotals {
    /// Every request, proxied ones included.
    pub all: Totals,
    /// Requests that came through an activator (`K-Proxy-Request: activator`).
    pub proxied: Totals,
}

/// One window's figures (upstream's `RequestStatsReport`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WindowReport {
    pub average_concurrency: f64,
    pub average_proxied_concurrency: f64,
    /// Arrivals in the window.
    pub request_count: f64,
    pub proxied_request_count: f64,
}

/// The windows, one after another.
#[derive(Debug)]
pub struct RequestStats {
    started_us: u64,
    /// The totals at the start of the current window.
    baseline: PodTotals,
    window_start_us: u64,
}

impl RequestStats {
    /// The first window starts at `now_us`, with the load as it is then.
    pub fn new(now_us: u64, totals: PodTotals) -> RequestStats {
        RequestStats {
            started_us: now_us,
            baseline: totals,
            window_start_us: now_us,
        }
    }

    /// Closes the current window at `now_us` (`totals`: the load read then) and opens the
    /// next one.
    pub fn report(&mut self, now_us: u64, totals: PodTotals) -> WindowReport {
        // A clock read a little behind the window's start measures no time, never negative time.
        let elapsed = now_us.saturating_sub(self.window_start_us);
        let average = |now: &Totals, then: &Totals| {
            if elapsed == 0 {
                0.0
            } else {
                now.integral.wrapping_sub(then.integral) as f64 / elapsed as f64
            }
        };
        let arrivals =
            |now: &Totals, then: &Totals| now.arrivals.wrapping_sub(then.arrivals) as f64;
        let report = WindowReport {
            average_concurrency: average(&totals.all, &self.baseline.all),
            average_proxied_concurrency: average(&totals.proxied, &self.baseline.proxied),
            request_count: arrivals(&totals.all, &self.baseline.all),
            proxied_request_count: arrivals(&totals.proxied, &self.baseline.proxied),
        };
        // The integrals only grow: a read behind the window's start must not move its baseline
        // back (that time would count twice in the next window).
        let keep_later = |now: Totals, then: Totals| Totals {
            integral: now.integral.max(then.integral),
            ..now
        };
        self.baseline = PodTotals {
            all: keep_later(totals.all, self.baseline.all),
            proxied: keep_later(totals.proxied, self.baseline.proxied),
        };
        self.window_start_us = self.window_start_us.max(now_us);
        report
    }

    /// Seconds since the reporter started, at `now_us`.
    pub fn uptime_seconds(&self, now_us: u64) -> f64 {
        now_us.saturating_sub(self.started_us) as f64 / 1e6
    }
}

/// The stat a scrape returns: `report` of the last window, its counts turned into rates over
/// `period`; `None` before the first window closed (only the pod name).
pub fn stat(
    pod_name: &str,
    uptime_seconds: f64,
    report: Option<WindowReport>,
    period: Duration,
) -> Stat {
    let Some(report) = report else {
        return Stat {
            pod_name: pod_name.to_string(),
            ..Stat::default()
        };
    };
    let seconds = period.as_secs_f64();
    Stat {
        pod_name: pod_name.to_string(),
        average_concurrent_requests: report.average_concurrency,
        average_proxied_concurrent_requests: report.average_proxied_concurrency,
        request_count: report.request_count / seconds,
        proxied_request_count: report.proxied_request_count / seconds,
        process_uptime: uptime_seconds,
        // Upstream never sets it: the autoscaler stamps the time of the scrape.
        timestamp: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kactivator_shards::metrics::{Load, LoadSnapshot};

    fn totals(snapshot: LoadSnapshot) -> Totals {
        Totals {
            arrivals: snapshot.arrivals,
            in_flight: snapshot.in_flight,
            integral: snapshot.integral,
        }
    }

    /// A pod's two loads as the tally writes them (a proxied request counts in both), times in
    /// milliseconds from the reporter's start.
    #[derive(Default)]
    struct Pod {
        all: Load,
        proxied: Load,
    }

    #[derive(Clone, Copy)]
    enum Event {
        In(u64),
        Out(u64),
        ProxiedIn(u64),
        ProxiedOut(u64),
        Report(u64),
    }
    use Event::*;

    fn us(ms: u64) -> u64 {
        ms * 1_000
    }

    impl Pod {
        fn read(&self, at_ms: u64) -> PodTotals {
            PodTotals {
                all: totals(self.all.read(us(at_ms))),
                proxied: totals(self.proxied.read(us(at_ms))),
            }
        }

        fn run(&self, events: &[Event]) -> Vec<WindowReport> {
            let mut stats = RequestStats::new(0, self.read(0));
            let mut reports = Vec::new();
            for event in events {
                match *event {
                    In(at) => self.all.arrive(us(at)),
                    Out(at) => self.all.depart(us(at)),
                    ProxiedIn(at) => {
                        self.all.arrive(us(at));
                        self.proxied.arrive(us(at));
                    }
                    ProxiedOut(at) => {
                        self.all.depart(us(at));
                        self.proxied.depart(us(at));
                    }
                    Report(at) => reports.push(stats.report(us(at), self.read(at))),
                }
            }
            reports
        }
    }

    fn plain(average_concurrency: f64, request_count: f64) -> WindowReport {
        WindowReport {
            average_concurrency,
            request_count,
            ..WindowReport::default()
        }
    }

    /// Upstream's `TestRequestStats` (knative.dev/networking `pkg/http/stats/request_test.go`),
    /// case for case.
    #[test]
    fn windows_average_concurrency_over_time_and_count_arrivals_as_upstream() {
        let cases: &[(&str, &[Event], &[WindowReport])] = &[
            ("no requests", &[Report(1000)], &[plain(0.0, 0.0)]),
            (
                "1 request, entire time",
                &[In(0), Out(1000), Report(1000)],
                &[plain(1.0, 1.0)],
            ),
            (
                "1 request, half the time",
                &[In(0), Out(3000), Report(6000)],
                &[plain(0.5, 1.0)],
            ),
            (
                "very short request",
                &[In(0), Out(1), Report(1000)],
                &[plain(1.0 / 1000.0, 1.0)],
            ),
            (
                "3 requests, fill entire time",
                &[
                    In(0),
                    Out(300),
                    In(300),
                    Out(600),
                    In(600),
                    Out(1000),
                    Report(1000),
                ],
                &[plain(1.0, 3.0)],
            ),
            (
                "interleaved requests",
                &[In(0), In(100), Out(600), Out(1000), Report(1000)],
                &[plain(1.5, 2.0)],
            ),
            (
                "request across reporting",
                &[In(0), Report(1000), Out(1500), Report(2000)],
                &[plain(1.0, 1.0), plain(0.5, 0.0)],
            ),
            (
                "request across multiple reportings",
                &[
                    In(0),
                    Report(1000),
                    Report(2000),
                    Report(3000),
                    Out(3500),
                    Report(4000),
                ],
                &[
                    plain(1.0, 1.0),
                    plain(1.0, 0.0),
                    plain(1.0, 0.0),
                    plain(0.5, 0.0),
                ],
            ),
            (
                "1 request, proxied, entire time",
                &[ProxiedIn(0), ProxiedOut(1000), Report(1000)],
                &[WindowReport {
                    average_concurrency: 1.0,
                    average_proxied_concurrency: 1.0,
                    request_count: 1.0,
                    proxied_request_count: 1.0,
                }],
            ),
            (
                "1 request, proxied, half the time",
                &[ProxiedIn(0), ProxiedOut(500), Report(1000)],
                &[WindowReport {
                    average_concurrency: 0.5,
                    average_proxied_concurrency: 0.5,
                    request_count: 1.0,
                    proxied_request_count: 1.0,
                }],
            ),
            (
                "2 requests, proxied and non proxied",
                &[
                    ProxiedIn(0),
                    In(0),
                    ProxiedOut(500),
                    Out(1000),
                    Report(1000),
                ],
                &[WindowReport {
                    average_concurrency: 1.5,
                    average_proxied_concurrency: 0.5,
                    request_count: 2.0,
                    proxied_request_count: 1.0,
                }],
            ),
            (
                "ignore 'negative' requests",
                &[In(500), In(499), Out(1000), Out(999), Report(1000)],
                &[plain(1.0, 2.0)],
            ),
            // Ours: a report whose clock reads behind the window's start measures no time.
            (
                "a late clock reading",
                &[In(0), Report(1000), Report(999), Out(1500), Report(2000)],
                &[plain(1.0, 1.0), plain(0.0, 0.0), plain(0.5, 0.0)],
            ),
        ];
        for (name, events, want) in cases {
            let got = Pod::default().run(events);
            assert_eq!(&got[..], *want, "{name}");
        }
    }

    /// Upstream's `TestProtobufStatsReporterReport` and `TestInitialProtobufStateValid`
    /// (`pkg/queue/protobuf_stats_reporter_test.go`).
    #[test]
    fn the_stat_turns_counts_into_rates_over_the_period_and_starts_with_the_pod_name_only() {
        let pod = "helloworld-go-00001-deployment-8ff587cc9-7g9gc";
        let report = WindowReport {
            average_concurrency: 3.0,
            average_proxied_concurrency: 2.0,
            request_count: 39.0,
            proxied_request_count: 15.0,
        };
        let cases = [
            (
                "no proxy requests",
                1,
                WindowReport {
                    average_concurrency: 3.0,
                    request_count: 39.0,
                    ..WindowReport::default()
                },
                (3.0, 0.0, 39.0, 0.0),
            ),
            ("reportingPeriod=10s", 10, report, (3.0, 2.0, 3.9, 1.5)),
            ("reportingPeriod=2s", 2, report, (3.0, 2.0, 19.5, 7.5)),
            ("reportingPeriod=1s", 1, report, (3.0, 2.0, 39.0, 15.0)),
        ];
        for (name, seconds, report, (average, proxied_average, count, proxied_count)) in cases {
            let got = stat(pod, 5.5, Some(report), Duration::from_secs(seconds));
            assert_eq!(
                got,
                Stat {
                    pod_name: pod.into(),
                    average_concurrent_requests: average,
                    average_proxied_concurrent_requests: proxied_average,
                    request_count: count,
                    proxied_request_count: proxied_count,
                    process_uptime: 5.5,
                    timestamp: 0,
                },
                "{name}"
            );
        }
        assert_eq!(
            stat(pod, 5.5, None, REPORTING_PERIOD),
            Stat {
                pod_name: pod.into(),
                ..Stat::default()
            }
        );
    }

    #[test]
    fn uptime_counts_from_the_reporters_start() {
        let stats = RequestStats::new(us(2_000), PodTotals::default());
        assert_eq!(stats.uptime_seconds(us(7_500)), 5.5);
        assert_eq!(stats.uptime_seconds(0), 0.0, "never negative");
    }
}
