//! Start-up and shutdown: configuration, placement, listeners, shard threads, the control thread,
//! and the drain that ends it all.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use kactivator_control::budget;
use kactivator_control::config::{AutoscalerSettings, Config, ConfigError, ListenTls};
use kactivator_control::drain::DrainRule;
use kactivator_control::features::{self, Tunables};
use kactivator_control::keda::source::KedaSource;
use kactivator_control::keda::KedaRun;
use kactivator_control::publisher::Publisher;
use kactivator_control::sources::kubernetes::informers::{self, KubeSource};
use kactivator_control::tls::files::ServerFiles;
use kactivator_control::trace_export;
use kactivator_control::{ControlInputs, ControlPlane, DrainPhase};
use kactivator_shards::hub::{self, ShardSpec};
use kactivator_shards::metrics::{AllShardStats, ShardStats};
use kactivator_shards::request::identity::detect_cluster_domain;
use kactivator_shards::request::log::{sink, RequestLog};
use kactivator_shards::role::{Activator, Roles};
use kactivator_shards::routing::ShardCommand;
use kactivator_shards::runtime::control_link::ControlLink;
use kactivator_shards::runtime::reactor::{self, DriverKind};
use kactivator_shards::runtime::readiness::Readiness;
use kactivator_shards::runtime::topology::{self, CpuBudget};
use kactivator_shards::shard::ShardSettings;
use kactivator_shards::throttle::gate::ProcessQueue;
use kactivator_shards::upstream::pool::PoolConfig;

use crate::cli::{Cli, LogFormat, Logging, SourceChoice};

/// Why kactivator could not run.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    QueueProxyEnv(#[from] kactivator_control::queue_proxy::env::EnvError),
    #[error("keda-http: {0}")]
    KedaEnv(#[from] kactivator_control::keda::env::EnvErrors),
    #[error("queue-proxy: {0}")]
    QueueProxyCerts(#[from] kactivator_control::queue_proxy::certs::CertsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(#[from] kactivator_control::tls::TlsError),
    #[error("{0}")]
    Shard(String),
    #[error("Kubernetes: {0}")]
    Kubernetes(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl StartError {
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Config(_)
            | StartError::Tls(_)
            | StartError::QueueProxyEnv(_)
            | StartError::KedaEnv(_)
            | StartError::QueueProxyCerts(_) => 2,
            _ => 1,
        }
    }
}

pub fn init_logging(logging: &Logging) {
    let filter = tracing_subscriber::EnvFilter::try_new(&logging.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    // Colour codes only for a person at a terminal, never into a log file or collector.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match logging.log_format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Whether kactivator watches Kubernetes: asked for, or no file given (`auto`).
fn watches_kubernetes(source: SourceChoice, file_given: bool) -> bool {
    match source {
        SourceChoice::Kubernetes => true,
        SourceChoice::File => false,
        SourceChoice::Auto => !file_given,
    }
}

/// Refuses file settings that the cluster owns when kactivator watches it: one writer per fact.
fn check_kubernetes_config(config: &Config) -> Result<(), ConfigError> {
    let owned = [
        (
            !config.revisions.is_empty(),
            "[[revisions]]",
            "the Revisions and their endpoints",
        ),
        (
            !config.features.is_empty(),
            "[features]",
            "the config-features ConfigMap",
        ),
        (
            !config.cluster.activators.is_empty() || config.cluster.self_ip.is_some(),
            "cluster.activators / cluster.self_ip",
            "each revision's public endpoints and POD_IP",
        ),
        (
            !config.cluster.peers.is_empty(),
            "cluster.peers",
            "the endpoints of knative-serving's activator-service",
        ),
        (
            config.listen.tls.is_some(),
            "[listen.tls]",
            "the routing-serving-certs Secret when config-network turns system-internal-tls on",
        ),
        (
            config.tracing.is_some(),
            "[tracing]",
            "config-observability (Knative 1.19+) or config-tracing (1.18)",
        ),
    ];
    for (set, what, owner) in owned {
        if set {
            return Err(ConfigError {
                source: Some("--source kubernetes".into()),
                position: None,
                message: format!(
                    "the file sets {what}, which watching Kubernetes takes from {owner}; remove it \
                     (or run with --source file)"
                ),
            });
        }
    }
    Ok(())
}

/// A Go duration from the environment (upstream's `PROBE_TIMEOUT`, `PROBE_FREQUENCY`).
fn env_duration(name: &str) -> Result<Option<Duration>, StartError> {
    let Ok(text) = std::env::var(name) else {
        return Ok(None);
    };
    features::probe_duration(&text).map(Some).map_err(|why| {
        StartError::Config(ConfigError {
            source: Some(name.into()),
            position: None,
            message: format!("{text:?} {why}"),
        })
    })
}

/// The cluster-wide tunables' values when `config-features` does not set them.
fn default_tunables(config: &Config) -> Result<Tunables, StartError> {
    Ok(Tunables {
        queue_depth: kactivator_shards::routing::DEFAULT_QUEUE_DEPTH,
        lb_policy: None,
        probe_timeout: env_duration("PROBE_TIMEOUT")?
            .unwrap_or(Duration::from_millis(config.kubernetes.probe_timeout_ms)),
        probe_interval: env_duration("PROBE_FREQUENCY")?
            .unwrap_or(Duration::from_millis(config.kubernetes.probe_interval_ms)),
        max_queued_requests: config.proxy.max_queued_requests,
    })
}

/// Loads the configuration named on the command line (or `preset`), applying flag overrides.
fn effective_config(cli: &Cli, preset: Option<Config>) -> Result<Config, StartError> {
    let mut config = match (preset, &cli.config) {
        (Some(config), _) => config,
        (None, Some(path)) => Config::load(path)?,
        (None, None) => Config::default(),
    };
    if let Some(http) = cli.http {
        config.listen.http = http;
    }
    if let Some(http2) = cli.http2 {
        config.listen.http2 = http2;
    }
    if let Some(admin) = cli.admin {
        config.listen.admin = admin;
    }
    if let Some(grace) = cli.drain_grace_seconds {
        check_flag(
            "--drain-grace-seconds",
            grace,
            0,
            kactivator_control::config::MAX_SETTING_SECONDS,
        )?;
        config.proxy.drain_grace_seconds = grace;
    }
    if let Some(shards) = cli.shards {
        check_flag("--shards", shards as u64, 1, MAX_SHARDS as u64)?;
    }
    if let Some(url) = &cli.autoscaler_url {
        if !url.is_empty() {
            AutoscalerSettings::check_url(url).map_err(|why| ConfigError {
                source: Some("--autoscaler-url".into()),
                position: None,
                message: why,
            })?;
        }
        config.autoscaler.url = Some(url.clone());
    }
    Ok(config)
}

/// Most shards `--shards` may ask for: far more than any machine's cores (each is a thread
/// with its own reactor, listeners and buffers).
const MAX_SHARDS: usize = 1024;

/// A number given on the command line (or its environment twin) within `least..=most`.
fn check_flag(flag: &str, value: u64, least: u64, most: u64) -> Result<(), ConfigError> {
    if (least..=most).contains(&value) {
        return Ok(());
    }
    Err(ConfigError {
        source: Some(flag.into()),
        position: None,
        message: format!("{value} is outside {least}..={most}"),
    })
}

/// Where to report: the configured URL; an empty one turns reporting off; none at all inside a
/// Knative installation (`SYSTEM_NAMESPACE` set) is the autoscaler Service, as upstream dials
/// it; standalone, nothing.
fn autoscaler_url(
    configured: Option<String>,
    system_namespace: Option<&str>,
    cluster_domain: &str,
) -> Option<String> {
    match (configured, system_namespace) {
        (Some(url), _) if url.is_empty() => None,
        (Some(url), _) => Some(url),
        (None, Some(namespace)) if !namespace.is_empty() => {
            let url = kactivator_api::autoscaler::default_url(namespace, cluster_domain);
            tracing::info!(%url, "reporting to the autoscaler of SYSTEM_NAMESPACE");
            Some(url)
        }
        (None, _) => None,
    }
}

/// Connects to the cluster (kubeconfig, else the in-cluster service account) and asks it what
/// the source needs before any watch starts.
async fn connect_kubernetes(
    config: &Config,
    pod_ip: Option<std::net::IpAddr>,
    tunables: Tunables,
) -> Result<KubeSource, StartError> {
    let client = informers::client().await.map_err(|error| {
        no_kube_config(
            &error,
            "--source kubernetes",
            ", or run standalone with --config FILE (try `kactivator demo`)",
        )
    })?;
    let system_namespace = std::env::var("SYSTEM_NAMESPACE")
        .ok()
        .filter(|namespace| !namespace.is_empty())
        .unwrap_or_else(|| {
            tracing::info!("SYSTEM_NAMESPACE not set: using {DEFAULT_SYSTEM_NAMESPACE}");
            DEFAULT_SYSTEM_NAMESPACE.to_string()
        });
    if pod_ip.is_none() {
        tracing::warn!(
            "POD_IP not set: this activator cannot find itself in the public endpoints, so it \
             serves every pod of every revision instead of its subset"
        );
    }
    KubeSource::resolve(
        client,
        system_namespace,
        config.kubernetes.endpoints,
        pod_ip,
        tunables,
    )
    .await
    .map_err(StartError::Kubernetes)
}

/// Why there is no client of the cluster (no kubeconfig, no in-cluster service account): the
/// error names `source` and ends with `else_hint`.
fn no_kube_config(error: &str, source: &str, else_hint: &str) -> StartError {
    StartError::Config(ConfigError {
        source: Some(source.into()),
        position: None,
        message: format!(
            "no Kubernetes configuration ({error}); set KUBECONFIG or run in a pod with a \
             service account{else_hint}"
        ),
    })
}

/// Connects to the cluster for the KEDA HTTP add-on role and binds its scaler's port.
async fn connect_keda(keda: KedaSetup) -> Result<KedaRun, StartError> {
    let client = informers::client()
        .await
        .map_err(|error| no_kube_config(&error, "keda-http", ""))?;
    let mut source = KedaSource::resolve(client, keda.namespace, keda.defaults)
        .await
        .map_err(StartError::Kubernetes)?;
    source.upstream_tls = keda.upstream_tls;
    let scaler = reactor::bind_listener(keda.scaler).map_err(|source| StartError::Bind {
        addr: keda.scaler,
        source,
    })?;
    Ok(KedaRun {
        source,
        scaler,
        peers: keda.peers,
        stream_every: keda.stream_every,
    })
}

/// Fits the connection, head and queue caps to the memory limit (see `budget`), and says what
/// they are and what they cost at worst. Returns the most queued requests the limit holds
/// beside the other caps (`None` without a limit), the ceiling the state worker holds a queue
/// cap set later to (`config-features`).
fn fit_memory(
    config: &mut Config,
    shards: usize,
    limit: Option<u64>,
    needs: &budget::Needs,
) -> Result<Option<u32>, StartError> {
    let fitted =
        budget::fit(&config.proxy, shards, limit, needs).map_err(|message| ConfigError {
            source: Some("memory budget".into()),
            position: None,
            message,
        })?;
    let caps = fitted.caps;
    config.proxy.max_connections_per_shard = caps.max_connections_per_shard;
    config.proxy.max_pending_heads_per_shard = caps.max_pending_heads_per_shard;
    config.proxy.max_queued_requests = caps.max_queued_requests;
    let derived: Vec<&str> = [
        "max_connections_per_shard",
        "max_pending_heads_per_shard",
        "max_queued_requests",
    ]
    .into_iter()
    .zip(fitted.derived)
    .filter(|(_, derived)| *derived)
    .map(|(key, _)| key)
    .collect();
    tracing::info!(
        limit = %fitted.limit.map_or("none".to_string(), |limit| budget::Mib(limit).to_string()),
        connections_per_shard = caps.max_connections_per_shard,
        pending_heads_per_shard = caps.max_pending_heads_per_shard,
        queued_requests = caps.max_queued_requests,
        worst_case = %budget::Mib(fitted.worst),
        lowered_to_fit = ?derived,
        "memory budget"
    );
    Ok(fitted.queue_ceiling)
}

/// Knative's namespace, where `config-features` lives when `SYSTEM_NAMESPACE` does not say.
const DEFAULT_SYSTEM_NAMESPACE: &str = "knative-serving";

/// Runs kactivator until it has drained. `preset` replaces the file (the demo uses it);
/// `on_ready` runs once everything listens.
pub fn run(cli: &Cli, preset: Option<Config>) -> Result<(), StartError> {
    run_with(cli, preset, || {})
}

pub fn run_with(
    cli: &Cli,
    preset: Option<Config>,
    on_ready: impl FnOnce(),
) -> Result<(), StartError> {
    run_as(cli, preset, RoleSetup::activator(cli), on_ready)
}

/// Runs on the control thread's runtime before it serves: a role's own servers and tasks, given
/// the drain, the shards' counters and the metrics page's registry. Answers the tasks that
/// finish after the shards ([`AtExit`]).
pub type SpawnExtra = Box<
    dyn FnOnce(
        &tokio::runtime::Runtime,
        tokio::sync::watch::Receiver<DrainPhase>,
        AllShardStats,
        &kactivator_control::metrics::Registry,
    ) -> Result<Vec<AtExit>, StartError>,
>;

/// A role's task with a last thing to do once the shards have ended (the queue-proxy's last
/// push of its request metrics): told through `finish`, then waited for at most `within`, as
/// the span exporters are ([`TRACE_EXPORT_AT_EXIT`]), so that exit is never held long.
pub struct AtExit {
    /// What it does, for the warning when it does not finish in time.
    pub what: &'static str,
    pub finish: tokio::sync::oneshot::Sender<()>,
    pub done: tokio::task::JoinHandle<()>,
    pub within: Duration,
}

/// What differs between kactivator's roles at start-up.
pub struct RoleSetup {
    /// What the shards do with a request.
    pub role: Roles,
    /// Bind `listen.http2` too: the activator's second data port.
    pub second_data_port: bool,
    /// Shards when `--shards` is not given; `None`: the CPUs the process may use.
    pub default_shards: Option<usize>,
    /// Inside a Knative installation, report to its autoscaler.
    pub finds_autoscaler: bool,
    /// Metric label `pod_name`.
    pub pod_name: String,
    /// Knative's request log, when on.
    pub request_log: Option<RequestLogSetup>,
    /// What the role keeps out of the memory budget and the least its caps may be.
    pub needs: budget::Needs,
    /// What ends the drain's grace period.
    pub drain_rule: DrainRule,
    /// Another port serving what the admin port serves (`/metrics` above all): KEDA's HTTP
    /// add-on's metrics port. `None`: none.
    pub metrics_port: Option<std::net::SocketAddr>,
    /// Idle connections kept per pod by the whole process, shared among the shards placed
    /// (KEDA's HTTP add-on's `KEDA_HTTP_MAX_IDLE_CONNS_PER_HOST`); `None`: `proxy.max_idle_per_pod`
    /// per shard, as configured.
    pub idle_per_pod_in_all_shards: Option<usize>,
    /// Idle HTTP/1 connections kept by the whole process over every pod, shared among the
    /// shards placed (KEDA's HTTP add-on's `KEDA_HTTP_MAX_IDLE_CONNS`); `None`: no such cap.
    pub idle_in_all_shards: Option<usize>,
    /// How long the requests still in flight when the listeners close may take; those left then
    /// are cut and the process exits (KEDA's HTTP add-on's `KEDA_HTTP_DRAIN_TIMEOUT`). `None`:
    /// every one finishes (the Knative roles; the pod's termination grace period bounds it).
    pub drain_timeout: Option<Duration>,
    pub spawn_extra: Option<SpawnExtra>,
    /// Unmap the code start-up ran, [`UNMAP_START_UP_CODE_AFTER`] after the shards start
    /// ([`unmap_start_up_code`]).
    pub unmap_start_up_code: bool,
    /// The TLS data port's certificates when the role has its own (the queue-proxy's mounted
    /// pair); otherwise the file's `[listen.tls]`. Served on `listen.https`.
    pub server_tls: Option<ServerFiles>,
    /// Who exports the spans: OpenTelemetry's resource on every batch.
    pub trace_resource: kactivator_telemetry::Resource,
    /// KEDA's HTTP add-on role: its routes come from the cluster's HTTPScaledObjects (not from
    /// Knative's objects or the file), and it serves the external scaler.
    pub keda: Option<KedaSetup>,
}

/// What the KEDA HTTP add-on role watches and where its scaler listens.
pub struct KedaSetup {
    /// `KEDA_HTTP_WATCH_NAMESPACE`; `None`: every namespace.
    pub namespace: Option<String>,
    pub defaults: kactivator_control::keda::model::Defaults,
    pub scaler: std::net::SocketAddr,
    /// Where the other replicas are listed; `None`: this one alone.
    pub peers: Option<kactivator_control::keda::peers::PeerService>,
    /// How requests that came in over the TLS port reach pods; `None`: no TLS port.
    pub upstream_tls: Option<Arc<kactivator_control::keda::tls::UpstreamSetting>>,
    /// How often `StreamIsActive` sends.
    pub stream_every: Duration,
}

/// A request log for the shards, and its writer thread, finished once the shards are.
pub struct RequestLogSetup {
    pub log: Arc<RequestLog>,
    pub writer: sink::Writer,
}

/// How long the end of a drain waits for the last spans to be exported.
pub const TRACE_EXPORT_AT_EXIT: Duration = Duration::from_secs(5);

/// How long the end of a drain waits for the request log's last lines to reach stdout.
pub const REQUEST_LOG_FINISH: Duration = Duration::from_secs(5);

impl RoleSetup {
    pub fn activator(cli: &Cli) -> RoleSetup {
        RoleSetup {
            role: Roles::Activator(Activator),
            second_data_port: true,
            default_shards: None,
            finds_autoscaler: true,
            pod_name: cli.pod_name.clone(),
            request_log: None,
            needs: budget::Needs::activator(),
            drain_rule: DrainRule::Grace,
            drain_timeout: None,
            idle_per_pod_in_all_shards: None,
            idle_in_all_shards: None,
            metrics_port: None,
            spawn_extra: None,
            // One per node, with memory to spare: the pages it would unmap stay in the page
            // cache and are charged to its cgroup all the same (BENCHMARKS.md, "Idle memory and
            // the code layout").
            unmap_start_up_code: false,
            server_tls: None,
            // Upstream's activator is the `activator` service, one instance per pod.
            trace_resource: kactivator_telemetry::Resource {
                service_name: "activator".into(),
                instance_id: Some(cli.pod_name.clone()).filter(|name| !name.is_empty()),
                attributes: Vec::new(),
            },
            keda: None,
        }
    }
}

/// Runs kactivator in the role `setup` describes.
pub fn run_as(
    cli: &Cli,
    preset: Option<Config>,
    mut setup: RoleSetup,
    on_ready: impl FnOnce(),
) -> Result<(), StartError> {
    let preset_given = preset.is_some();
    let keda = setup.keda.take();
    let kubernetes =
        keda.is_none() && watches_kubernetes(cli.source, preset_given || cli.config.is_some());
    if cli.source == SourceChoice::File && cli.config.is_none() && !preset_given {
        return Err(StartError::Config(ConfigError {
            source: Some("--source file".into()),
            position: None,
            message: "needs --config FILE (or try `kactivator demo`)".into(),
        }));
    }
    let mut config = effective_config(cli, preset)?;
    if kubernetes {
        check_kubernetes_config(&config)?;
    }
    // Every pod connection and kept probe connection is a file; the soft limit (often 1024)
    // is far below what the hard limit allows.
    match kactivator_shards::runtime::limits::raise_open_files() {
        Ok(open_files) => tracing::debug!(open_files, "open-file limit"),
        Err(error) => tracing::warn!("cannot raise the open-file limit: {error}"),
    }
    let budget = CpuBudget::detect();
    let placement = budget.place(cli.shards.or(setup.default_shards));
    tracing::info!(
        shards = placement.shards,
        cpus = ?budget.cpus,
        quota = ?budget.quota,
        pins = ?placement.pins,
        unpinned = placement.unpinned_reason.unwrap_or(""),
        "placement"
    );
    if let Some(per_pod) = setup.idle_per_pod_in_all_shards {
        config.proxy.max_idle_per_pod = per_pod.div_ceil(placement.shards.max(1));
    }
    let queue_ceiling = fit_memory(
        &mut config,
        placement.shards,
        topology::memory_limit(),
        &setup.needs,
    )?;

    // Both data ports serve HTTP/1.1 and h2c alike; each shard has a listener on each.
    let mut listeners: Vec<Vec<std::net::TcpListener>> = (0..placement.shards)
        .map(|_| Vec::with_capacity(2))
        .collect();
    let second_data_port = setup.second_data_port;
    let data_ports = if second_data_port {
        vec![config.listen.http, config.listen.http2]
    } else {
        vec![config.listen.http]
    };
    for addr in data_ports {
        let bound = reactor::bind_listeners(addr, placement.shards)
            .map_err(|source| StartError::Bind { addr, source })?;
        for (shard, listener) in listeners.iter_mut().zip(bound) {
            shard.push(listener);
        }
    }
    // The control thread's runtime exists before the shards: the configuration's first view
    // goes through the state worker like every later change, and is in every shard's channel
    // before a shard starts. Watching Kubernetes, the cluster is asked first what it wants of
    // the TLS data port.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("control")
        .build()?;
    let pod_ip = std::env::var("POD_IP").ok().and_then(|ip| ip.parse().ok());
    let kubernetes = if kubernetes {
        let tunables = default_tunables(&config)?;
        Some(runtime.block_on(connect_kubernetes(&config, pod_ip, tunables))?)
    } else {
        None
    };
    let keda = match keda {
        Some(keda) => Some(runtime.block_on(connect_keda(keda))?),
        None => None,
    };
    let files = setup
        .server_tls
        .take()
        .or_else(|| config.listen.tls.as_ref().map(server_files));
    let tls_port = tls_port(&mut config, files, kubernetes.as_ref(), placement.shards)?;
    let admin_listener =
        reactor::bind_listener(config.listen.admin).map_err(|source| StartError::Bind {
            addr: config.listen.admin,
            source,
        })?;
    let metrics_listener = setup
        .metrics_port
        .map(|addr| {
            reactor::bind_listener(addr).map_err(|source| StartError::Bind { addr, source })
        })
        .transpose()?;

    let cluster_domain = config.proxy.cluster_domain.clone().unwrap_or_else(|| {
        detect_cluster_domain(
            std::fs::read_to_string("/etc/resolv.conf").ok().as_deref(),
            std::env::var("CLUSTER_DOMAIN").ok().as_deref(),
        )
    });
    if setup.finds_autoscaler {
        config.autoscaler.url = autoscaler_url(
            config.autoscaler.url.take(),
            std::env::var("SYSTEM_NAMESPACE").ok().as_deref(),
            &cluster_domain,
        );
    }
    // What readiness waits for (the autoscaler link when there is one), written by the control
    // thread and read by /readyz and by kubelet probes on the data port.
    let readiness = Arc::new(Readiness::new(
        config.autoscaler.url.is_some(),
        kubernetes.is_some() || keda.is_some(),
    ));
    // Every shard's spans, to the exporters on the control thread.
    let (span_sender, spans) = trace_export::span_channel();
    let settings = Arc::new(ShardSettings {
        report_load: config.autoscaler.url.is_some(),
        readiness: readiness.clone(),
        cluster_domain,
        pool: PoolConfig {
            idle_timeout: Duration::from_secs(config.proxy.upstream_idle_timeout_seconds),
            max_idle_per_pod: config.proxy.max_idle_per_pod,
            connect_timeout: Duration::from_millis(config.proxy.connect_timeout_ms),
            max_idle_per_shard: setup
                .idle_in_all_shards
                .map(|all| all.div_ceil(placement.shards.max(1))),
        },
        stop: Arc::default(),
        max_connections: config.proxy.max_connections_per_shard,
        max_pending_heads: config.proxy.max_pending_heads_per_shard,
        h2: config.proxy.h2(),
        head_timeout: Duration::from_secs(config.proxy.head_timeout_seconds),
        role: setup.role,
        request_log: setup.request_log.as_ref().map(|setup| setup.log.clone()),
        spans: Some(span_sender),
    });
    let log_writer = setup.request_log.map(|setup| setup.writer);
    let stats: AllShardStats = (0..placement.shards)
        .map(|index| CachePadded::new(ShardStats::new(index)))
        .collect();

    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..placement.shards).map(|_| flume::unbounded()).unzip();
    let publisher = Publisher::new(senders);
    // Queued before the shards start: their first TLS handshake already has certificates.
    // From the cluster, they come when its Secret is listed.
    let (tls_watch, mut tls_listeners) = match tls_port {
        TlsPort::Files {
            files,
            first,
            contents,
            bound,
        } => {
            publisher.broadcast(first);
            let watch = kactivator_control::tls::files::watch(*files, contents, publisher.clone());
            (Some(watch), per_shard(bound))
        }
        TlsPort::Cluster { bound } => (None, per_shard(bound)),
        TlsPort::None => (None, Vec::new()),
    };
    let (control_link, from_shards) = ControlLink::channel();
    let process_queue = Arc::new(ProcessQueue::new(config.proxy.max_queued_requests));
    // The tracing in force: the file's `[tracing]` (the queue-proxy's environment, through its
    // preset), then what the file poller or the Kubernetes source reads.
    let (tracing_tx, tracing_rx) = tokio::sync::watch::channel(config.tracing_config());
    let mut control = ControlPlane::new(ControlInputs {
        shards: placement.shards,
        config: config.clone(),
        // The demo's preset configuration has no file to watch; watching Kubernetes, the file
        // only has settings, read once.
        config_path: if preset_given || kubernetes.is_some() {
            None
        } else {
            cli.config.clone()
        },
        publisher: publisher.clone(),
        stats: stats.clone(),
        pod_name: setup.pod_name,
        pod_ip,
        from_shards,
        process_queue,
        queue_ceiling,
        readiness,
        kubernetes,
        keda,
        drain_rule: setup.drain_rule,
        tracing: tracing_tx,
    });
    // Before the revisions load: the shards learn the tracing in force before any request.
    let (shards_ended, tracing_finish) = tokio::sync::oneshot::channel();
    let exporting = runtime.spawn({
        let registry = control.registry().clone();
        async move {
            trace_export::run(
                tracing_rx,
                spans,
                setup.trace_resource,
                publisher,
                &registry,
                tracing_finish,
            )
            .await
        }
    });
    let revisions = runtime
        .block_on(control.start())
        .map_err(|error| StartError::Shard(format!("loading the configuration: {error}")))?;

    // Each shard's mailbox of grants and evictions from the others.
    let (mailbox_senders, mailboxes): (Vec<_>, Vec<_>) =
        (0..placement.shards).map(|_| flume::unbounded()).unzip();
    let (started_tx, started_rx) = mpsc::channel();
    let mut threads = Vec::with_capacity(placement.shards);
    let shard_inputs = listeners.into_iter().zip(receivers).zip(mailboxes);
    for (index, ((listener, commands), mailbox)) in shard_inputs.enumerate() {
        let spec = ShardSpec {
            index,
            cpu: placement.pins.as_ref().map(|pins| pins[index]),
            driver: cli.driver,
            listeners: listener,
            tls_listeners: if tls_listeners.is_empty() {
                Vec::new()
            } else {
                std::mem::take(&mut tls_listeners[index])
            },
            commands,
            mailbox,
            peers: mailbox_senders.clone(),
            settings: settings.clone(),
            stats: stats.clone(),
            control: control_link.clone(),
        };
        threads.push(hub::spawn_shard(spec, started_tx.clone())?);
    }
    drop(started_tx);
    let mut drivers: Vec<DriverKind> = Vec::with_capacity(placement.shards);
    for _ in 0..placement.shards {
        match started_rx.recv() {
            Ok(Ok(kind)) => drivers.push(kind),
            Ok(Err(reason)) => return Err(StartError::Shard(reason)),
            Err(_) => {
                return Err(StartError::Shard(
                    "a shard thread exited during start-up".into(),
                ))
            }
        }
    }
    let driver = drivers.first().map_or("none", |kind| kind.as_str());
    tracing::info!(
        http = %config.listen.http,
        http2 = %if second_data_port { config.listen.http2.to_string() } else { "none".into() },
        admin = %config.listen.admin,
        https = %config.listen.https.map_or_else(|| "none".into(), |addr| addr.to_string()),
        shards = placement.shards,
        driver,
        revisions,
        "kactivator is serving"
    );
    on_ready();

    let at_exit = match setup.spawn_extra {
        Some(spawn_extra) => spawn_extra(
            &runtime,
            control.drain_phase(),
            stats.clone(),
            control.registry(),
        )?,
        None => Vec::new(),
    };
    // Start-up's code leaves the resident set once the control thread's tasks have started too.
    if setup.unmap_start_up_code {
        runtime.spawn(async {
            tokio::time::sleep(UNMAP_START_UP_CODE_AFTER).await;
            unmap_start_up_code();
        });
    }
    if let Some(watch) = tls_watch {
        runtime.spawn(watch);
    }
    runtime.block_on(control.run_with(admin_listener, metrics_listener))?;
    // The control thread's tasks keep running while the shards finish their requests: answers
    // that wait for the drain (the queue-proxy's `/wait-for-drain`) are written now.
    let drain_timeout = setup.drain_timeout;
    let cut = runtime.block_on(async move {
        let joined = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        });
        let cut = match drain_timeout {
            None => {
                let _ = joined.await;
                false
            }
            Some(limit) => tokio::time::timeout(limit, joined).await.is_err(),
        };
        if cut {
            tracing::warn!(
                drain_timeout_ms = drain_timeout.unwrap_or_default().as_millis() as u64,
                "drain timeout: the requests still in flight are cut"
            );
        }
        tokio::task::yield_now().await;
        cut
    });
    // The shards are gone and their last spans sent: the exporters send what is left and stop
    // (each export bounded by its timeout); the role's tasks do their last thing alongside.
    let _ = shards_ended.send(());
    let at_exit: Vec<_> = at_exit
        .into_iter()
        .map(|task| {
            let _ = task.finish.send(());
            (task.what, task.done, task.within)
        })
        .collect();
    // The timers are made inside the runtime: a tokio timer needs one to exist. Every task runs
    // at once; each is given its own time from now.
    runtime.block_on(async move {
        let started = tokio::time::Instant::now();
        if tokio::time::timeout_at(started + TRACE_EXPORT_AT_EXIT, exporting)
            .await
            .is_err()
        {
            tracing::warn!(
                "tracing: the last spans were not exported within {} s; they are lost",
                TRACE_EXPORT_AT_EXIT.as_secs()
            );
        }
        for (what, done, within) in at_exit {
            if tokio::time::timeout_at(started + within, done)
                .await
                .is_err()
            {
                tracing::warn!("{what}: not done within {} s; given up", within.as_secs());
            }
        }
    });
    // Every request has ended: its line is queued, and written before the process exits.
    if let Some(writer) = log_writer {
        if !writer.finish(REQUEST_LOG_FINISH) {
            tracing::warn!(
                "request log: stdout took no lines for {} s; the last lines are lost",
                REQUEST_LOG_FINISH.as_secs()
            );
        }
    }
    if cut {
        // The shards still hold the requests that were cut: the runtime is not dropped (its
        // drop would wait for the thread joining them), and the process ends with them.
        runtime.shutdown_background();
        tracing::info!("drained at the drain timeout; bye");
        return Ok(());
    }
    tracing::info!("drained; bye");
    Ok(())
}

/// The TLS data port, as start-up leaves it for the shards.
enum TlsPort {
    None,
    /// Certificates from files, looked at again every so often.
    Files {
        files: Box<ServerFiles>,
        /// The shards' first command: the certificates loaded.
        first: ShardCommand,
        contents: kactivator_control::tls::files::Contents,
        bound: Vec<std::net::TcpListener>,
    },
    /// Knative's `system-internal-tls`: the certificate comes from the cluster.
    Cluster {
        bound: Vec<std::net::TcpListener>,
    },
}

/// One listener in each shard's list.
fn per_shard(bound: Vec<std::net::TcpListener>) -> Vec<Vec<std::net::TcpListener>> {
    bound.into_iter().map(|listener| vec![listener]).collect()
}

/// Decides and binds the TLS data port:
/// * certificates in files (`[listen.tls]`, or the queue-proxy's mounted pair) are loaded before
///   anything listens (a first load that fails stops start-up, as upstream's queue-proxy does);
/// * watching a cluster whose `config-network` turns `system-internal-tls` on, the port is
///   `listen.https`, by default Knative's 8112, and its certificate comes from the
///   `routing-serving-certs` Secret;
/// * `listen.https` with neither is refused.
fn tls_port(
    config: &mut Config,
    files: Option<ServerFiles>,
    kubernetes: Option<&KubeSource>,
    shards: usize,
) -> Result<TlsPort, StartError> {
    let bind = |addr| {
        reactor::bind_listeners(addr, shards).map_err(|source| StartError::Bind { addr, source })
    };
    let from_cluster = kubernetes.is_some_and(|source| source.internal_tls.is_some());
    match (config.listen.https, files) {
        (Some(addr), Some(files)) => {
            let (server_config, contents) = files.load()?;
            Ok(TlsPort::Files {
                files: Box::new(files),
                first: ShardCommand::ServerTls(Some(server_config)),
                contents,
                bound: bind(addr)?,
            })
        }
        (https, _) if from_cluster => {
            let addr = https.unwrap_or(reactor::any_address(
                kactivator_control::tls::KNATIVE_POD_TLS_PORT,
            ));
            config.listen.https = Some(addr);
            Ok(TlsPort::Cluster { bound: bind(addr)? })
        }
        (Some(_), _) => Err(StartError::Config(ConfigError {
            source: Some("listen.https".into()),
            position: None,
            message: if kubernetes.is_some() {
                "is served with config-network's system-internal-tls on, which this cluster \
                 does not turn on; remove it"
                    .into()
            } else {
                "listen.https needs [listen.tls] with its certificates".into()
            },
        })),
        (None, _) => Ok(TlsPort::None),
    }
}

/// The TLS data port's files and settings as `[listen.tls]` gives them.
fn server_files(tls: &ListenTls) -> ServerFiles {
    ServerFiles {
        certificates: tls
            .certificates
            .iter()
            .map(|files| (files.chain.clone(), files.key.clone()))
            .collect(),
        default: 0,
        client_ca: tls
            .client_ca
            .clone()
            .map(|ca| (ca, tls.client_certificate_required)),
        settings: tls.settings(),
        alpn: tls.alpn.clone(),
        every: Duration::from_secs(tls.reload_seconds),
    }
}

/// How long after the shards start the process unmaps the code start-up ran: long enough for
/// the control thread's tasks (the admin and stats servers, the prober, the state worker) to
/// have made their first rounds, whose code is start-up's too.
pub const UNMAP_START_UP_CODE_AFTER: Duration = Duration::from_secs(3);

/// Unmaps the pages of the binary's and the libraries' code and constants
/// (`runtime::memory::unmap_clean_file_pages`); serving maps back what it runs. The pages stay
/// in the page cache: this shrinks the process's resident set, not what its cgroup is charged
/// for them (BENCHMARKS.md, "Idle memory and the code layout").
fn unmap_start_up_code() {
    match std::fs::read_to_string("/proc/self/smaps") {
        Ok(smaps) => {
            let unmapped = kactivator_shards::runtime::memory::unmap_clean_file_pages(&smaps);
            tracing::debug!(
                mappings = unmapped.mappings,
                kib = unmapped.resident_kib,
                "start-up code unmapped"
            );
        }
        Err(error) => tracing::debug!("start-up code stays mapped: /proc/self/smaps: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watching_kubernetes_refuses_each_setting_the_cluster_owns() {
        let owned = [
            (
                "[[revisions]]\nnamespace = \"d\"\nname = \"r\"\nserving_port = 1\n",
                "[[revisions]]",
            ),
            (
                "[features]\n\"activator.pod-quarantine\" = \"disabled\"\n",
                "[features]",
            ),
            (
                "[cluster]\nactivators = [\"10.0.0.1\"]\n",
                "cluster.activators",
            ),
            ("[cluster]\nself_ip = \"10.0.0.1\"\n", "cluster.self_ip"),
            ("[cluster]\npeers = [\"10.0.0.2:8012\"]\n", "cluster.peers"),
            ("[tracing]\nprotocol = \"stdout\"\n", "[tracing]"),
        ];
        for (text, what) in owned {
            let config = Config::parse(text).unwrap_or_else(|error| panic!("{text}: {error}"));
            let error = check_kubernetes_config(&config).expect_err(what);
            assert!(error.message.contains(what), "{what}: {}", error.message);
        }
        let settings = Config::parse("[proxy]\ndrain_grace_seconds = 3\n").unwrap();
        assert!(check_kubernetes_config(&settings).is_ok());
    }

    /// `config-features` may set the process queue's cap at run time; with a memory limit, the
    /// budget fitted at start-up gives the state worker its ceiling, never below the cap the
    /// queue starts with.
    #[test]
    fn the_memory_budget_gives_the_queue_cap_a_ceiling_only_under_a_limit() {
        let mut config = Config::default();
        let ceiling = fit_memory(&mut config, 2, Some(600 << 20), &budget::Needs::activator())
            .unwrap()
            .expect("a ceiling with a memory limit");
        assert!(ceiling >= config.proxy.max_queued_requests);
        let mut config = Config::default();
        assert_eq!(
            fit_memory(&mut config, 2, None, &budget::Needs::activator()).unwrap(),
            None
        );
    }

    #[test]
    fn the_autoscaler_is_the_configured_one_or_the_system_namespaces_or_none() {
        let configured = Some("ws://elsewhere:9".to_string());
        assert_eq!(
            autoscaler_url(configured, Some("knative-serving"), "cluster.local").as_deref(),
            Some("ws://elsewhere:9")
        );
        assert_eq!(
            autoscaler_url(None, Some("knative-serving"), "corp.internal").as_deref(),
            Some("ws://autoscaler.knative-serving.svc.corp.internal:8080")
        );
        assert_eq!(autoscaler_url(None, None, "cluster.local"), None);
        assert_eq!(
            autoscaler_url(
                Some(String::new()),
                Some("knative-serving"),
                "cluster.local"
            ),
            None,
            "an empty URL turns reporting off"
        );
    }
}
