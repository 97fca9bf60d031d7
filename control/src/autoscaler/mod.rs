//! The autoscaler reporter: how a Knative autoscaler learns that a revision has traffic.
//!
//! Once a second every revision with an entry gets one stat (time-weighted concurrency, queued
//! requests included, and arrivals), summed over every shard, all in one batch; a revision's
//! first request while it has no entry pokes the autoscaler at once ([`stats`] has the rules).
//! The batches go over a websocket ([`link`]).
//!
//! The shards never wait for any of it: each keeps its revisions' load in single-writer
//! counters (`shards::metrics::Load`) that this task reads, and a first request sends one
//! message up an unbounded channel (at most one per shard and revision outstanding, see
//! `RevisionCounters::arrive`).

pub mod link;
pub mod stats;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kactivator_api::autoscaler::{stat_message, WireStatMessages};
use kactivator_api::RevisionKey;
use kactivator_shards::metrics::{micros_since_start, AllShardStats, RevisionCounters};
use kactivator_shards::runtime::control_link::Poke;
use kactivator_shards::runtime::readiness::Readiness;
use prometheus::Registry;
use tokio::sync::mpsc;

use self::link::{LinkMetrics, Outgoing};
use self::stats::{Report, Stats, Tick, Totals};
use crate::metrics::ReportedConcurrency;

/// How often every entry reports (upstream's `reportInterval`).
pub const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// Where to report and as whom.
#[derive(Clone, Debug)]
pub struct ReporterConfig {
    /// `ws://…` of the autoscaler's stat server.
    pub url: String,
    /// This activator's pod name (`POD_NAME`), the stats' `pod_name`.
    pub pod_name: String,
    /// Which names the link's metrics are exported under.
    pub metric_names: crate::config::MetricNames,
}

/// Every shard's counter blocks of each revision, found as the shards create them, and what
/// each block's load was when its revision's current entry was made.
#[derive(Default)]
struct CountersByRevision {
    by_revision: BTreeMap<RevisionKey, Vec<Arc<RevisionCounters>>>,
    /// Per entry: each block's load as counted into the entry's first baseline.
    counted: BTreeMap<RevisionKey, Vec<(Arc<RevisionCounters>, Totals)>>,
}

impl CountersByRevision {
    /// Adds every block the shards have that is not known yet.
    /// Reads the revision's load on every shard but `except` at `at_us`, keeping each
    /// block's part for [`CountersByRevision::correction`].
    fn baseline_except(
        &mut self,
        revision: &RevisionKey,
        except: &Arc<RevisionCounters>,
        at_us: u64,
    ) -> Totals {
        let mut sum = Totals::default();
        let mut counted = Vec::new();
        for block in self.by_revision.get(revision).into_iter().flatten() {
            if Arc::ptr_eq(block, except) {
                continue;
            }
            let totals = totals_of(block, at_us);
            sum += totals;
            counted.push((block.clone(), totals));
        }
        self.counted.insert(revision.clone(), counted);
        sum
    }

    /// A block poked while its revision had an entry: how much of its load the entry's
    /// baseline counted that its own poke says came after (its `before`). The block's
    /// first request raced the poke that made the entry.
    fn correction(
        &mut self,
        revision: &RevisionKey,
        block: &Arc<RevisionCounters>,
        before: Totals,
    ) -> Option<Totals> {
        let counted = self.counted.get_mut(revision)?;
        let (_, at_creation) = counted
            .iter_mut()
            .find(|(known, _)| Arc::ptr_eq(known, block))?;
        let less = Totals {
            arrivals: at_creation.arrivals.saturating_sub(before.arrivals),
            in_flight: 0,
            integral: at_creation.integral.saturating_sub(before.integral),
        };
        *at_creation = before;
        (less != Totals::default()).then_some(less)
    }

    fn refresh(&mut self, shards: &AllShardStats) {
        self.by_revision.clear();
        for shard in shards.iter() {
            for block in shard.revisions() {
                let Ok(key) = RevisionKey::new(&block.labels.namespace, &block.labels.revision)
                else {
                    continue;
                };
                self.by_revision.entry(key).or_default().push(block);
            }
        }
    }

    fn add(&mut self, revision: &RevisionKey, block: &Arc<RevisionCounters>) {
        let blocks = self.by_revision.entry(revision.clone()).or_default();
        if !blocks.iter().any(|known| Arc::ptr_eq(known, block)) {
            blocks.push(block.clone());
        }
    }

    fn totals(&self, revision: &RevisionKey, now_us: u64) -> Totals {
        self.sum(revision, now_us, |_| true)
    }

    fn sum(
        &self,
        revision: &RevisionKey,
        now_us: u64,
        wanted: impl Fn(&Arc<RevisionCounters>) -> bool,
    ) -> Totals {
        let mut totals = Totals::default();
        for block in self
            .by_revision
            .get(revision)
            .into_iter()
            .flatten()
            .filter(|block| wanted(block))
        {
            totals += totals_of(block, now_us);
        }
        totals
    }

    /// The revision's entry is gone: every shard's next arrival pokes again.
    fn forget(&mut self, revision: &RevisionKey) {
        self.counted.remove(revision);
        for block in self.by_revision.get(revision).into_iter().flatten() {
            block.reported.store(false, Ordering::Release);
        }
    }
}

fn totals_of(block: &RevisionCounters, now_us: u64) -> Totals {
    let load = block.load.read(now_us);
    Totals {
        arrivals: load.arrivals,
        in_flight: load.in_flight,
        integral: load.integral,
    }
}

fn snapshot_totals(snapshot: kactivator_shards::metrics::LoadSnapshot) -> Totals {
    Totals {
        arrivals: snapshot.arrivals,
        in_flight: snapshot.in_flight,
        integral: snapshot.integral,
    }
}

/// Starts the reporter and its link on the current (control) runtime. The link's state goes
/// into `readiness`.
pub fn spawn(
    config: ReporterConfig,
    shards: AllShardStats,
    pokes: flume::Receiver<Poke>,
    registry: &Registry,
    readiness: Arc<Readiness>,
    reported_concurrency: ReportedConcurrency,
) {
    let (to_link, outgoing) = mpsc::unbounded_channel();
    let waiting_shards = shards.clone();
    let waiting = move |namespace: &str, name: &str| {
        waiting_shards.iter().any(|shard| {
            shard.revisions().iter().any(|block| {
                block.labels.namespace == namespace
                    && block.labels.revision == name
                    && block.load.in_flight() > 0
            })
        })
    };
    tokio::spawn(link::run(
        config.url.clone(),
        outgoing,
        readiness,
        LinkMetrics::new(registry, config.metric_names),
        waiting,
    ));
    tokio::spawn(report(
        config.pod_name,
        shards,
        pokes,
        to_link,
        reported_concurrency,
    ));
}

async fn report(
    pod_name: String,
    shards: AllShardStats,
    pokes: flume::Receiver<Poke>,
    to_link: mpsc::UnboundedSender<Outgoing>,
    reported_concurrency: ReportedConcurrency,
) {
    let mut stats = Stats::default();
    let mut counters = CountersByRevision::default();
    let mut ticks = tokio::time::interval(REPORT_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            poke = pokes.recv_async() => {
                let Ok(poke) = poke else { return };
                let before_poke = snapshot_totals(poke.before);
                if stats.has_entry(&poke.revision) {
                    // Another shard poked first; this shard's load joins the entry's sum.
                    counters.add(&poke.revision, &poke.counters);
                    if let Some(less) = counters.correction(&poke.revision, &poke.counters, before_poke) {
                        stats.lower_baseline(&poke.revision, less);
                    }
                    continue;
                }
                // The window starts just before the poking request: the other shards' load
                // then, and the poking shard's as it reported it.
                let mut before =
                    counters.baseline_except(&poke.revision, &poke.counters, poke.at_us);
                before += before_poke;
                counters.add(&poke.revision, &poke.counters);
                if let Some(report) = stats.poke(&poke.revision, before, poke.at_us) {
                    send(&to_link, &pod_name, vec![report], link::POKE);
                }
            }
            _ = ticks.tick() => {
                counters.refresh(&shards);
                let now_us = micros_since_start(Instant::now());
                let tick = stats.tick(now_us, |revision| counters.totals(revision, now_us));
                for revision in &tick.deleted {
                    counters.forget(revision);
                }
                record_gauges(
                    &mut reported_concurrency
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()),
                    &tick,
                );
                send(&to_link, &pod_name, tick.reports, link::TICK);
            }
        }
    }
}

/// What the concurrency gauges show after `tick`: each report's average, as upstream records
/// them at each report. A revision whose entry the tick deleted (idle, or gone from routing)
/// keeps no gauge: its last report was zero, and the map would otherwise only grow.
fn record_gauges(gauges: &mut BTreeMap<RevisionKey, f64>, tick: &Tick) {
    for report in &tick.reports {
        gauges.insert(report.revision.clone(), report.average_concurrency);
    }
    for revision in &tick.deleted {
        gauges.remove(revision);
    }
}

fn send(
    to_link: &mpsc::UnboundedSender<Outgoing>,
    pod_name: &str,
    reports: Vec<Report>,
    kind: &'static str,
) {
    if reports.is_empty() {
        return;
    }
    let batch = WireStatMessages {
        messages: reports
            .iter()
            .map(|report| {
                stat_message(
                    report.revision.namespace(),
                    report.revision.name(),
                    pod_name,
                    report.average_concurrency,
                    report.request_count,
                )
            })
            .collect(),
    };
    // The link is gone only when the runtime stops.
    let _ = to_link.send(Outgoing { batch, kind });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On simulated time: a revision's gauge lives as long as its reporter entry.
    #[test]
    fn a_revision_whose_entry_is_deleted_keeps_no_concurrency_gauge() {
        let revision = RevisionKey::new("ns", "idle").unwrap();
        let other = RevisionKey::new("ns", "busy").unwrap();
        let mut stats = Stats::default();
        let mut gauges = BTreeMap::new();
        let busy = Totals {
            arrivals: 1,
            in_flight: 1,
            integral: 0,
        };
        stats.poke(&revision, Totals::default(), 0).unwrap();
        stats.poke(&other, Totals::default(), 0).unwrap();
        // Over the first second: `idle`'s request took half of it, `busy`'s is still in flight.
        let tick = stats.tick(1_000_000, |key| {
            if key == &revision {
                Totals {
                    arrivals: 1,
                    in_flight: 0,
                    integral: 500_000,
                }
            } else {
                Totals {
                    integral: 1_000_000,
                    ..busy
                }
            }
        });
        record_gauges(&mut gauges, &tick);
        assert_eq!(gauges.len(), 2);
        // A second with nothing: `idle`'s entry reports zero and is deleted, with its gauge.
        let tick = stats.tick(2_000_000, |key| {
            if key == &revision {
                Totals {
                    arrivals: 1,
                    in_flight: 0,
                    integral: 500_000,
                }
            } else {
                Totals {
                    integral: 2_000_000,
                    ..busy
                }
            }
        });
        assert_eq!(tick.deleted, std::slice::from_ref(&revision));
        record_gauges(&mut gauges, &tick);
        assert_eq!(gauges.get(&revision), None, "its gauge went with its entry");
        assert_eq!(gauges.get(&other), Some(&1.0));
    }
}
