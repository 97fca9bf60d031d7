//! The control plane: one tokio thread that owns configuration and pod state and publishes
//! routing snapshots.
//!
//! Data flows one way: sources (the standalone file or the Kubernetes source, queue-proxy
//! registrations, the prober, the shards' evidence) → the serialized state worker → its
//! effects, carried out by its shell: trackers' capacities and the queue limit, then versioned
//! updates over one channel per shard. The admin server reads shard counters and the worker's
//! health; it changes no state (its `POST /quitquitquit` only starts the drain). The autoscaler
//! reporter reads the shards' counters and reports them.
//! Start-up goes the same way: the file's first view is a batch through the worker.

#![forbid(unsafe_code)]

pub mod admin;
pub mod autoscaler;
pub mod budget;
pub mod capacity;
pub mod config;
pub mod drain;
pub mod features;
pub mod http_client;
pub mod keda;
pub mod metrics;
pub mod pod_state;
pub mod publisher;
pub mod queue_proxy;
pub mod shell;
pub mod sources;
pub mod state;
pub mod subsetting;
pub mod tls;
pub mod trace_export;
pub mod worker;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kactivator_api::RevisionKey;
use kactivator_shards::metrics::{micros_since_start, AllShardStats};
use kactivator_shards::routing::ShardCommand;
use kactivator_shards::runtime::control_link::FromShards;
use kactivator_shards::runtime::readiness::Readiness;
use kactivator_shards::throttle::gate::ProcessQueue;
use tokio::signal::unix::{signal, SignalKind};

use crate::admin::AdminState;
use crate::config::trace::TracingConfig;
use crate::config::Config;
pub use crate::drain::DrainPhase;
use crate::drain::{DrainRule, QuietPeriod};
use crate::pod_state::{Gates, Windows};
use crate::publisher::Publisher;
use crate::shell::{PodMetrics, StateShell};
use crate::sources::file::{self, FilePoller};
use crate::sources::kubernetes::informers::KubeSource;
use crate::sources::ControlMetrics;
use crate::state::{ControlState, Limits, ProbeUpdate};
use crate::worker::{WorkerError, WorkerHandle, WorkerMetrics};

/// The control thread's state.
pub struct ControlPlane {
    config: Config,
    config_path: Option<PathBuf>,
    gates: Gates,
    worker: WorkerHandle,
    worker_task: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    probe_updates: tokio::sync::mpsc::UnboundedReceiver<ProbeUpdate>,
    from_shards: FromShards,
    publisher: Publisher,
    admin: Arc<AdminState>,
    metrics: Arc<ControlMetrics>,
    /// Revisions the configuration declared at start-up.
    declared: BTreeSet<RevisionKey>,
    pod_ip: Option<std::net::IpAddr>,
    kubernetes: Option<KubeSource>,
    keda: Option<keda::KedaRun>,
    /// Where the drain is; read by whoever waits for it (the queue-proxy's `/wait-for-drain`).
    drain: tokio::sync::watch::Sender<DrainPhase>,
    drain_rule: DrainRule,
    /// The tracing in force, for the source that owns it to update.
    tracing: tokio::sync::watch::Sender<TracingConfig>,
}

/// What the control plane is started with.
pub struct ControlInputs {
    pub shards: usize,
    pub config: Config,
    /// The file to poll for changes; `None` for a configuration that did not come from a file.
    pub config_path: Option<PathBuf>,
    pub publisher: Publisher,
    pub stats: AllShardStats,
    pub pod_name: String,
    /// `POD_IP`, the default for `cluster.self_ip`.
    pub pod_ip: Option<std::net::IpAddr>,
    pub from_shards: FromShards,
    /// Shared by every revision's admission gate; its limit is the state worker's to set
    /// from then on.
    pub process_queue: Arc<ProcessQueue>,
    /// The most the queue's cap may be raised to later (`config-features`): what the memory
    /// limit holds beside the other caps (`budget::Budget::queue_ceiling`); `None` without a
    /// limit.
    pub queue_ceiling: Option<u32>,
    /// Readiness, shared with the shards: the reporter and the Kubernetes source write it.
    pub readiness: Arc<Readiness>,
    /// The Kubernetes source, when kactivator watches a cluster (then the file declares no
    /// revisions and is not polled).
    pub kubernetes: Option<KubeSource>,
    /// KEDA's HTTP add-on role: its source of HTTPScaledObjects and its scaler's port.
    pub keda: Option<keda::KedaRun>,
    /// What ends the drain's grace period (`proxy.drain_grace_seconds`).
    pub drain_rule: DrainRule,
    /// Where the tracing in force goes when it changes: the Kubernetes source writes it from
    /// config-observability and config-tracing, the file poller from a reloaded `[tracing]`;
    /// a configuration given once (the queue-proxy's) never changes it.
    pub tracing: tokio::sync::watch::Sender<TracingConfig>,
}

impl ControlPlane {
    /// Builds the state worker with nothing in it yet; [`ControlPlane::start`] loads the
    /// configuration through it.
    pub fn new(inputs: ControlInputs) -> ControlPlane {
        let ControlInputs {
            shards,
            config,
            config_path,
            publisher,
            stats,
            pod_name,
            pod_ip,
            from_shards,
            process_queue,
            queue_ceiling,
            readiness,
            kubernetes,
            keda,
            drain_rule,
            tracing,
        } = inputs;
        let registry = prometheus::Registry::new();
        let (gates, warnings) = features::resolve(&config.features, Gates::default());
        for warning in warnings {
            tracing::warn!("{warning}");
        }
        let limits = Limits {
            max_trackers_per_revision: config.control.max_trackers_per_revision,
            windows: Windows {
                qp_freshness: Duration::from_secs(config.control.qp_freshness_seconds),
                qp_staleness: Duration::from_secs(config.control.qp_staleness_seconds),
            },
            queue_ceiling,
        };
        let state = ControlState::new(shards, gates, limits, process_queue.clone());
        let (shell, probe_updates) = StateShell::new(
            state,
            publisher.clone(),
            process_queue.clone(),
            PodMetrics::new(&registry),
        );
        let (worker, worker_task) = worker::spawn(
            shell,
            config.control.state_queue_capacity,
            WorkerMetrics::new(&registry),
        );
        let metrics = Arc::new(ControlMetrics::new(&registry));
        let admin = Arc::new(AdminState {
            stats,
            pod_name,
            registry,
            ready: false.into(),
            worker: Some(worker.clone()),
            reported_concurrency: config.autoscaler.url.as_ref().map(|_| Arc::default()),
            readiness,
            metric_names: config.metrics.names,
            metrics_component: config.metrics.component,
            quit: tokio::sync::Notify::new(),
            keda_queue: keda.is_some(),
        });
        ControlPlane {
            config,
            config_path,
            gates,
            worker,
            worker_task: Some(Box::pin(worker_task)),
            probe_updates,
            from_shards,
            publisher,
            admin,
            drain: tokio::sync::watch::channel(DrainPhase::Serving).0,
            drain_rule,
            metrics,
            declared: BTreeSet::new(),
            pod_ip,
            kubernetes,
            keda,
            tracing,
        }
    }

    /// Starts the state worker on the current (control) runtime and applies the configuration's
    /// view through it, like any later reload. Once this returns, every shard's channel holds
    /// the initial routes, so a shard started afterwards serves its first request with them.
    /// Returns how many revisions the configuration declares.
    pub async fn start(&mut self) -> Result<usize, WorkerError> {
        if let Some(task) = self.worker_task.take() {
            tokio::spawn(task);
        }
        let activators = file::activators_of(&self.config, self.pod_ip);
        let (batch, declared) = file::view(&self.config, self.gates, activators, &BTreeSet::new());
        self.worker.apply(batch).await?;
        self.declared = declared;
        Ok(self.declared.len())
    }

    /// Follows the drain: [`DrainPhase::Draining`] at the signal, [`DrainPhase::Drained`] when
    /// the grace period ends.
    pub fn drain_phase(&self) -> tokio::sync::watch::Receiver<DrainPhase> {
        self.drain.subscribe()
    }

    /// Serves the admin port, runs the state worker and the sources, and waits for
    /// SIGTERM/SIGINT (or `POST /quitquitquit`); then drains: readiness fails at once,
    /// requests keep being served for the grace period, then the shards stop accepting.
    /// Returns when the shards have been told to stop; the caller joins them.
    /// The metrics page's registry, for what other control-thread tasks count.
    pub fn registry(&self) -> &prometheus::Registry {
        &self.admin.registry
    }

    pub async fn run(self, admin_listener: std::net::TcpListener) -> std::io::Result<()> {
        self.run_with(admin_listener, None).await
    }

    /// [`ControlPlane::run`], the admin port's answers served on `also` too (KEDA's HTTP
    /// add-on's metrics port, 2223, which its chart's scrape configuration points at).
    pub async fn run_with(
        self,
        admin_listener: std::net::TcpListener,
        also: Option<std::net::TcpListener>,
    ) -> std::io::Result<()> {
        for listener in std::iter::once(admin_listener).chain(also) {
            listener.set_nonblocking(true)?;
            let listener = tokio::net::TcpListener::from_std(listener)?;
            tokio::spawn(admin::serve(listener, self.admin.clone()));
        }
        if let Some(task) = self.worker_task {
            // `start` was not called (a caller that loads nothing): the worker runs from here.
            tokio::spawn(task);
        }
        let FromShards {
            registrations,
            evidence,
            pokes,
        } = self.from_shards;
        if let Some(url) = self.config.autoscaler.url.clone() {
            autoscaler::spawn(
                autoscaler::ReporterConfig {
                    url,
                    pod_name: self.admin.pod_name.clone(),
                    metric_names: self.config.metrics.names,
                },
                self.admin.stats.clone(),
                pokes,
                &self.admin.registry,
                self.admin.readiness.clone(),
                self.admin.reported_concurrency.clone().unwrap_or_default(),
            );
        }
        let file_poller = self.config_path.clone().map(|path| FilePoller {
            path,
            current: self.config.clone(),
            gates: self.gates,
            declared: self.declared.clone(),
            pod_ip: self.pod_ip,
            tracing: self.tracing.clone(),
        });
        // The relay's peers: the file's `cluster.peers`, or what the Kubernetes source finds
        // in `activator-service`'s endpoints (start-up refuses the file's in that mode).
        let (peers_sender, peers) = sources::peers_channel(self.config.cluster.peers.clone());
        sources::spawn_all(
            &self.config,
            &self.worker,
            &self.metrics,
            file_poller,
            self.probe_updates,
            sources::RegistrationInputs {
                registrations,
                evidence,
                peers,
            },
        );
        if let Some(kubernetes) = self.kubernetes {
            tokio::spawn(kubernetes.run(
                self.worker.clone(),
                self.admin.readiness.clone(),
                self.admin.registry.clone(),
                peers_sender,
                self.publisher.clone(),
                self.admin.stats.clone(),
                self.tracing.clone(),
            ));
        }
        if let Some(keda) = self.keda {
            keda.spawn(
                self.worker.clone(),
                self.admin.readiness.clone(),
                self.publisher.clone(),
                self.admin.stats.clone(),
                &self.admin.registry,
            )?;
        }
        self.admin.ready.store(true, Ordering::Release);

        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let quit = &self.admin.quit;
        let which = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
            _ = quit.notified() => "POST /quitquitquit",
        };
        let grace = Duration::from_secs(self.config.proxy.drain_grace_seconds);
        tracing::info!(
            signal = which,
            grace_seconds = grace.as_secs(),
            "draining: readiness now fails; still serving{}",
            match self.drain_rule {
                DrainRule::Grace => "",
                DrainRule::QuietPeriod => " until a grace period passes with no new request",
            }
        );
        self.admin.readiness.begin_drain();
        self.admin.ready.store(false, Ordering::Release);
        self.drain.send_replace(DrainPhase::Draining);
        self.publisher.broadcast(ShardCommand::BeginDrain);
        let served = async {
            match self.drain_rule {
                DrainRule::Grace => tokio::time::sleep(grace).await,
                DrainRule::QuietPeriod => quiet_period(grace, &self.admin.stats).await,
            }
        };
        tokio::select! {
            _ = served => {}
            _ = terminate.recv() => tracing::warn!("second signal: skipping the rest of the grace period"),
            _ = interrupt.recv() => tracing::warn!("second signal: skipping the rest of the grace period"),
            _ = quit.notified() => tracing::warn!("second /quitquitquit: skipping the rest of the grace period"),
        }
        tracing::info!("closing listeners; finishing in-flight requests");
        self.drain.send_replace(DrainPhase::Drained);
        self.publisher.broadcast(ShardCommand::StopAccepting);
        Ok(())
    }
}

/// Returns once `period` has passed with no request arriving at any shard.
async fn quiet_period(period: Duration, stats: &AllShardStats) {
    let arrivals = || {
        let now_us = micros_since_start(std::time::Instant::now());
        queue_proxy::stat_server::pod_totals(stats, now_us)
            .all
            .arrivals
    };
    let mut quiet = QuietPeriod::start(period, std::time::Instant::now(), arrivals());
    while let Some(next) = quiet.observe(std::time::Instant::now(), arrivals()) {
        tokio::time::sleep_until(next.into()).await;
    }
}
