//! The state worker's machine: [`ControlState`] plus what carries out its [`Effects`] — the
//! trackers' capacities and the process queue's limit (both read by every shard), routing
//! updates to the shards, the pod-state metrics, and the probe sets that changed, to the prober.

use std::sync::Arc;

use kactivator_shards::throttle::gate::ProcessQueue;
use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::mpsc;

use crate::capacity::Capacity;
use crate::metrics::register;
use crate::pod_state::{PodState, Timestamp};
use crate::publisher::Publisher;
use crate::state::{CapacityChange, ControlState, Effects, Journal, Op, OpError, ProbeUpdate};
use crate::worker::Machine;

/// Metrics fed by the state machine's journal.
#[derive(Clone)]
pub struct PodMetrics {
    transitions: IntCounterVec,
    quarantined: IntGauge,
    quarantine_entries: IntCounter,
    quarantine_exits: IntCounter,
    tracker_limit: IntCounterVec,
    pods: IntGaugeVec,
    routable: IntGaugeVec,
    capacity: GaugeVec,
}

impl PodMetrics {
    pub fn new(registry: &Registry) -> PodMetrics {
        let metrics = PodMetrics {
            transitions: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "pod_state_transitions_total",
                        "Pod tracker state changes; \"none\" is a pod not tracked",
                    ),
                    &["from_state", "to_state", "source"],
                )
                .expect("valid metric"),
            ),
            quarantined: register(
                registry,
                IntGauge::new(
                    "activator_pod_quarantines",
                    "Pod trackers currently quarantined",
                )
                .expect("valid metric"),
            ),
            quarantine_entries: register(
                registry,
                IntCounter::new(
                    "activator_pod_quarantine_entries_total",
                    "Times a pod entered quarantine",
                )
                .expect("valid metric"),
            ),
            quarantine_exits: register(
                registry,
                IntCounter::new(
                    "activator_pod_quarantine_exits_total",
                    "Times a pod left quarantine (expiry, release or removal)",
                )
                .expect("valid metric"),
            ),
            tracker_limit: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "activator_revision_tracker_limit_exceeded_total",
                        "New pods refused because the revision already tracks its limit",
                    ),
                    &["namespace", "revision"],
                )
                .expect("valid metric"),
            ),
            pods: register(
                registry,
                IntGaugeVec::new(
                    Opts::new("activator_pod_trackers", "Pod trackers by state"),
                    &["state"],
                )
                .expect("valid metric"),
            ),
            routable: register(
                registry,
                IntGaugeVec::new(
                    Opts::new(
                        "kactivator_revision_routable_pods",
                        "Pods of the revision this activator routes to",
                    ),
                    &["namespace", "revision"],
                )
                .expect("valid metric"),
            ),
            capacity: register(
                registry,
                GaugeVec::new(
                    Opts::new(
                        "kactivator_revision_capacity",
                        "Requests of the revision this activator may have in flight at once (+Inf: unlimited)",
                    ),
                    &["namespace", "revision"],
                )
                .expect("valid metric"),
            ),
        };
        // Every state is exported from the start, at zero until a pod enters it.
        for state in PodState::ALL {
            metrics.pods.with_label_values(&[state.label()]);
        }
        metrics
    }

    pub(crate) fn observe(&self, entry: &Journal) {
        match entry {
            Journal::Transition {
                from, to, source, ..
            } => {
                let label = |state: &Option<PodState>| state.map_or("none", PodState::label);
                self.transitions
                    .with_label_values(&[label(from), label(to), source.label()])
                    .inc();
                // The per-state gauge is folded here rather than recounted: a recount walks every
                // pod of every revision on each change (100 000 at 10 000 revisions × 10).
                if let Some(state) = from {
                    self.pods.with_label_values(&[state.label()]).dec();
                }
                if let Some(state) = to {
                    self.pods.with_label_values(&[state.label()]).inc();
                }
                let was = *from == Some(PodState::Quarantined);
                let is = *to == Some(PodState::Quarantined);
                if !was && is {
                    self.quarantined.inc();
                    self.quarantine_entries.inc();
                } else if was && !is {
                    self.quarantined.dec();
                    self.quarantine_exits.inc();
                }
            }
            Journal::TrackerLimit { revision } => self
                .tracker_limit
                .with_label_values(&[revision.namespace(), revision.name()])
                .inc(),
            Journal::Route {
                revision,
                pods,
                capacity,
            } => {
                let labels = [revision.namespace(), revision.name()];
                self.routable.with_label_values(&labels).set(*pods as i64);
                self.capacity
                    .with_label_values(&labels)
                    .set(match capacity {
                        Capacity::Unlimited => f64::INFINITY,
                        Capacity::Limited(slots) => f64::from(*slots),
                    });
            }
            Journal::RouteRemoved { revision } => {
                let labels = [revision.namespace(), revision.name()];
                let _ = self.routable.remove_label_values(&labels);
                let _ = self.capacity.remove_label_values(&labels);
            }
            // Said in the log (see `StateShell::flush`); no metric.
            Journal::QueueCapLowered { .. } => {}
        }
    }

    /// Current value of the per-state tracker gauge (tests compare it with a recount).
    pub fn trackers(&self, state: PodState) -> i64 {
        self.pods.with_label_values(&[state.label()]).get()
    }

    /// Current quarantine gauge (tests compare it with a recount).
    pub fn quarantined(&self) -> i64 {
        self.quarantined.get()
    }
}

/// The I/O shell around the [`ControlState`]: the machine the state worker drives, which applies
/// each op to the state and carries out what the state says must change.
pub struct StateShell {
    pub state: ControlState,
    publisher: Publisher,
    /// Shared by every revision's gate; its limit is set here only.
    process_queue: Arc<ProcessQueue>,
    metrics: PodMetrics,
    /// Unbounded: the worker never waits on the prober. It stays bounded because the prober
    /// drains it at once and an update is sent only when a revision's set changed.
    probe_updates: mpsc::UnboundedSender<ProbeUpdate>,
}

impl StateShell {
    pub fn new(
        state: ControlState,
        publisher: Publisher,
        process_queue: Arc<ProcessQueue>,
        metrics: PodMetrics,
    ) -> (StateShell, mpsc::UnboundedReceiver<ProbeUpdate>) {
        let (probe_updates, receiver) = mpsc::unbounded_channel();
        (
            StateShell {
                state,
                publisher,
                process_queue,
                metrics,
                probe_updates,
            },
            receiver,
        )
    }
}

impl Machine for StateShell {
    fn apply(&mut self, op: Op, now: Timestamp) -> Result<(), OpError> {
        self.state.apply(op, now)
    }

    fn next_deadline(&self) -> Option<Timestamp> {
        self.state.next_deadline()
    }

    fn on_deadline(&mut self, now: Timestamp) {
        self.state.expire_quarantines(now);
    }

    fn flush(&mut self) {
        let Effects {
            capacities,
            max_queued_requests,
            updates,
            probe_updates,
            journal,
        } = self.state.take_effects();
        // Capacities first: a tracker that left a route then takes no new request on any
        // shard, even one still serving the route the update replaces, and a tracker that
        // joined one has its slots by the time a shard first sees it.
        set_capacities(capacities);
        if let Some(limit) = max_queued_requests {
            self.process_queue.set_limit(limit);
            tracing::info!(max_queued_requests = limit, "process queue cap set");
        }
        self.publisher.publish(updates);
        for entry in &journal {
            self.metrics.observe(entry);
            match entry {
                Journal::Transition {
                    revision,
                    pod,
                    from,
                    to,
                    reason,
                    source,
                } => tracing::info!(
                    revision = revision.as_str(),
                    %pod,
                    from = from.map_or("none", PodState::label),
                    to = to.map_or("none", PodState::label),
                    reason = reason.label(),
                    source = source.label(),
                    "pod state"
                ),
                Journal::QueueCapLowered { asked, ceiling } => tracing::warn!(
                    "{}: {asked} is more queued requests than the memory limit holds beside \
                     the other caps ({ceiling}); using {ceiling}",
                    crate::features::MAX_QUEUED_REQUESTS
                ),
                _ => {}
            }
        }
        for update in probe_updates {
            // The prober is gone only when the control thread is shutting down.
            let _ = self.probe_updates.send(update);
        }
    }

    fn recover(&mut self) {
        self.state.republish_everything();
    }
}

/// Carries out the capacities the state decided, in order (a later one for the same tracker
/// wins): the one place that writes a tracker's capacity. The state's own tests drive the core
/// through it too.
pub(crate) fn set_capacities(changes: Vec<CapacityChange>) {
    for change in changes {
        change.tracker.slots.set_capacity(change.slots);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kactivator_api::RevisionKey;
    use kactivator_shards::routing::{
        LbPolicy, Protocol, RevisionLabels, RevisionRoute, RoutingUpdate, ShardCommand, Timeouts,
    };

    use super::*;
    use crate::pod_state::Gates;
    use crate::state::{Limits, OmissionScope, RevisionSpec, DEFAULT_SERVING_PORT};

    /// Revision `ns/a`, containerConcurrency 2, with `pods` listed.
    fn declare(pods: &[&str]) -> Op {
        let key = RevisionKey::new("ns", "a").unwrap();
        let spec = RevisionSpec {
            labels: RevisionLabels {
                namespace: "ns".into(),
                revision: "a".into(),
                ..RevisionLabels::default()
            },
            key: key.clone(),
            container_concurrency: 2,
            protocol: Protocol::Http1,
            timeouts: Timeouts::default(),
            lb_policy: LbPolicy::default_for(2),
            queue_depth: 10,
            serving_port: DEFAULT_SERVING_PORT,
            cluster_ip: None,
            priority: None,
            tls: None,
            rules: None,
            cold_start: Default::default(),
        };
        Op::Batch(vec![
            Op::UpsertRevision(spec),
            Op::SetEndpoints {
                revision: key,
                ready: pods.iter().map(|pod| pod.parse().unwrap()).collect(),
                scope: OmissionScope::ListedPods,
            },
        ])
    }

    fn shell(shards: Vec<flume::Sender<ShardCommand>>, queue: &Arc<ProcessQueue>) -> StateShell {
        shell_with(shards, queue, Limits::default())
    }

    fn shell_with(
        shards: Vec<flume::Sender<ShardCommand>>,
        queue: &Arc<ProcessQueue>,
        limits: Limits,
    ) -> StateShell {
        let state = ControlState::new(shards.len(), Gates::HYBRID, limits, queue.clone());
        let (shell, _probes) = StateShell::new(
            state,
            Publisher::new(shards),
            queue.clone(),
            PodMetrics::new(&Registry::new()),
        );
        shell
    }

    fn at(seconds: u64) -> Timestamp {
        Timestamp::from_epoch_offset(Duration::from_secs(seconds))
    }

    fn upsert(command: ShardCommand) -> Arc<RevisionRoute> {
        match command {
            ShardCommand::Routing(RoutingUpdate::Upsert { route, .. }) => route,
            _ => panic!("expected a route"),
        }
    }

    /// The invariant ARCHITECTURE.md states for routes: a tracker out of the route has capacity
    /// 0 before any shard hears of the route, and a tracker in it has its share. The shards'
    /// channels are rendezvous channels here, so the shell cannot go past publishing to the
    /// second shard until the test took the route from it: what the first shard finds is what
    /// the shell did before it published.
    #[test]
    fn a_shard_hearing_of_a_route_finds_every_capacity_already_set() {
        let (senders, shards): (Vec<_>, Vec<_>) = (0..2).map(|_| flume::bounded(0)).unzip();
        let queue = Arc::new(ProcessQueue::new(100));
        let mut shell = shell(senders, &queue);
        let pods = ["10.0.0.1:8012", "10.0.0.2:8012"];
        let driver = std::thread::spawn(move || {
            for (second, listed) in [&pods[..], &pods[..1]].into_iter().enumerate() {
                shell.apply(declare(listed), at(second as u64)).unwrap();
                shell.flush();
            }
        });
        let first = upsert(shards[0].recv().unwrap());
        let capacities: Vec<u32> = first.pods.iter().map(|pod| pod.slots.capacity()).collect();
        assert_eq!(capacities, [2, 2], "each pod has its share when first seen");
        shards[1].recv().unwrap();
        let second = upsert(shards[0].recv().unwrap());
        assert_eq!(second.pods.len(), 1);
        assert_eq!(
            first.pods[1].slots.capacity(),
            0,
            "a shard still on the first route starts nothing on the pod that left"
        );
        shards[1].recv().unwrap();
        driver.join().unwrap();
    }

    #[test]
    fn the_queue_limit_op_sets_the_process_queue() {
        let (sender, _shard) = flume::unbounded();
        let queue = Arc::new(ProcessQueue::new(100));
        let mut shell = shell(vec![sender], &queue);
        shell.apply(Op::SetMaxQueuedRequests(3), at(0)).unwrap();
        assert_eq!(
            queue.limit(),
            100,
            "carried out at the flush, with the rest"
        );
        shell.flush();
        assert_eq!(queue.limit(), 3);
    }

    /// Under a memory limit the process queue never takes more than its ceiling, whatever
    /// `config-features` asks.
    #[test]
    fn a_queue_cap_above_the_ceiling_sets_the_ceiling() {
        let (sender, _shard) = flume::unbounded();
        let queue = Arc::new(ProcessQueue::new(100));
        let limits = Limits {
            queue_ceiling: Some(500),
            ..Limits::default()
        };
        let mut shell = shell_with(vec![sender], &queue, limits);
        shell
            .apply(Op::SetMaxQueuedRequests(u32::MAX), at(0))
            .unwrap();
        shell.flush();
        assert_eq!(queue.limit(), 500);
    }
}
