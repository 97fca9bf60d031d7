//! Everything that feeds the state worker, each a task on the control thread, each turning
//! what it sees into [`crate::state::Op`]s (none touches the state directly):
//!
//! * [`file`] — the configuration file, polled for changes (revisions, pods, gates,
//!   activators), sent as one batch per reload;
//! * [`registrations`] — queue-proxy registrations (applied, answered, relayed to peers) and
//!   the request path's evidence, as the shards hand them over;
//! * [`prober`] — the active health check, which asks [`probe_schedule`] when to probe each
//!   pod and [`probe`] to make one probe;
//! * [`sweep`] — the stale-tracker sweep;
//! * [`kubernetes`] — the cluster (Revisions, their endpoints and Services, `config-features`,
//!   `activator-service`), when kactivator watches one; started by `ControlPlane::run`, not
//!   by [`spawn_all`].

pub mod file;
pub mod kubernetes;
pub mod probe;
pub mod probe_schedule;
pub mod prober;
pub mod registrations;
pub mod sweep;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kactivator_shards::runtime::control_link::{PodEvidence, RegistrationRequest};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio::sync::mpsc;

use crate::config::Config;
use crate::metrics;
use crate::state::ProbeUpdate;
use crate::worker::WorkerHandle;

/// Counters of the sources.
pub struct ControlMetrics {
    pub(crate) registrations: IntCounterVec,
    pub(crate) relays: IntCounterVec,
    pub(crate) reloads: IntCounterVec,
    pub(crate) signals: IntCounterVec,
    pub(crate) probes: IntCounterVec,
    pub(crate) probe_targets: IntGaugeVec,
}

impl ControlMetrics {
    pub fn new(registry: &Registry) -> ControlMetrics {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            metrics::register(registry, metric)
        };
        ControlMetrics {
            registrations: counter(
                "activator_pod_registrations_total",
                "Queue-proxy registrations by result",
                &["result", "event_type"],
            ),
            relays: counter(
                "activator_pod_registration_relays_total",
                "Registrations relayed to peer activators, by result",
                &["result"],
            ),
            reloads: counter(
                "kactivator_config_reloads_total",
                "Configuration file reloads by result",
                &["result"],
            ),
            signals: counter(
                "activator_pod_passive_signals_total",
                "Pod signals seen on the request path",
                &["kind"],
            ),
            probes: counter(
                "activator_pod_probes_total",
                "Active health probes by result",
                &["result"],
            ),
            probe_targets: metrics::register(
                registry,
                IntGaugeVec::new(
                    Opts::new(
                        "kactivator_probe_targets",
                        "Pods the active health check watches, by schedule class",
                    ),
                    &["class"],
                )
                .expect("valid metric"),
            ),
        }
    }
}

/// Where the registration relay reads its peers: the latest list only, over a
/// `tokio::sync::watch` channel (a value a reader borrows when it needs it, not a Kubernetes
/// watch). The Kubernetes source writes it from `activator-service`'s endpoints; standalone it
/// holds `cluster.peers` for good.
pub type PeersReceiver = tokio::sync::watch::Receiver<Vec<SocketAddr>>;
/// The writing end of [`PeersReceiver`]'s channel.
pub type PeersSender = tokio::sync::watch::Sender<Vec<SocketAddr>>;

/// A peers channel holding `peers` until it is written.
pub fn peers_channel(peers: Vec<SocketAddr>) -> (PeersSender, PeersReceiver) {
    tokio::sync::watch::channel(peers)
}

/// What the registrations task serves: the shards' registrations and evidence, and the peers
/// it relays registrations to.
pub struct RegistrationInputs {
    pub registrations: flume::Receiver<RegistrationRequest>,
    pub evidence: flume::Receiver<PodEvidence>,
    pub peers: PeersReceiver,
}

/// Starts every source on the current (control) runtime.
pub fn spawn_all(
    config: &Config,
    worker: &WorkerHandle,
    metrics: &Arc<ControlMetrics>,
    file_poller: Option<file::FilePoller>,
    probe_updates: mpsc::UnboundedReceiver<ProbeUpdate>,
    registrations: RegistrationInputs,
) {
    tokio::spawn(registrations::serve(
        registrations,
        worker.clone(),
        metrics.clone(),
    ));
    tokio::spawn(prober::run(
        probe_updates,
        worker.clone(),
        metrics.clone(),
        probe_schedule::ScheduleSettings {
            interval: Duration::from_millis(config.health.probe_interval_ms),
            settled_interval: Duration::from_millis(config.health.settled_probe_interval_ms),
            budget_per_second: config.health.probe_budget_per_second,
        },
        Duration::from_millis(config.health.probe_timeout_ms),
    ));
    tokio::spawn(sweep::run(
        worker.clone(),
        Duration::from_secs(config.control.stale_sweep_seconds),
    ));
    if let Some(file_poller) = file_poller {
        tokio::spawn(file_poller.run(worker.clone(), metrics.clone()));
    }
}
