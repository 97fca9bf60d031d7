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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kactivator_api::autoscaler::{stat_message, WireStatMessages};
use kactivator_api::RevisionKey;
use kactivator_shards::metrics::{micros_since_start, AllShardStats, RevisionCounters};
use kactivator_shards::runtime::control_link::Poke;
use prometheus::Registry;
use tokio::sync::mpsc;

use self::link::{LinkMetrics, Outgoing};
use self::stats::{Report, Stats, Totals};

/// How often every entry reports (upstream's `reportInterval`).
pub const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// Where to report and as whom.
#[derive(Clone, Debug)]
pub struct ReporterConfig {
    /// `ws://…` of the autoscaler's stat server.
    pub url: String,
    /// This activator's pod name (`POD_NAME`), the stats' `pod_name`.
    pub pod_name: String,
}

/// Every shard's counter blocks of each revision, found as the shards create them.
#[derive(Default)]
struct Blocks {
    by_revision: BTreeMap<RevisionKey, Vec<Arc<RevisionCounters>>>,
}

impl Blocks {
    /// Adds every block the shards have that is not known yet.
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

    /// The revision's load at `at_us` on every shard but the one with `except`.
    fn totals_except(
        &self,
        revision: &RevisionKey,
        except: &Arc<RevisionCounters>,
        at_us: u64,
    ) -> Totals {
        self.sum(revision, at_us, |block| !Arc::ptr_eq(block, except))
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
            let load = block.load.read(now_us);
            totals += Totals {
                arrivals: load.arrivals,
                in_flight: load.in_flight,
                integral: load.integral,
            };
        }
        totals
    }

    /// The revision's entry is gone: every shard's next arrival pokes again.
    fn forget(&self, revision: &RevisionKey) {
        for block in self.by_revision.get(revision).into_iter().flatten() {
            block.reported.store(false, Ordering::Release);
        }
    }
}

/// Starts the reporter and its link on the current (control) runtime. `connected` follows the
/// link (readiness reads it).
pub fn spawn(
    config: ReporterConfig,
    shards: AllShardStats,
    pokes: flume::Receiver<Poke>,
    registry: &Registry,
    connected: Arc<AtomicBool>,
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
        connected,
        LinkMetrics::new(registry),
        waiting,
    ));
    tokio::spawn(report(config.pod_name, shards, pokes, to_link));
}

async fn report(
    pod_name: String,
    shards: AllShardStats,
    pokes: flume::Receiver<Poke>,
    to_link: mpsc::UnboundedSender<Outgoing>,
) {
    let mut stats = Stats::default();
    let mut blocks = Blocks::default();
    let mut ticks = tokio::time::interval(REPORT_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            poke = pokes.recv_async() => {
                let Ok(poke) = poke else { return };
                if stats.has_entry(&poke.revision) {
                    // Another shard poked first; this shard's load joins the entry's sum.
                    blocks.add(&poke.revision, &poke.counters);
                    continue;
                }
                // The window starts just before the poking request: the other shards' load
                // then, and the poking shard's as it reported it.
                let mut before = blocks.totals_except(&poke.revision, &poke.counters, poke.at_us);
                before += Totals {
                    arrivals: poke.before.arrivals,
                    in_flight: poke.before.in_flight,
                    integral: poke.before.integral,
                };
                blocks.add(&poke.revision, &poke.counters);
                if let Some(report) = stats.poke(&poke.revision, before, poke.at_us) {
                    send(&to_link, &pod_name, vec![report], "poke");
                }
            }
            _ = ticks.tick() => {
                blocks.refresh(&shards);
                let now_us = micros_since_start(Instant::now());
                let tick = stats.tick(now_us, |revision| blocks.totals(revision, now_us));
                for revision in &tick.deleted {
                    blocks.forget(revision);
                }
                send(&to_link, &pod_name, tick.reports, "tick");
            }
        }
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
