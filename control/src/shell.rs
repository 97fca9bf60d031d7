//! The state worker's machine: [`ControlState`] plus what its results drive — routing updates to
//! the shards, the pod-state metrics, and the probe sets that changed, to the prober.

use kactivator_shards::throttle::capacity::Capacity;
use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::mpsc;

use crate::metrics::register;
use crate::pod_state::{PodState, Timestamp};
use crate::publisher::Publisher;
use crate::state::{ControlState, Journal, Op, OpError, ProbeUpdate};
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
    metrics: PodMetrics,
    /// Unbounded: the worker never waits on the prober. It stays bounded because the prober
    /// drains it at once and an update is sent only when a revision's set changed.
    probe_updates: mpsc::UnboundedSender<ProbeUpdate>,
}

impl StateShell {
    pub fn new(
        state: ControlState,
        publisher: Publisher,
        metrics: PodMetrics,
    ) -> (StateShell, mpsc::UnboundedReceiver<ProbeUpdate>) {
        let (probe_updates, receiver) = mpsc::unbounded_channel();
        (
            StateShell {
                state,
                publisher,
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
        self.publisher.publish(self.state.take_updates());
        let journal = self.state.take_journal();
        for entry in &journal {
            self.metrics.observe(entry);
            if let Journal::Transition {
                revision,
                pod,
                from,
                to,
                reason,
                source,
            } = entry
            {
                tracing::info!(
                    revision = revision.as_str(),
                    %pod,
                    from = from.map_or("none", PodState::label),
                    to = to.map_or("none", PodState::label),
                    reason = reason.label(),
                    source = source.label(),
                    "pod state"
                );
            }
        }
        for update in self.state.take_probe_updates() {
            // The prober is gone only when the control thread is shutting down.
            let _ = self.probe_updates.send(update);
        }
    }

    fn recover(&mut self) {
        self.state.republish_everything();
    }
}
