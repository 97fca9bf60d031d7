//! Everything that feeds the state worker, each a task on the control thread:
//!
//! * the configuration file, watched for changes (revisions, pods, gates, activators);
//! * registrations and passive signals arriving from the shards;
//! * the active prober of routable pods (quarantine gate on);
//! * the stale-tracker sweep.
//!
//! Each turns what it sees into [`Op`]s; none touches the state directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kactivator_api::headers::RELAYED as RELAYED_HEADER;
use kactivator_shards::runtime::control_link::{EvidenceKind, FromShards, PodEvidence, Reply};
use prometheus::{IntCounterVec, Opts, Registry};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{watch, Semaphore};

use crate::config::Config;
use crate::metrics;
use crate::pod_state::{Event, Gates, Reason};
use crate::prober::{self, ProbeResult};
use crate::state::{OmissionScope, Op, OpError, PodTarget, ProbeTarget, Source};
use crate::worker::{WorkerError, WorkerHandle};
use crate::{activators_of, features, standalone};
use kactivator_api::registration;

/// Most probes in flight at once.
const PROBE_CONCURRENCY: usize = 64;
/// Longest time a relay to a peer may take.
const RELAY_TIMEOUT: Duration = Duration::from_secs(2);

/// Counters of the sources.
pub struct ControlMetrics {
    registrations: IntCounterVec,
    relays: IntCounterVec,
    reloads: IntCounterVec,
    signals: IntCounterVec,
    probes: IntCounterVec,
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
        }
    }
}

/// The sources' shared inputs.
pub struct Sources {
    pub worker: WorkerHandle,
    pub metrics: Arc<ControlMetrics>,
    pub config: Config,
    /// `POD_IP`, the default for `cluster.self_ip` when the file changes the activators.
    pub pod_ip: Option<std::net::IpAddr>,
}

impl Sources {
    /// Spawns every source on the current (control) runtime.
    pub fn spawn_all(
        self,
        config_path: Option<PathBuf>,
        gates: Gates,
        probe_targets: watch::Receiver<Vec<ProbeTarget>>,
        from_shards: FromShards,
    ) {
        let peers = Arc::new(self.config.cluster.peers.clone());
        tokio::spawn(from_shards_loop(
            from_shards,
            self.worker.clone(),
            self.metrics.clone(),
            peers,
        ));
        tokio::spawn(probe_loop(
            probe_targets,
            self.worker.clone(),
            self.metrics.clone(),
            Duration::from_millis(self.config.health.probe_interval_ms),
            Duration::from_millis(self.config.health.probe_timeout_ms),
        ));
        tokio::spawn(sweep_loop(
            self.worker.clone(),
            Duration::from_secs(self.config.control.stale_sweep_seconds),
        ));
        if let Some(path) = config_path {
            tokio::spawn(watch_file(
                path,
                self.config,
                gates,
                self.worker,
                self.metrics,
                self.pod_ip,
            ));
        }
    }
}

/// Polls the configuration file; a changed, valid file becomes a `RecalculateAll` (and a
/// `RecalculateCapacity` when the activators changed). A broken file keeps the last good
/// configuration and logs where it is broken.
async fn watch_file(
    path: PathBuf,
    mut current: Config,
    mut gates: Gates,
    worker: WorkerHandle,
    metrics: Arc<ControlMetrics>,
    pod_ip: Option<std::net::IpAddr>,
) {
    let mut last_text = std::fs::read(&path).ok();
    let mut interval = Duration::from_millis(current.control.watch_interval_ms);
    loop {
        tokio::time::sleep(interval).await;
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(error) => {
                if last_text.is_some() {
                    tracing::warn!(path = %path.display(), "cannot read the configuration; keeping the last good one: {error}");
                    metrics.reloads.with_label_values(&["error"]).inc();
                    last_text = None;
                }
                continue;
            }
        };
        if last_text.as_deref() == Some(&text[..]) {
            continue;
        }
        last_text = Some(text.clone());
        let parsed = std::str::from_utf8(&text)
            .map_err(|error| crate::config::ConfigError {
                source: None,
                position: None,
                message: format!("not UTF-8: {error}"),
            })
            .and_then(Config::parse);
        let config = match parsed {
            Ok(config) => config,
            Err(mut error) => {
                error.source = Some(path.display().to_string());
                tracing::warn!("configuration not applied, keeping the last good one: {error}");
                metrics.reloads.with_label_values(&["error"]).inc();
                continue;
            }
        };
        for (section, changed) in [
            ("listen", config.listen != current.listen),
            ("proxy", config.proxy != current.proxy),
            ("health", config.health != current.health),
            ("control", config.control != current.control),
            (
                "cluster.peers",
                config.cluster.peers != current.cluster.peers,
            ),
        ] {
            if changed {
                tracing::warn!(
                    section,
                    "this part of the configuration changed; it takes effect at the next restart"
                );
            }
        }
        let (new_gates, warnings) = features::resolve(&config.features, gates);
        for warning in warnings {
            tracing::warn!("{warning}");
        }
        if new_gates != gates {
            tracing::info!(
                from = gates.mode_label(),
                to = new_gates.mode_label(),
                "feature gates changed"
            );
        }
        if config.cluster != current.cluster {
            let _ = worker
                .apply(Op::RecalculateCapacity {
                    activators: activators_of(&config, pod_ip),
                })
                .await;
        }
        let result = worker
            .apply(Op::RecalculateAll {
                revisions: standalone::revisions(&config),
                omission: OmissionScope::ListedPods,
                gates: new_gates,
            })
            .await;
        match result {
            Ok(()) => {
                metrics.reloads.with_label_values(&["applied"]).inc();
                tracing::info!(
                    path = %path.display(),
                    revisions = config.revisions.len(),
                    gates = new_gates.mode_label(),
                    "configuration reloaded"
                );
                gates = new_gates;
                // Keep the sections that need a restart as they run, so the warning repeats
                // only when they change again.
                let running = current;
                current = config;
                current.listen = running.listen;
                current.proxy = running.proxy;
                current.health = running.health;
                current.control = running.control;
                current.cluster.peers = running.cluster.peers;
                interval = Duration::from_millis(current.control.watch_interval_ms);
            }
            Err(error) => {
                metrics.reloads.with_label_values(&["error"]).inc();
                tracing::error!("configuration reload failed: {error}");
            }
        }
    }
}

/// Registrations and evidence from the shards.
async fn from_shards_loop(
    from_shards: FromShards,
    worker: WorkerHandle,
    metrics: Arc<ControlMetrics>,
    peers: Arc<Vec<SocketAddr>>,
) {
    let FromShards {
        registrations,
        evidence,
    } = from_shards;
    let evidence_worker = worker.clone();
    let evidence_metrics = metrics.clone();
    tokio::spawn(async move {
        while let Ok(evidence) = evidence.recv_async().await {
            let op = evidence_op(evidence, &evidence_metrics);
            if evidence_worker.enqueue(op).await.is_err() {
                return;
            }
        }
    });
    while let Ok(request) = registrations.recv_async().await {
        // Each registration waits for the worker on its own, so many can be in the worker's
        // channel at once.
        let worker = worker.clone();
        let metrics = metrics.clone();
        let peers = peers.clone();
        tokio::spawn(async move {
            let answer = register(&request.body, request.relayed, &worker, &metrics, &peers).await;
            let _ = request.reply.send(answer);
        });
    }
}

/// The op that applies a piece of evidence.
fn evidence_op(evidence: PodEvidence, metrics: &ControlMetrics) -> Op {
    let namespace = evidence.revision.namespace().to_string();
    let revision = evidence.revision.name().to_string();
    let addr = evidence.tracker.addr;
    match evidence.kind {
        EvidenceKind::TransportFailure => {
            // Taken: the next failure of this pod is reported again.
            evidence.tracker.failure_report_taken();
            metrics
                .signals
                .with_label_values(&["transport_failure"])
                .inc();
            Op::MutatePod {
                namespace,
                revision,
                target: PodTarget::Addr(addr),
                event: Event::HealthCheckFailed,
                source: Source::Proxy,
            }
        }
        EvidenceKind::IpReused { .. } => {
            metrics.signals.with_label_values(&["ip_reused"]).inc();
            Op::RemovePod {
                namespace,
                revision,
                addr,
                reason: Reason::IpReused,
                source: Source::Proxy,
            }
        }
    }
}

/// Parses, applies and (unless it was itself relayed) relays one registration.
async fn register(
    body: &[u8],
    relayed: bool,
    worker: &WorkerHandle,
    metrics: &ControlMetrics,
    peers: &Arc<Vec<SocketAddr>>,
) -> Reply {
    let registration = match registration::parse(body) {
        Ok(registration) => registration,
        Err(error) => {
            metrics
                .registrations
                .with_label_values(&["invalid", ""])
                .inc();
            return Reply {
                status: error.status(),
                body: format!("{}\n", error.message()).into_bytes(),
                json: false,
            };
        }
    };
    let event = registration.event.wire_name();
    let op = Op::MutatePod {
        namespace: registration.namespace.clone(),
        revision: registration.revision.clone(),
        target: PodTarget::Ip(registration.pod_ip),
        event: Event::QueueProxy(registration.event),
        source: Source::QueueProxy,
    };
    let result = worker.apply(op).await;
    if !relayed && !peers.is_empty() {
        let encoded = registration::encode(&registration);
        for peer in peers.iter().copied() {
            let encoded = encoded.clone();
            let relays = metrics.relays.clone();
            tokio::spawn(async move {
                let result = relay(peer, &encoded).await;
                let label = match &result {
                    Ok(200) => "accepted",
                    Ok(_) => "refused",
                    Err(_) => "failed",
                };
                relays.with_label_values(&[label]).inc();
                match result {
                    Ok(200) => {}
                    Ok(status) => {
                        tracing::warn!(%peer, status, "peer refused a relayed registration")
                    }
                    Err(error) => tracing::warn!(%peer, "relaying a registration failed: {error}"),
                }
            });
        }
    }
    let (label, reply) = match result {
        Ok(()) => (
            "accepted",
            Reply {
                status: 200,
                body: registration::ACCEPTED_BODY.as_bytes().to_vec(),
                json: true,
            },
        ),
        Err(WorkerError::Op(
            error @ (OpError::TrackerLimit(..) | OpError::TooManyUndeclared(..)),
        )) => (
            "refused",
            Reply {
                status: 503,
                body: format!("{error}\n").into_bytes(),
                json: false,
            },
        ),
        Err(error) => (
            "failed",
            Reply {
                status: 500,
                body: format!("{error}\n").into_bytes(),
                json: false,
            },
        ),
    };
    metrics
        .registrations
        .with_label_values(&[label, event])
        .inc();
    reply
}

/// Sends a registration to a peer activator's data port, marked as relayed so it stops there.
async fn relay(peer: SocketAddr, body: &[u8]) -> std::io::Result<u16> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(peer).await?;
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {peer}\r\nUser-Agent: knative-queue-proxy\r\n{RELAYED_HEADER}: 1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            registration::PATH,
            body.len()
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body).await?;
        let mut response = Vec::with_capacity(256);
        let mut chunk = [0u8; 256];
        // The status line is all we need.
        while !response.windows(2).any(|pair| pair == b"\r\n") && response.len() < 4096 {
            let read = stream.read(&mut chunk).await?;
            if read == 0 {
                break;
            }
            response.extend_from_slice(&chunk[..read]);
        }
        let status = std::str::from_utf8(&response)
            .ok()
            .and_then(|text| text.split(' ').nth(1))
            .and_then(|code| code.parse::<u16>().ok())
            .ok_or_else(|| std::io::Error::other("malformed response from peer"))?;
        Ok(status)
    };
    tokio::time::timeout(RELAY_TIMEOUT, exchange)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"))?
}

/// Probes the routable pods every `interval` (only populated with quarantine on).
async fn probe_loop(
    mut targets: watch::Receiver<Vec<ProbeTarget>>,
    worker: WorkerHandle,
    metrics: Arc<ControlMetrics>,
    interval: Duration,
    timeout: Duration,
) {
    let limit = Arc::new(Semaphore::new(PROBE_CONCURRENCY));
    // The first round comes one interval after start-up, like every later one.
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            // A pod that just entered probation is probed at once rather than a tick later.
            changed = targets.changed() => {
                if changed.is_err() {
                    return;
                }
                if !targets.borrow().iter().any(|target| target.recovering) {
                    continue;
                }
            }
        }
        let round: Vec<ProbeTarget> = targets.borrow_and_update().clone();
        for target in round {
            let Ok(permit) = limit.clone().acquire_owned().await else {
                return;
            };
            let worker = worker.clone();
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let result =
                    prober::probe(target.addr, &target.namespace, &target.revision, timeout).await;
                drop(permit);
                let op = match result {
                    ProbeResult::Healthy => {
                        metrics.probes.with_label_values(&["healthy"]).inc();
                        if !target.recovering {
                            return;
                        }
                        Event::HealthCheckPassed
                    }
                    ProbeResult::Unhealthy(reason) => {
                        metrics.probes.with_label_values(&["unhealthy"]).inc();
                        tracing::warn!(pod = %target.addr, revision = %target.revision, "health check failed: {reason}");
                        Event::HealthCheckFailed
                    }
                    ProbeResult::IpReused {
                        namespace,
                        revision,
                    } => {
                        metrics.probes.with_label_values(&["ip_reused"]).inc();
                        tracing::warn!(pod = %target.addr, revision = %target.revision, now_serving = %format!("{namespace}/{revision}"), "pod IP reused by another revision");
                        let _ = worker
                            .enqueue(Op::RemovePod {
                                namespace: target.namespace,
                                revision: target.revision,
                                addr: target.addr,
                                reason: Reason::IpReused,
                                source: Source::Prober,
                            })
                            .await;
                        return;
                    }
                };
                let _ = worker
                    .enqueue(Op::MutatePod {
                        namespace: target.namespace,
                        revision: target.revision,
                        target: PodTarget::Addr(target.addr),
                        event: op,
                        source: Source::Prober,
                    })
                    .await;
            });
        }
    }
}

/// Collects idle NotReady trackers now and then.
async fn sweep_loop(worker: WorkerHandle, every: Duration) {
    let mut ticker = tokio::time::interval(every);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        if worker.enqueue(Op::CleanupStale).await.is_err() {
            return;
        }
    }
}
