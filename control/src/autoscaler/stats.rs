//! The reporter's accounting, sans-IO: from the revisions' load (summed over shards, read at a
//! given time) to the stats the autoscaler receives, with upstream's semantics
//! (`concurrency_reporter.go`, `reference/knative-activator.md` §5.3).
//!
//! * A revision's first request while the reporter has no entry for it is a **poke**: `{1, 1}`
//!   at once, and an entry whose window starts there.
//! * Every tick (one second) each entry reports its window: the time-weighted average of the
//!   requests in flight (queued in the activator included) and the arrivals. The first window
//!   after a poke subtracts the poked request from both, since the poke already counted it.
//! * An entry whose window averaged zero, with nothing in flight, is deleted after reporting
//!   that zero; the revision's next request pokes again.
//!
//! The load comes as cumulative totals ([`Totals`]: arrivals and the integral of requests in
//! flight over time), so one tick costs a read per revision and shard, not an event per request.

use std::collections::BTreeMap;

use kactivator_api::RevisionKey;

/// One revision's load, summed over the shards, at one instant: cumulative since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub arrivals: u64,
    pub in_flight: u64,
    /// ∑ requests in flight × time, in request-microseconds, up to the instant of the read.
    pub integral: u64,
}

impl std::ops::AddAssign for Totals {
    fn add_assign(&mut self, other: Totals) {
        self.arrivals = self.arrivals.wrapping_add(other.arrivals);
        self.in_flight += other.in_flight;
        self.integral = self.integral.wrapping_add(other.integral);
    }
}

/// One revision's stat, as it goes to the autoscaler.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub revision: RevisionKey,
    pub average_concurrency: f64,
    pub request_count: f64,
}

/// What one tick produced.
#[derive(Debug, Default, PartialEq)]
pub struct Tick {
    /// Every entry's stat, in one batch.
    pub reports: Vec<Report>,
    /// Entries deleted this tick: their revisions' next request pokes again.
    pub deleted: Vec<RevisionKey>,
}

struct Entry {
    /// The poked request is still to be subtracted from the first window.
    first_request: bool,
    /// The totals at the start of the current window.
    baseline: Totals,
    window_start_us: u64,
}

/// The reporter's entries.
#[derive(Default)]
pub struct Stats {
    entries: BTreeMap<RevisionKey, Entry>,
}

impl Stats {
    pub fn has_entry(&self, revision: &RevisionKey) -> bool {
        self.entries.contains_key(revision)
    }

    /// A shard saw `revision`'s first request, at `at_us`, while it had no entry. `before` is
    /// the revision's load just before that request. Returns the immediate stat, or `None`
    /// when an entry exists already (another shard poked first).
    pub fn poke(&mut self, revision: &RevisionKey, before: Totals, at_us: u64) -> Option<Report> {
        if self.entries.contains_key(revision) {
            return None;
        }
        self.entries.insert(
            revision.clone(),
            Entry {
                // The poked request is in the first window: the first tick subtracts it.
                first_request: true,
                baseline: before,
                window_start_us: at_us,
            },
        );
        Some(Report {
            revision: revision.clone(),
            average_concurrency: 1.0,
            request_count: 1.0,
        })
    }

    /// Takes `less` off the start of `revision`'s current window: load the window's baseline
    /// counted that belongs in it. (A shard whose first request raced the poke of another: its
    /// own poke, processed later, says what its load was before that request.)
    pub fn lower_baseline(&mut self, revision: &RevisionKey, less: Totals) {
        if let Some(entry) = self.entries.get_mut(revision) {
            entry.baseline.arrivals = entry.baseline.arrivals.wrapping_sub(less.arrivals);
            entry.baseline.integral = entry.baseline.integral.wrapping_sub(less.integral);
        }
    }

    /// Closes every entry's window at `now_us`; `totals_of` reads a revision's totals then.
    pub fn tick(&mut self, now_us: u64, mut totals_of: impl FnMut(&RevisionKey) -> Totals) -> Tick {
        let mut tick = Tick::default();
        for (revision, entry) in &mut self.entries {
            let totals = totals_of(revision);
            let elapsed = now_us.saturating_sub(entry.window_start_us);
            let average = if elapsed == 0 {
                0.0
            } else {
                totals.integral.wrapping_sub(entry.baseline.integral) as f64 / elapsed as f64
            };
            let arrivals = totals.arrivals.wrapping_sub(entry.baseline.arrivals) as f64;
            let first = if entry.first_request { 1.0 } else { 0.0 };
            tick.reports.push(Report {
                revision: revision.clone(),
                average_concurrency: (average - first).max(0.0),
                request_count: arrivals - first,
            });
            entry.first_request = false;
            entry.baseline = totals;
            entry.window_start_us = now_us;
            if average == 0.0 && totals.in_flight == 0 {
                tick.deleted.push(revision.clone());
            }
        }
        for revision in &tick.deleted {
            self.entries.remove(revision);
        }
        tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kactivator_shards::metrics::{Load, LoadSnapshot};

    fn key(name: &str) -> RevisionKey {
        RevisionKey::new("ns", name).unwrap()
    }

    fn ms(milliseconds: u64) -> u64 {
        milliseconds * 1_000
    }

    fn totals(snapshot: LoadSnapshot) -> Totals {
        Totals {
            arrivals: snapshot.arrivals,
            in_flight: snapshot.in_flight,
            integral: snapshot.integral,
        }
    }

    /// One revision on one shard, as the shell drives it: an arrival pokes while there is no
    /// entry; ticks read the shard's load.
    struct Rig {
        stats: Stats,
        load: Load,
        sent: Vec<(f64, f64)>,
    }

    impl Rig {
        fn new() -> Rig {
            Rig {
                stats: Stats::default(),
                load: Load::default(),
                sent: Vec::new(),
            }
        }

        fn start(&mut self, at: u64) {
            let before = totals(self.load.read(ms(at)));
            self.load.arrive(ms(at));
            if !self.stats.has_entry(&key("r")) {
                let poke = self.stats.poke(&key("r"), before, ms(at)).unwrap();
                self.sent
                    .push((poke.average_concurrency, poke.request_count));
            }
        }

        fn end(&mut self, at: u64) {
            self.load.depart(ms(at));
        }

        fn tick(&mut self, at: u64) -> Vec<RevisionKey> {
            let load = &self.load;
            let tick = self.stats.tick(ms(at), |_| totals(load.read(ms(at))));
            for report in tick.reports {
                self.sent
                    .push((report.average_concurrency, report.request_count));
            }
            tick.deleted
        }
    }

    // The sequences of upstream's TestStats (concurrency_reporter_test.go), times in ms.

    #[test]
    fn the_first_request_of_each_revision_is_reported_at_once() {
        let mut stats = Stats::default();
        for name in ["rev1", "rev2"] {
            let poke = stats.poke(&key(name), Totals::default(), 0).unwrap();
            assert_eq!((poke.average_concurrency, poke.request_count), (1.0, 1.0));
        }
        assert_eq!(
            stats.poke(&key("rev1"), Totals::default(), 0),
            None,
            "an entry exists"
        );
    }

    #[test]
    fn two_sequential_requests_then_a_tick() {
        let mut rig = Rig::new();
        rig.start(0);
        rig.end(1);
        rig.start(1);
        rig.end(2);
        rig.tick(2);
        assert_eq!(rig.sent, [(1.0, 1.0), (0.0, 1.0)]);
    }

    #[test]
    fn two_requests_in_flight_over_two_ticks() {
        let mut rig = Rig::new();
        rig.start(0);
        rig.start(0);
        rig.tick(1);
        rig.tick(2);
        assert_eq!(rig.sent, [(1.0, 1.0), (1.0, 1.0), (2.0, 0.0)]);
    }

    #[test]
    fn an_idle_entry_reports_zero_then_goes_and_the_next_request_pokes_again() {
        let mut rig = Rig::new();
        rig.start(0);
        rig.end(1);
        assert!(rig.tick(1).is_empty(), "averaged 1: kept");
        assert_eq!(
            rig.tick(2),
            [key("r")],
            "averaged 0 with nothing in flight: deleted"
        );
        rig.start(3);
        assert_eq!(rig.sent, [(1.0, 1.0), (0.0, 0.0), (0.0, 0.0), (1.0, 1.0)]);
    }

    #[test]
    fn interleaved_requests_average_over_the_window() {
        let mut rig = Rig::new();
        rig.start(0);
        rig.start(0);
        rig.end(1);
        rig.end(2);
        rig.tick(2);
        assert_eq!(rig.sent, [(1.0, 1.0), (0.5, 1.0)]);
    }

    #[test]
    fn an_entry_with_requests_in_flight_is_kept_even_when_its_window_averaged_zero() {
        let mut stats = Stats::default();
        let busy = Totals {
            arrivals: 1,
            in_flight: 1,
            integral: 0,
        };
        stats.poke(&key("r"), Totals::default(), ms(5)).unwrap();
        // A window of no time at all averages zero; the request is still in flight.
        let tick = stats.tick(ms(5), |_| busy);
        assert!(tick.deleted.is_empty());
        assert!(stats.has_entry(&key("r")));
    }

    #[test]
    fn a_shard_whose_first_request_raced_another_shards_poke_counts_in_full() {
        let mut stats = Stats::default();
        let shards = [Load::default(), Load::default()];
        // Shard 0's first request pokes; before that poke is handled, shard 1 has one too.
        let before_0 = totals(shards[0].read(0));
        shards[0].arrive(0);
        let before_1 = totals(shards[1].read(ms(1)));
        shards[1].arrive(ms(1));
        // Handling shard 0's poke reads shard 1 as it is now: its request is in the baseline.
        let mut baseline = before_0;
        baseline += totals(shards[1].read(0));
        stats.poke(&key("r"), baseline, 0).unwrap();
        // Shard 1's own poke comes next: its load before its request, less what was counted.
        let counted = totals(shards[1].read(0));
        stats.lower_baseline(
            &key("r"),
            Totals {
                arrivals: counted.arrivals - before_1.arrivals,
                in_flight: 0,
                integral: counted.integral - before_1.integral,
            },
        );
        let tick = stats.tick(ms(1_000), |_| {
            let mut sum = totals(shards[0].read(ms(1_000)));
            sum += totals(shards[1].read(ms(1_000)));
            sum
        });
        assert_eq!(
            tick.reports[0].request_count, 1.0,
            "both arrivals, less the poked one"
        );
    }

    #[test]
    fn every_shard_counts_in_one_report_per_revision() {
        let mut stats = Stats::default();
        let shards = [Load::default(), Load::default()];
        let read = |at: u64| {
            let mut sum = Totals::default();
            for shard in &shards {
                sum += totals(shard.read(at));
            }
            sum
        };
        let before = read(0);
        shards[0].arrive(0);
        stats.poke(&key("r"), before, 0).unwrap();
        // The other shard's first request finds the entry: no second poke.
        let before = read(0);
        shards[1].arrive(0);
        assert_eq!(stats.poke(&key("r"), before, 0), None);
        shards[1].arrive(ms(500));
        let tick = stats.tick(ms(1_000), |_| read(ms(1_000)));
        assert_eq!(
            tick.reports,
            [Report {
                revision: key("r"),
                // 2 in flight for 1 s and 1 more for 0.5 s, less the poked request.
                average_concurrency: 1.5,
                request_count: 2.0,
            }]
        );
    }
}
