//! The standalone configuration file: listeners, proxy settings, feature gates, tracing and
//! revisions.
//!
//! TOML, parsed with the maintained `toml` crate. Unknown keys are errors (a typo must not be
//! silently ignored), and every error, the parser's or validation's, names the line and column
//! of the key or value it is about: validation looks values up in the parsed document's spans.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kactivator_shards::http2::{
    H2Settings, DEFAULT_CONNECTION_WINDOW as DEFAULT_H2_CONNECTION_WINDOW,
    DEFAULT_MAX_CONCURRENT_STREAMS as DEFAULT_H2_MAX_CONCURRENT_STREAMS,
    DEFAULT_MAX_FRAME as DEFAULT_H2_MAX_FRAME,
    DEFAULT_MAX_HEADER_LIST as DEFAULT_H2_MAX_HEADER_LIST,
    DEFAULT_STREAM_WINDOW as DEFAULT_H2_STREAM_WINDOW,
};
use kactivator_shards::routing::priority::{
    default_band_of, PriorityPolicy, DEFAULT_BANDS, DEFAULT_PRIORITY_HEADER, DEFAULT_TENANT_HEADER,
};
use kactivator_shards::routing::{
    LbPolicy, Protocol, Timeouts, DEFAULT_QUEUE_DEPTH, DEFAULT_TIMEOUT, MAX_TIMEOUT_SECONDS,
};
use kactivator_shards::shard::{
    DEFAULT_HEAD_TIMEOUT, DEFAULT_MAX_CONNECTIONS_PER_SHARD, DEFAULT_MAX_PENDING_HEADS_PER_SHARD,
};
use kactivator_shards::upstream::pool::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_IDLE_PER_POD,
};
use serde::Deserialize;
use toml::de::DeTable;

use self::trace::{TraceProtocol, TracingConfig};
use crate::pod_state::{DEFAULT_QP_FRESHNESS, DEFAULT_QP_STALENESS};
use crate::state::{
    DEFAULT_H2C_SERVING_PORT, DEFAULT_MAX_TRACKERS_PER_REVISION, DEFAULT_SERVING_PORT,
};
#[cfg(doc)]
use kactivator_shards::request::identity::DEFAULT_CLUSTER_DOMAIN;
use kactivator_shards::runtime::reactor;

pub mod trace;

// Each default is one named constant. Those a consumer also falls back to live with it (the
// pool's, the routing's, the state worker's) and are referenced here; the ones only this file
// uses are defined next to their section below.

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub listen: Listen,
    #[serde(default)]
    pub proxy: ProxySettings,
    /// Feature gates, `config-features` style: `"queueproxy.pod-authority" = "enabled"`.
    #[serde(default)]
    pub features: BTreeMap<String, String>,
    #[serde(default)]
    pub control: ControlSettings,
    #[serde(default)]
    pub health: HealthSettings,
    #[serde(default)]
    pub cluster: ClusterSettings,
    #[serde(default)]
    pub autoscaler: AutoscalerSettings,
    #[serde(default)]
    pub metrics: MetricsSettings,
    #[serde(default)]
    pub kubernetes: KubernetesSettings,
    /// Where spans are exported. Standalone only (watching a cluster, its config-observability
    /// or config-tracing decides). Default: none, tracing off.
    #[serde(default)]
    pub tracing: Option<TracingSettings>,
    #[serde(default)]
    pub revisions: Vec<RevisionConfig>,
}

// === [tracing] ===

/// Default of `tracing.sampling_rate`: 1, every new trace, as the OpenTelemetry SDK's own
/// default sampler (`parentbased_always_on`). Knative's defaults differ (1.18's config-tracing
/// 0.1, `config/tracing.go:66-73`; 1.19+'s config-observability 0, which samples nothing,
/// `observability/tracing/config.go:61-65`): a table written to export traces exports some.
pub const DEFAULT_SAMPLING_RATE: f64 = 1.0;

/// `[tracing]`: the span exporter, the settings meaning what config-observability's mean
/// ([`trace`]). Applied without a restart when the file changes.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TracingSettings {
    /// `none`, `http/protobuf`, `grpc`, `stdout` (one line per span) or `zipkin` (Zipkin's v2
    /// JSON, what Knative 1.18 exports). Required.
    #[serde(deserialize_with = "trace_protocol")]
    pub protocol: TraceProtocol,
    /// The collector, as Knative's `tracing-endpoint` is written and read
    /// (`kactivator_telemetry::endpoint`): an `http://` URL (`http://otel-collector:4317`,
    /// `http://otel-collector:4318/v1/traces`, `http://zipkin:9411/api/v2/spans`). `https://`,
    /// and a bare `host:port`, which Knative reads as `https://`, are refused: TLS to collectors
    /// is not built. Required for `grpc`, `http/protobuf` and `zipkin`; empty for `none` and
    /// `stdout`. Default empty.
    #[serde(default)]
    pub endpoint: String,
    /// The ratio of new traces sampled, 0 to 1 (a parent's decision is kept); `stdout` samples
    /// every trace. Default: [`DEFAULT_SAMPLING_RATE`] (1).
    #[serde(default = "default_sampling_rate")]
    pub sampling_rate: f64,
}

fn default_sampling_rate() -> f64 {
    DEFAULT_SAMPLING_RATE
}

/// `tracing.protocol`, by [`trace::file_protocol`]; an unknown name is refused at its value.
fn trace_protocol<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<TraceProtocol, D::Error> {
    let name = String::deserialize(deserializer)?;
    trace::file_protocol(&name).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "unknown tracing protocol {name:?}, expected \"none\", \"http/protobuf\", \"grpc\", \
             \"stdout\" or \"zipkin\""
        ))
    })
}

impl TracingSettings {
    /// What the table means, or the key at fault and why: a rate outside 0 to 1, an endpoint
    /// where none is used (config-observability refuses that too,
    /// `observability/tracing/config.go:39-51`), or one the exporters cannot use
    /// ([`TracingConfig::validate`]).
    pub fn config(&self) -> Result<TracingConfig, (&'static str, String)> {
        if !trace::rate_in_range(self.sampling_rate) {
            return Err((
                "sampling_rate",
                format!("{} is not a number from 0 to 1", self.sampling_rate),
            ));
        }
        if !self.protocol.needs_endpoint() && !self.endpoint.is_empty() {
            return Err((
                "endpoint",
                format!(
                    "must be empty with protocol {:?}, which sends nowhere",
                    self.protocol.label()
                ),
            ));
        }
        let config =
            trace::opentelemetry(self.protocol.clone(), &self.endpoint, self.sampling_rate);
        config.validate().map_err(|error| {
            let key = match error {
                trace::TracingConfigError::SamplingRate(_) => "sampling_rate",
                _ => "endpoint",
            };
            (key, error.to_string())
        })?;
        Ok(config)
    }

    /// The table that means `config` (`None`: tracing off): how a role that is configured
    /// otherwise (the queue-proxy, by its environment) hands its tracing to start-up.
    pub fn of(config: &TracingConfig) -> Option<TracingSettings> {
        config.enabled().then(|| TracingSettings {
            protocol: config.protocol.clone(),
            endpoint: config.endpoint.clone(),
            sampling_rate: config.sampling_rate,
        })
    }
}

// === [kubernetes] ===

/// Default of `kubernetes.probe_interval_ms`: 200 ms, upstream's `PROBE_FREQUENCY` default
/// (`pkg/activator/net/revision_backends.go`).
pub const DEFAULT_BACKEND_PROBE_INTERVAL_MS: u64 = 200;
/// Default of `kubernetes.probe_timeout_ms`: 300 ms, upstream's `PROBE_TIMEOUT` default. Ours
/// applies to each probe, not to a round of them.
pub const DEFAULT_BACKEND_PROBE_TIMEOUT_MS: u64 = 300;

/// Which API lists a revision's pods.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EndpointsKind {
    /// EndpointSlices (`discovery.k8s.io/v1`, else `v1beta1`) when the server serves them,
    /// else core/v1 Endpoints.
    #[default]
    Auto,
    /// core/v1 Endpoints, what upstream watches (deprecated since Kubernetes 1.33).
    Endpoints,
    /// `discovery.k8s.io` EndpointSlices; start-up fails when the server has none.
    Endpointslices,
}

/// The Kubernetes source (used when kactivator watches a cluster).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesSettings {
    /// `auto`, `endpoints` or `endpointslices`. Default: `auto`.
    pub endpoints: EndpointsKind,
    /// Time between probes of a listed pod not confirmed yet, in milliseconds. Default:
    /// [`DEFAULT_BACKEND_PROBE_INTERVAL_MS`] (200 ms); the `PROBE_FREQUENCY` environment
    /// variable (a Go duration, as upstream) and `config-features`' `activator.probe-interval`
    /// override it.
    pub probe_interval_ms: u64,
    /// One such probe's timeout, in milliseconds. Default:
    /// [`DEFAULT_BACKEND_PROBE_TIMEOUT_MS`] (300 ms); `PROBE_TIMEOUT` and
    /// `activator.probe-timeout` override it.
    pub probe_timeout_ms: u64,
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        KubernetesSettings {
            endpoints: EndpointsKind::Auto,
            probe_interval_ms: DEFAULT_BACKEND_PROBE_INTERVAL_MS,
            probe_timeout_ms: DEFAULT_BACKEND_PROBE_TIMEOUT_MS,
        }
    }
}

// === [metrics] ===

/// Which names the request metrics are exported under.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum MetricNames {
    /// Knative 1.18's OpenCensus names (`activator_request_count`, …), what the fork runs.
    Opencensus,
    /// Knative 1.19+'s OpenTelemetry names as its Prometheus exporter writes them
    /// (`kn_revision_request_concurrency`, `http_server_request_duration_seconds`, …).
    Opentelemetry,
    /// Both sets (the default): dashboards for either Knative version work unchanged.
    #[default]
    Both,
    /// Neither: only kactivator's own. Not for the file: the queue-proxy role's, when
    /// `OBSERVABILITY_CONFIG` turns upstream's request metrics off (`queue_proxy::observability`).
    #[serde(skip_deserializing)]
    Neither,
}

impl MetricNames {
    pub fn opencensus(self) -> bool {
        matches!(self, MetricNames::Opencensus | MetricNames::Both)
    }

    pub fn opentelemetry(self) -> bool {
        matches!(self, MetricNames::Opentelemetry | MetricNames::Both)
    }
}

/// Whose request metrics `/metrics` exports: upstream names them after the component.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MetricsComponent {
    /// The activator's: `activator_request_*` (1.18), `kn_revision_request_*` (1.19+).
    #[default]
    Activator,
    /// The queue-proxy's: `revision_request_*` (1.18), `kn_serving_*` (1.19+).
    /// `queue_depth`: containerConcurrency ≥ 1, so upstream has a breaker and exports its depth.
    QueueProxy { queue_depth: bool },
    /// KEDA's HTTP add-on's interceptor's: `interceptor_request_*`, by route.
    Interceptor,
}

/// What `/metrics` exports.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSettings {
    /// `opencensus`, `opentelemetry` or `both`. Default: `both`.
    pub names: MetricNames,
    /// Set by the role the binary runs as, never by the file. Default: the activator.
    #[serde(skip)]
    pub component: MetricsComponent,
}

// === [autoscaler] ===

/// The autoscaler's stat server, which this activator reports each revision's load to.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AutoscalerSettings {
    /// `ws://host:port[/path]` of the stat server. With one, readiness waits for the
    /// connection, as upstream's does; `""` turns reporting off. Default: with `SYSTEM_NAMESPACE`
    /// set (inside Knative), `ws://autoscaler.<SYSTEM_NAMESPACE>.svc.<cluster domain>:8080`, as
    /// upstream; without it (standalone), none: nothing is reported, readiness does not wait.
    pub url: Option<String>,
}

impl AutoscalerSettings {
    /// Why `url` is not one the link can dial, if it is not.
    pub fn check_url(url: &str) -> Result<(), String> {
        let parsed: hyper::Uri = url
            .parse()
            .map_err(|error| format!("{url:?} is not a URL: {error}"))?;
        match parsed.scheme_str() {
            Some("ws") => {}
            Some("wss") => {
                return Err(format!(
                    "{url:?}: wss:// is not supported (the stat link speaks plain websocket, as upstream's does)"
                ))
            }
            _ => return Err(format!("{url:?} must start with ws://")),
        }
        if parsed.host().is_none_or(str::is_empty) {
            return Err(format!("{url:?} has no host"));
        }
        Ok(())
    }
}

// === [control] ===

/// Default of `control.watch_interval_ms`: 1000 ms. Ours (upstream has no file to watch).
pub const DEFAULT_WATCH_INTERVAL_MS: u64 = 1000;
/// Default of `control.stale_sweep_seconds`: 60 s. Ours: the fork swept every 5 min; a minute
/// keeps collection close to the 10 min a pod must have been NotReady.
pub const DEFAULT_STALE_SWEEP_SECONDS: u64 = 60;

/// The control plane's tunables.
/// Default ops the state worker's channel holds before producers wait: 500, the fork's
/// `stateUpdateQueueSize`.
pub const DEFAULT_QUEUE_CAPACITY: usize = 500;

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ControlSettings {
    /// How often the configuration file is checked for changes, in milliseconds. Default:
    /// [`DEFAULT_WATCH_INTERVAL_MS`] (1000 ms).
    pub watch_interval_ms: u64,
    /// State changes the worker's channel holds before producers wait. Default:
    /// [`DEFAULT_QUEUE_CAPACITY`] (500 ops).
    pub state_queue_capacity: usize,
    /// Most pod trackers per revision; more pods are refused and counted. Default:
    /// [`DEFAULT_MAX_TRACKERS_PER_REVISION`] (5000 trackers).
    pub max_trackers_per_revision: usize,
    /// A queue-proxy `ready` outweighs the informer for this long, in seconds. Default:
    /// [`DEFAULT_QP_FRESHNESS`] (30 s).
    pub qp_freshness_seconds: u64,
    /// A queue-proxy `not-ready`/`draining` outweighs the informer for this long, in seconds.
    /// Default: [`DEFAULT_QP_STALENESS`] (60 s).
    pub qp_staleness_seconds: u64,
    /// How often idle NotReady trackers are looked for, in seconds. Default:
    /// [`DEFAULT_STALE_SWEEP_SECONDS`] (60 s).
    pub stale_sweep_seconds: u64,
}

impl Default for ControlSettings {
    fn default() -> Self {
        ControlSettings {
            watch_interval_ms: DEFAULT_WATCH_INTERVAL_MS,
            state_queue_capacity: DEFAULT_QUEUE_CAPACITY,
            max_trackers_per_revision: DEFAULT_MAX_TRACKERS_PER_REVISION,
            qp_freshness_seconds: DEFAULT_QP_FRESHNESS.as_secs(),
            qp_staleness_seconds: DEFAULT_QP_STALENESS.as_secs(),
            stale_sweep_seconds: DEFAULT_STALE_SWEEP_SECONDS,
        }
    }
}

// === [health] ===

/// Default of `health.probe_interval_ms`: 1000 ms. Ours: the fork checked a pod before every
/// request instead, and upstream probes pods that are not ready yet every 200 ms.
pub const DEFAULT_PROBE_INTERVAL_MS: u64 = 1000;
/// Default of `health.probe_timeout_ms`: 2000 ms. Ours: the fork's HTTP check allowed 5 s
/// (`podReadyCheckTimeout`), its TCP check before that 2 s.
pub const DEFAULT_PROBE_TIMEOUT_MS: u64 = 2000;
/// Default of `health.settled_probe_interval_ms`: 30 000 ms. Ours: upstream does not actively
/// probe ready pods at all; a settled pod is also watched by its queue-proxy's push, the kubelet
/// and every request it serves.
pub const DEFAULT_SETTLED_PROBE_INTERVAL_MS: u64 = 30_000;
/// Default of `health.probe_budget_per_second`: 200 probes of settled pods a second, so that idle
/// probing costs well under 1 % of a core however many pods there are.
pub const DEFAULT_PROBE_BUDGET_PER_SECOND: u32 = 200;

/// The active health check behind quarantine (the schedule: `sources::probe_schedule`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthSettings {
    /// Time between probes of a pod on probation or suspect (back from quarantine, or failed a
    /// probe), and within which a new pod gets its first probe, in milliseconds. Default:
    /// [`DEFAULT_PROBE_INTERVAL_MS`] (1000 ms).
    pub probe_interval_ms: u64,
    /// A probe slower than this fails, in milliseconds. Default: [`DEFAULT_PROBE_TIMEOUT_MS`]
    /// (2000 ms).
    pub probe_timeout_ms: u64,
    /// Time between probes of a settled pod (passed its probes), in milliseconds, as far as
    /// the budget allows. Default: [`DEFAULT_SETTLED_PROBE_INTERVAL_MS`] (30 000 ms).
    pub settled_probe_interval_ms: u64,
    /// Most probes of settled pods a second. Default: [`DEFAULT_PROBE_BUDGET_PER_SECOND`] (200).
    pub probe_budget_per_second: u32,
}

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings {
            probe_interval_ms: DEFAULT_PROBE_INTERVAL_MS,
            probe_timeout_ms: DEFAULT_PROBE_TIMEOUT_MS,
            settled_probe_interval_ms: DEFAULT_SETTLED_PROBE_INTERVAL_MS,
            probe_budget_per_second: DEFAULT_PROBE_BUDGET_PER_SECOND,
        }
    }
}

// === [cluster] ===

/// The other activators (standalone; Kubernetes reads them from the public endpoints).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSettings {
    /// This activator's IP among `activators`. Default: the `POD_IP` environment variable.
    pub self_ip: Option<std::net::IpAddr>,
    /// Every activator's IP, this one included, for splitting pods among them. Default empty:
    /// alone.
    pub activators: Vec<std::net::IpAddr>,
    /// Data-port addresses of the other activators, to relay queue-proxy registrations to.
    /// Default empty.
    pub peers: Vec<SocketAddr>,
}

// === [listen] ===

/// Default of `listen.http`: every address of both families (`[::]`, IPv4 clients included,
/// `reactor::any_address`), port 8012, Knative's `networking.BackendHTTPPort`, where upstream's
/// activator serves HTTP/1.
pub const DEFAULT_HTTP: SocketAddr = reactor::any_address(8012);
/// Default of `listen.http2`: every address, port 8013, Knative's
/// `networking.BackendHTTP2Port` (upstream's `h2c` listener). It serves HTTP/1.1 too, and
/// `listen.http` serves h2c too: as upstream, the port does not decide the protocol.
pub const DEFAULT_HTTP2: SocketAddr = reactor::any_address(8013);
/// Default of `listen.admin`: every address, port 9090, where upstream's activator serves
/// its metrics.
pub const DEFAULT_ADMIN: SocketAddr = reactor::any_address(9090);

/// Where to listen.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Listen {
    /// Data port (HTTP/1.1, and h2c by prior knowledge). Default: [`DEFAULT_HTTP`]
    /// (`[::]:8012`, both families).
    pub http: SocketAddr,
    /// Second data port, upstream's h2c port; serves exactly as `http`. Default:
    /// [`DEFAULT_HTTP2`] (`[::]:8013`).
    pub http2: SocketAddr,
    /// Admin port: `/metrics`, `/healthz`, `/readyz`. Default: [`DEFAULT_ADMIN`]
    /// (`[::]:9090`).
    pub admin: SocketAddr,
    /// TLS data port: serves what `http` serves (HTTP/1.1, and HTTP/2 by ALPN `h2` or by prior
    /// knowledge) over TLS, with the certificates of `[listen.tls]`. Default: none. Knative's
    /// is 8112 (`networking.BackendHTTPSPort`).
    pub https: Option<SocketAddr>,
    /// The TLS data port's certificates and settings; required with `https`.
    pub tls: Option<ListenTls>,
}

impl Default for Listen {
    fn default() -> Self {
        Listen {
            http: DEFAULT_HTTP,
            http2: DEFAULT_HTTP2,
            admin: DEFAULT_ADMIN,
            https: None,
            tls: None,
        }
    }
}

/// Default of `listen.tls.reload_seconds`: 60 s, how often Knative's queue-proxy looks at its
/// mounted certificate (`pkg/queue/certificate/watcher.go`).
pub const DEFAULT_TLS_RELOAD_SECONDS: u64 = 60;

/// `[listen.tls]`: what the TLS data port serves with.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenTls {
    /// Certificate chains (PEM, leaf first) and their keys (PEM: PKCS#1, PKCS#8 or SEC1). A
    /// client's server name (SNI) chooses the first whose certificate is valid for it; the
    /// first serves a client that names none, or a name none is valid for.
    pub certificates: Vec<CertificateFiles>,
    /// PEM CA certificates that client certificates are verified against. Default: none, no
    /// client certificate is asked for.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: whether a client must present a certificate (`true`) or may
    /// (`false`; one it presents is still verified). Default: `true`.
    #[serde(default = "default_true")]
    pub client_certificate_required: bool,
    /// `"1.2"` or `"1.3"`. Default: 1.3, as Knative's activator and queue-proxy.
    #[serde(default)]
    pub min_version: Option<String>,
    /// `"1.2"` or `"1.3"`. Default: none.
    #[serde(default)]
    pub max_version: Option<String>,
    /// TLS 1.2 suites by Go's names (TLS 1.3's are always on, as in Go). Default: all.
    #[serde(default)]
    pub cipher_suites: Vec<String>,
    /// Key-exchange groups by Go's names (`X25519`, `P-256`, `CurveP384`, …), in order.
    /// Default: the library's.
    #[serde(default)]
    pub curve_preferences: Vec<String>,
    /// ALPN protocols offered, in order of preference: `h2`, `http/1.1`. A request goes to its pod
    /// in the protocol it arrived in (as upstream), so a port in front of pods that speak only
    /// HTTP/1.1 offers only `http/1.1`. Default: [`crate::tls::SERVER_ALPN`] (`h2`, then
    /// `http/1.1`, as Go's server).
    #[serde(default = "default_alpn")]
    pub alpn: Vec<String>,
    /// Seconds between looks at the files: a change is served to new handshakes; a file that
    /// no longer reads, or a pair that no longer matches, keeps the last good certificates
    /// (logged). Default: [`DEFAULT_TLS_RELOAD_SECONDS`] (60 s).
    #[serde(default = "default_tls_reload_seconds")]
    pub reload_seconds: u64,
}

/// One certificate chain and its key.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CertificateFiles {
    pub chain: PathBuf,
    pub key: PathBuf,
}

fn default_alpn() -> Vec<String> {
    crate::tls::SERVER_ALPN.map(str::to_string).to_vec()
}

fn default_tls_reload_seconds() -> u64 {
    DEFAULT_TLS_RELOAD_SECONDS
}

impl ListenTls {
    /// The version, suite and curve settings in upstream's grammar (problems listed, keyed by
    /// the file's key names).
    pub fn settings(&self) -> crate::tls::TlsSettings {
        use crate::tls::settings::{read, FILE};
        read(FILE, |key| match key {
            _ if key == FILE.min_version => self.min_version.clone(),
            _ if key == FILE.max_version => self.max_version.clone(),
            _ if key == FILE.cipher_suites => Some(self.cipher_suites.join(",")),
            _ if key == FILE.curve_preferences => Some(self.curve_preferences.join(",")),
            _ => None,
        })
    }
}

// === [proxy] ===

/// Default of `proxy.drain_grace_seconds`: 45 s, Knative's `DefaultDrainTimeout`.
pub const DEFAULT_DRAIN_GRACE_SECONDS: u64 = 45;
/// Default of `proxy.max_queued_requests`: 100 000 requests. Ours: upstream's queue is
/// unbounded; this is ten revisions' worth of [`DEFAULT_QUEUE_DEPTH`].
pub const DEFAULT_MAX_QUEUED_REQUESTS: u32 = 100_000;

/// Proxy behaviour.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ProxySettings {
    /// Cluster domain for the Host fallback `<rev>.<ns>.svc.<domain>`. Default: from
    /// /etc/resolv.conf, then `CLUSTER_DOMAIN`, then [`DEFAULT_CLUSTER_DOMAIN`]
    /// (`cluster.local`).
    pub cluster_domain: Option<String>,
    /// Longest time to dial a pod, in milliseconds. Default: [`DEFAULT_CONNECT_TIMEOUT`]
    /// (5000 ms).
    pub connect_timeout_ms: u64,
    /// Idle upstream connections are closed after this many seconds. Default:
    /// [`DEFAULT_IDLE_TIMEOUT`] (90 s).
    pub upstream_idle_timeout_seconds: u64,
    /// Idle upstream connections per pod and shard kept for the whole idle timeout; those a
    /// peak needed beyond it are closed once idle for `SURPLUS_IDLE_TIMEOUT` (10 s), never on
    /// their return. Default: [`DEFAULT_MAX_IDLE_PER_POD`] (100 connections).
    pub max_idle_per_pod: usize,
    /// Seconds between SIGTERM (readiness fails at once) and closing the listeners. Default:
    /// [`DEFAULT_DRAIN_GRACE_SECONDS`] (45 s).
    pub drain_grace_seconds: u64,
    /// Most requests waiting for a pod over all revisions; more get 503
    /// `pending request queue full`. Default: [`DEFAULT_MAX_QUEUED_REQUESTS`] (100 000
    /// requests).
    pub max_queued_requests: u32,
    /// A new client connection's first request head must be complete within this many
    /// seconds of the accept, and any later head within this of its first byte; else the
    /// connection closes (upstream's `ReadHeaderTimeout`). Default: [`DEFAULT_HEAD_TIMEOUT`]
    /// (60 s).
    pub head_timeout_seconds: u64,
    /// Most client connections open per shard. At the limit the longest-idle keep-alive
    /// connection is closed to admit a new client; with none idle the shard pauses accepting
    /// (new clients wait in the kernel's queue) until one closes. Default:
    /// [`DEFAULT_MAX_CONNECTIONS_PER_SHARD`] (16 384 connections).
    pub max_connections_per_shard: usize,
    /// Most connections per shard in the middle of a request head that did not arrive in one
    /// read; at the limit the shard pauses accepting until one completes or closes. Default:
    /// [`DEFAULT_MAX_PENDING_HEADS_PER_SHARD`] (1 024 heads).
    pub max_pending_heads_per_shard: usize,
    /// Which of the three memory caps (`max_connections_per_shard`,
    /// `max_pending_heads_per_shard`, `max_queued_requests`) the file sets; the others follow
    /// the memory budget (`budget::fit`). Not a key of the file.
    #[serde(skip)]
    pub explicit_caps: ExplicitCaps,
    /// HTTP/2 streams a client may open at once on one connection. Default:
    /// [`DEFAULT_H2_MAX_CONCURRENT_STREAMS`] (250, as upstream's Go server).
    pub h2_max_concurrent_streams: u32,
    /// HTTP/2 flow-control window of each stream, both ways, in bytes (65 535 to 2³¹−1). Default:
    /// [`DEFAULT_H2_STREAM_WINDOW`] (1 MiB).
    pub h2_stream_window_bytes: u32,
    /// HTTP/2 flow-control window of a connection, both ways, in bytes (65 535 to 2³¹−1): the
    /// most the activator holds of one connection's bodies. Default:
    /// [`DEFAULT_H2_CONNECTION_WINDOW`] (2 MiB).
    pub h2_connection_window_bytes: u32,
    /// Largest HTTP/2 frame payload accepted, in bytes (16 384 to 16 777 215). Default:
    /// [`DEFAULT_H2_MAX_FRAME`] (16 KiB).
    pub h2_max_frame_bytes: u32,
    /// Largest HTTP/2 header block accepted (decoded), in bytes. Default:
    /// [`DEFAULT_H2_MAX_HEADER_LIST`] (64 KiB).
    pub h2_max_header_list_bytes: u32,
}

impl Default for ProxySettings {
    fn default() -> Self {
        ProxySettings {
            cluster_domain: None,
            // 5 s in milliseconds: the cast cannot truncate.
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT.as_millis() as u64,
            upstream_idle_timeout_seconds: DEFAULT_IDLE_TIMEOUT.as_secs(),
            max_idle_per_pod: DEFAULT_MAX_IDLE_PER_POD,
            drain_grace_seconds: DEFAULT_DRAIN_GRACE_SECONDS,
            max_queued_requests: DEFAULT_MAX_QUEUED_REQUESTS,
            head_timeout_seconds: DEFAULT_HEAD_TIMEOUT.as_secs(),
            max_connections_per_shard: DEFAULT_MAX_CONNECTIONS_PER_SHARD,
            max_pending_heads_per_shard: DEFAULT_MAX_PENDING_HEADS_PER_SHARD,
            explicit_caps: ExplicitCaps::default(),
            h2_max_concurrent_streams: DEFAULT_H2_MAX_CONCURRENT_STREAMS,
            h2_stream_window_bytes: DEFAULT_H2_STREAM_WINDOW,
            h2_connection_window_bytes: DEFAULT_H2_CONNECTION_WINDOW,
            h2_max_frame_bytes: DEFAULT_H2_MAX_FRAME,
            h2_max_header_list_bytes: DEFAULT_H2_MAX_HEADER_LIST,
        }
    }
}

/// Which memory caps a configuration sets itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExplicitCaps {
    pub max_connections_per_shard: bool,
    pub max_pending_heads_per_shard: bool,
    pub max_queued_requests: bool,
}

impl ProxySettings {
    /// The HTTP/2 settings the shards use, towards clients and pods.
    pub fn h2(&self) -> H2Settings {
        H2Settings {
            max_concurrent_streams: self.h2_max_concurrent_streams,
            stream_window: self.h2_stream_window_bytes,
            connection_window: self.h2_connection_window_bytes,
            max_frame: self.h2_max_frame_bytes,
            max_header_list: self.h2_max_header_list_bytes,
        }
    }
}

// === [[revisions]] ===

/// One revision and its pods.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RevisionConfig {
    /// Required.
    pub namespace: String,
    /// Required.
    pub name: String,
    /// Metric label `service_name`. Default empty.
    #[serde(default)]
    pub service: String,
    /// Metric label `configuration_name`. Default empty.
    #[serde(default)]
    pub configuration: String,
    /// Requests one pod may take at once; 0 = unlimited. Default 0 (unlimited), as upstream's
    /// `container-concurrency`.
    #[serde(default)]
    pub container_concurrency: u32,
    /// `http1` (the default) or `h2c`. As upstream, the protocol a request arrived in decides the
    /// one it goes to the pod in; `h2c` only changes the port a queue-proxy's bare `pod_ip`
    /// maps to ([`DEFAULT_H2C_SERVING_PORT`]).
    #[serde(default)]
    pub protocol: ProtocolName,
    /// Whole-request timeout in seconds, queueing included. Default: [`DEFAULT_TIMEOUT`] (300 s).
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: u64,
    /// Time to first response byte in seconds; 0 = off. Default 0 (off).
    #[serde(default)]
    pub response_start_timeout_seconds: u64,
    /// Longest gap between response writes in seconds; 0 = off. Default 0 (off).
    #[serde(default)]
    pub idle_timeout_seconds: u64,
    /// `random-choice-2`, `first-available`, `round-robin` or `least-connections`. Default by
    /// containerConcurrency, as upstream ([`LbPolicy::default_for`]).
    #[serde(default)]
    pub load_balancing_policy: Option<LbPolicyName>,
    /// Most requests that may wait for a free pod slot; more get 503
    /// `pending request queue full`. Default: [`DEFAULT_QUEUE_DEPTH`] (10 000 requests).
    #[serde(default = "default_queue_depth")]
    pub queue_depth: u32,
    /// Port a queue-proxy's bare `pod_ip` maps to. Default: [`DEFAULT_SERVING_PORT`] (8012;
    /// [`DEFAULT_H2C_SERVING_PORT`], 8013, for `h2c`).
    #[serde(default)]
    pub serving_port: Option<u16>,
    /// Cluster-IP mode: the address (`ip:port`) of the revision's private Service. Requests go
    /// there (kube-proxy or the mesh picks the pod) instead of to the pods, and this activator
    /// admits `max(1, container_concurrency × routable pods / activators)` of them at once;
    /// `pods` and queue-proxy registrations then only count, and pods are not probed. Default:
    /// none (pod mode).
    #[serde(default)]
    pub cluster_ip: Option<SocketAddr>,
    /// Pod addresses `ip:port`, routable from the start (the informer's view, standalone).
    /// Default empty.
    #[serde(default)]
    pub pods: Vec<SocketAddr>,
    /// `[revisions.priority]`: priority bands and per-tenant fairness among the revision's
    /// waiting requests (README, "Priority and fairness"). Default: none (arrival order).
    #[serde(default)]
    pub priority: Option<PriorityConfig>,
    /// `[revisions.tls]`: the pods are dialled over TLS. Default: none (plain TCP).
    #[serde(default)]
    pub tls: Option<RevisionTls>,
}

/// How a revision's pods are dialled over TLS: TLS 1.3, no ALPN (HTTP/2 by prior knowledge
/// inside TLS, as Knative's activator dials its queue-proxies), never plain as a fallback.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RevisionTls {
    /// PEM CA certificates the pods' certificates must chain to (nothing else is trusted).
    pub ca: PathBuf,
    /// Sent as SNI and verified as the certificate's name (Knative: `data-plane.knative.dev`).
    pub server_name: String,
    /// A DNS name the certificate must carry besides (Knative: `kn-user-<namespace>`).
    /// Default: none.
    #[serde(default)]
    pub require_name: Option<String>,
    /// The client built from `ca` when the file is loaded ([`Config::load`]), once; a changed
    /// CA file is read with the next change of the configuration file.
    #[serde(skip)]
    pub loaded: Option<crate::tls::PodTls>,
}

/// `[revisions.priority]`: how a revision's waiting requests are ordered.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PriorityConfig {
    /// The policy is on. Default true (the table's presence turns it on; `false` keeps the
    /// revision in arrival order, its other keys still checked).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Number of priority bands, 1 to 16 (`MAX_BANDS`). Default: [`DEFAULT_BANDS`] (3).
    #[serde(default = "default_bands")]
    pub bands: u8,
    /// Band of a request without a valid priority header. Default: the middle band,
    /// [`default_band_of`]`(bands)` (1 of 3).
    #[serde(default)]
    pub default_band: Option<u8>,
    /// Header carrying a request's band (an integer, higher served first). Default:
    /// [`DEFAULT_PRIORITY_HEADER`] (`K-Priority`).
    #[serde(default = "default_priority_header")]
    pub priority_header: String,
    /// Header carrying a request's fairness key (its tenant). Default:
    /// [`DEFAULT_TENANT_HEADER`] (`K-Tenant`).
    #[serde(default = "default_tenant_header")]
    pub tenant_header: String,
    /// The priority header is set by a hop the operator trusts (which strips what clients
    /// send): its band is taken as it is. Default false: it may only lower a request's band.
    #[serde(default)]
    pub priority_header_trusted: bool,
    /// Fairness keys with a band of their own (`"premium" = 2`). Default none.
    #[serde(default)]
    pub tenant_bands: BTreeMap<String, u8>,
}

fn default_true() -> bool {
    true
}

fn default_bands() -> u8 {
    DEFAULT_BANDS
}

fn default_priority_header() -> String {
    DEFAULT_PRIORITY_HEADER.to_string()
}

fn default_tenant_header() -> String {
    DEFAULT_TENANT_HEADER.to_string()
}

impl PriorityConfig {
    /// The policy the table describes, whether or not it is enabled.
    pub fn policy(&self) -> PriorityPolicy {
        PriorityPolicy {
            bands: self.bands,
            default_band: self.default_band.unwrap_or(default_band_of(self.bands)),
            priority_header: self.priority_header.clone(),
            tenant_header: self.tenant_header.clone(),
            trusted: self.priority_header_trusted,
            tenant_bands: self
                .tenant_bands
                .iter()
                .map(|(key, band)| (key.clone(), *band))
                .collect(),
        }
    }
}

fn default_timeout_seconds() -> u64 {
    DEFAULT_TIMEOUT.as_secs()
}

fn default_queue_depth() -> u32 {
    DEFAULT_QUEUE_DEPTH
}

/// Protocol names the file may spell.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(try_from = "String")]
pub enum ProtocolName {
    #[default]
    Http1,
    H2c,
}

impl TryFrom<String> for ProtocolName {
    type Error = String;

    fn try_from(name: String) -> Result<ProtocolName, String> {
        match name.as_str() {
            "http1" => Ok(ProtocolName::Http1),
            "h2c" => Ok(ProtocolName::H2c),
            _ => Err(format!(
                "unknown protocol {name:?}, expected \"http1\" or \"h2c\""
            )),
        }
    }
}

/// Load-balancing policy names accepted in the file.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum LbPolicyName {
    RandomChoice2,
    FirstAvailable,
    RoundRobin,
    LeastConnections,
}

impl RevisionConfig {
    /// A revision with every optional key at its default, as a file that sets only
    /// `namespace` and `name` gives (for revisions built in code, like the demo's).
    pub fn new(namespace: &str, name: &str) -> RevisionConfig {
        RevisionConfig {
            namespace: namespace.to_string(),
            name: name.to_string(),
            service: String::new(),
            configuration: String::new(),
            container_concurrency: 0,
            protocol: ProtocolName::default(),
            timeout_seconds: default_timeout_seconds(),
            response_start_timeout_seconds: 0,
            idle_timeout_seconds: 0,
            load_balancing_policy: None,
            queue_depth: default_queue_depth(),
            serving_port: None,
            cluster_ip: None,
            pods: Vec::new(),
            priority: None,
            tls: None,
        }
    }

    /// The revision's priority policy when its `[revisions.priority]` is there and enabled.
    pub fn priority_policy(&self) -> Option<PriorityPolicy> {
        self.priority
            .as_ref()
            .filter(|priority| priority.enabled)
            .map(PriorityConfig::policy)
    }

    pub fn protocol(&self) -> Protocol {
        match self.protocol {
            ProtocolName::Http1 => Protocol::Http1,
            ProtocolName::H2c => Protocol::H2c,
        }
    }

    pub fn lb_policy(&self) -> LbPolicy {
        match self.load_balancing_policy {
            None => LbPolicy::default_for(self.container_concurrency),
            Some(LbPolicyName::RandomChoice2) => LbPolicy::RandomChoice2,
            Some(LbPolicyName::FirstAvailable) => LbPolicy::FirstAvailable,
            Some(LbPolicyName::RoundRobin) => LbPolicy::RoundRobin,
            Some(LbPolicyName::LeastConnections) => LbPolicy::LeastConnections,
        }
    }

    pub fn serving_port(&self) -> u16 {
        self.serving_port.unwrap_or(match self.protocol {
            ProtocolName::Http1 => DEFAULT_SERVING_PORT,
            ProtocolName::H2c => DEFAULT_H2C_SERVING_PORT,
        })
    }

    pub fn timeouts(&self) -> Timeouts {
        let optional = |seconds: u64| (seconds > 0).then(|| Duration::from_secs(seconds));
        Timeouts {
            total: Duration::from_secs(self.timeout_seconds),
            response_start: optional(self.response_start_timeout_seconds),
            idle: optional(self.idle_timeout_seconds),
        }
    }
}

/// A configuration that could not be loaded, with where and why.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, when loaded from one.
    pub source: Option<String>,
    /// 1-based line and column of the problem, when known.
    pub position: Option<(usize, usize)>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(source) = &self.source {
            write!(f, "{source}:")?;
        }
        if let Some((line, column)) = self.position {
            write!(f, "{line}:{column}: ")?;
        } else if self.source.is_some() {
            f.write_str(" ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// A value the file sets that validation refused, at `position` when known.
    fn invalid(position: Option<(usize, usize)>, message: String) -> ConfigError {
        ConfigError {
            source: None,
            position,
            message,
        }
    }
}

impl Config {
    /// Parses and validates configuration text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let toml_error = |error: toml::de::Error| ConfigError {
            source: None,
            position: error.span().map(|span| line_and_column(text, span.start)),
            message: error.message().trim_end().to_string(),
        };
        // The spanned document is kept for validation, which needs to say where a value is.
        let document = DeTable::parse(text).map_err(toml_error)?;
        let mut config = Config::deserialize(toml::de::Deserializer::from(document.clone()))
            .map_err(toml_error)?;
        let spans = Spans {
            text,
            root: document.get_ref(),
        };
        config.validate(&spans)?;
        let set = |key: &str| spans.table_value("proxy", key).is_some();
        config.proxy.explicit_caps = ExplicitCaps {
            max_connections_per_shard: set("max_connections_per_shard"),
            max_pending_heads_per_shard: set("max_pending_heads_per_shard"),
            max_queued_requests: set("max_queued_requests"),
        };
        Ok(config)
    }

    /// The tracing the file asks for: its `[tracing]`, or off without one. A table that does
    /// not validate (only one built in code can get here) is off too.
    pub fn tracing_config(&self) -> TracingConfig {
        self.tracing
            .as_ref()
            .and_then(|tracing| tracing.config().ok())
            .unwrap_or(TracingConfig::OFF)
    }

    /// Parses and validates the bytes of a file. Bytes that are not UTF-8 are an error at the
    /// first one that is not, like any other in the file.
    pub fn parse_bytes(bytes: &[u8]) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|error| {
            // The prefix up to the bad byte is valid UTF-8 by definition.
            let valid = std::str::from_utf8(&bytes[..error.valid_up_to()]).unwrap_or_default();
            ConfigError {
                source: None,
                position: Some(line_and_column(valid, valid.len())),
                message: "not UTF-8 text".to_string(),
            }
        })?;
        Config::parse(text)
    }

    /// Reads and parses a file; errors carry the file name.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let bytes = std::fs::read(path).map_err(|error| ConfigError {
            source: Some(path.display().to_string()),
            position: None,
            message: format!("cannot read: {error}"),
        })?;
        Config::from_file(&bytes).map_err(|mut error| {
            error.source = Some(path.display().to_string());
            error
        })
    }

    /// The configuration a file's bytes make, as start-up and every reload take it: parsed,
    /// validated, and each `[revisions.tls]` client built from its CA file.
    pub fn from_file(bytes: &[u8]) -> Result<Config, ConfigError> {
        let mut config = Config::parse_bytes(bytes)?;
        config.read_revision_tls()?;
        Ok(config)
    }

    /// Reads each `[revisions.tls]` CA file and checks that the client it makes can be built:
    /// a revision is never dialled in plain for want of its TLS.
    pub fn read_revision_tls(&mut self) -> Result<(), ConfigError> {
        for revision in &mut self.revisions {
            let Some(tls) = &mut revision.tls else {
                continue;
            };
            let what = format!(
                "revision {}/{}: tls.ca {}",
                revision.namespace,
                revision.name,
                tls.ca.display()
            );
            let pem = std::fs::read(&tls.ca).map_err(|error| ConfigError {
                source: None,
                position: None,
                message: format!("{what}: cannot read: {error}"),
            })?;
            let loaded =
                crate::tls::PodTls::new(&what, &pem, &tls.server_name, tls.require_name.as_deref())
                    .map_err(|error| ConfigError {
                        source: None,
                        position: None,
                        message: error.to_string(),
                    })?;
            tls.loaded = Some(loaded);
        }
        Ok(())
    }

    /// `listen.https` and `[listen.tls]` come together; the port is one of its own; the
    /// settings read in upstream's grammar.
    fn validate_tls(&self, spans: &Spans<'_>) -> Result<(), ConfigError> {
        let listen = &self.listen;
        let Some(https) = listen.https else {
            if listen.tls.is_some() {
                return Err(ConfigError::invalid(
                    spans.table_value("listen", "tls"),
                    "[listen.tls] without listen.https: set the TLS port too".to_string(),
                ));
            }
            return Ok(());
        };
        for (name, other) in [("http", listen.http), ("http2", listen.http2)] {
            let overlap = https.ip() == other.ip()
                || https.ip().is_unspecified()
                || other.ip().is_unspecified();
            if https.port() == other.port() && overlap && https.port() != 0 {
                return Err(ConfigError::invalid(
                    spans.table_value("listen", "https"),
                    format!("listen.https must differ from listen.{name} ({other})"),
                ));
            }
        }
        // Without certificates here, start-up decides: watching a cluster with
        // system-internal-tls, they come from its Secret; otherwise it is refused.
        let Some(tls) = &listen.tls else {
            return Ok(());
        };
        if tls.certificates.is_empty() {
            return Err(ConfigError::invalid(
                spans.table_value("listen", "tls"),
                "listen.tls.certificates: at least one { chain, key }".to_string(),
            ));
        }
        let mut offered = HashSet::new();
        if tls.alpn.is_empty()
            || tls
                .alpn
                .iter()
                .any(|p| !crate::tls::SERVER_ALPN.contains(&p.as_str()) || !offered.insert(p))
        {
            return Err(ConfigError::invalid(
                spans.table_value("listen", "tls"),
                format!(
                    "listen.tls.alpn: {:?} is not a list of \"h2\" and \"http/1.1\", each at most once",
                    tls.alpn
                ),
            ));
        }
        if !(1..=86_400).contains(&tls.reload_seconds) {
            return Err(ConfigError::invalid(
                spans.table_value("listen", "tls"),
                format!(
                    "listen.tls.reload_seconds must be within 1..=86400, not {}",
                    tls.reload_seconds
                ),
            ));
        }
        if let Some((key, problem)) = tls.settings().problems.into_iter().next() {
            return Err(ConfigError::invalid(
                spans.table_value("listen", "tls"),
                format!("{key}: {problem}"),
            ));
        }
        Ok(())
    }

    /// Checks what the types cannot say. Every error points at the value it is about.
    fn validate(&self, spans: &Spans<'_>) -> Result<(), ConfigError> {
        if let Some(url) = self.autoscaler.url.as_ref().filter(|url| !url.is_empty()) {
            AutoscalerSettings::check_url(url).map_err(|why| {
                ConfigError::invalid(
                    spans.table_value("autoscaler", "url"),
                    format!("autoscaler.url: {why}"),
                )
            })?;
        }
        let control = &self.control;
        if control.qp_freshness_seconds > control.qp_staleness_seconds {
            // One of the two is set in the file (the defaults agree); point at that one.
            let position = spans
                .table_value("control", "qp_freshness_seconds")
                .or_else(|| spans.table_value("control", "qp_staleness_seconds"));
            return Err(ConfigError::invalid(
                position,
                format!(
                    "control.qp_freshness_seconds ({}) may not exceed control.qp_staleness_seconds ({})",
                    control.qp_freshness_seconds, control.qp_staleness_seconds
                ),
            ));
        }
        // Every number the file sets has a floor and a ceiling (issue: no value from input may
        // reach arithmetic that panics, nor allocate without bound): the ceilings are far beyond
        // any sensible setting and far inside what timers, channels and counters can take.
        let proxy = &self.proxy;
        let health = &self.health;
        let kubernetes = &self.kubernetes;
        for (table, key, value, least, most) in [
            (
                "control",
                "watch_interval_ms",
                control.watch_interval_ms,
                1,
                MAX_INTERVAL_MS,
            ),
            (
                "control",
                "state_queue_capacity",
                control.state_queue_capacity as u64,
                1,
                MAX_COUNT,
            ),
            (
                "control",
                "max_trackers_per_revision",
                control.max_trackers_per_revision as u64,
                1,
                MAX_COUNT,
            ),
            (
                "control",
                "qp_freshness_seconds",
                control.qp_freshness_seconds,
                0,
                MAX_SETTING_SECONDS,
            ),
            (
                "control",
                "qp_staleness_seconds",
                control.qp_staleness_seconds,
                0,
                MAX_SETTING_SECONDS,
            ),
            (
                "control",
                "stale_sweep_seconds",
                control.stale_sweep_seconds,
                1,
                MAX_SETTING_SECONDS,
            ),
            (
                "health",
                "probe_interval_ms",
                health.probe_interval_ms,
                1,
                MAX_INTERVAL_MS,
            ),
            (
                "health",
                "probe_timeout_ms",
                health.probe_timeout_ms,
                1,
                MAX_INTERVAL_MS,
            ),
            (
                "health",
                "settled_probe_interval_ms",
                health.settled_probe_interval_ms,
                1,
                MAX_SETTING_SECONDS * 1000,
            ),
            (
                "health",
                "probe_budget_per_second",
                u64::from(health.probe_budget_per_second),
                1,
                MAX_COUNT,
            ),
            (
                "kubernetes",
                "probe_interval_ms",
                kubernetes.probe_interval_ms,
                1,
                MAX_INTERVAL_MS,
            ),
            (
                "kubernetes",
                "probe_timeout_ms",
                kubernetes.probe_timeout_ms,
                1,
                MAX_INTERVAL_MS,
            ),
            (
                "proxy",
                "connect_timeout_ms",
                proxy.connect_timeout_ms,
                1,
                MAX_INTERVAL_MS,
            ),
            (
                "proxy",
                "upstream_idle_timeout_seconds",
                proxy.upstream_idle_timeout_seconds,
                1,
                MAX_SETTING_SECONDS,
            ),
            (
                "proxy",
                "max_idle_per_pod",
                proxy.max_idle_per_pod as u64,
                0,
                MAX_COUNT,
            ),
            (
                "proxy",
                "drain_grace_seconds",
                proxy.drain_grace_seconds,
                0,
                MAX_SETTING_SECONDS,
            ),
            (
                "proxy",
                "head_timeout_seconds",
                proxy.head_timeout_seconds,
                1,
                MAX_SETTING_SECONDS,
            ),
            (
                "proxy",
                "max_queued_requests",
                u64::from(proxy.max_queued_requests),
                1,
                MAX_QUEUED,
            ),
            (
                "proxy",
                "max_connections_per_shard",
                proxy.max_connections_per_shard as u64,
                1,
                MAX_COUNT,
            ),
            (
                "proxy",
                "max_pending_heads_per_shard",
                proxy.max_pending_heads_per_shard as u64,
                1,
                MAX_COUNT,
            ),
            (
                "proxy",
                "h2_max_concurrent_streams",
                u64::from(proxy.h2_max_concurrent_streams),
                1,
                MAX_COUNT,
            ),
            (
                "proxy",
                "h2_max_header_list_bytes",
                u64::from(proxy.h2_max_header_list_bytes),
                1,
                16 << 20,
            ),
        ] {
            check_range(
                spans.table_value(table, key),
                &format!("{table}.{key}"),
                value,
                least,
                most,
            )?;
        }
        // RFC 9113 §6.5.2 bounds of the window and frame sizes.
        for (key, value, low, high) in [
            (
                "h2_stream_window_bytes",
                self.proxy.h2_stream_window_bytes,
                65_535,
                (1 << 31) - 1,
            ),
            (
                "h2_connection_window_bytes",
                self.proxy.h2_connection_window_bytes,
                65_535,
                (1 << 31) - 1,
            ),
            (
                "h2_max_frame_bytes",
                self.proxy.h2_max_frame_bytes,
                16_384,
                16_777_215,
            ),
        ] {
            if !(low..=high).contains(&value) {
                return Err(ConfigError::invalid(
                    spans.table_value("proxy", key),
                    format!("proxy.{key} must be between {low} and {high}"),
                ));
            }
        }
        // The file's `[features]` holds our two gates only (the config-features ConfigMap,
        // which every Knative component shares, may hold anything; it is read elsewhere).
        for key in self.features.keys() {
            if !crate::features::GATES.contains(&key.as_str()) {
                return Err(ConfigError::invalid(
                    spans.table_value("features", key),
                    format!(
                        "features: unknown key {key:?} (known: {})",
                        crate::features::GATES.join(", ")
                    ),
                ));
            }
        }
        let (http, http2) = (self.listen.http, self.listen.http2);
        // An unspecified address takes its port on every address (`[::]` on both families).
        let overlap =
            http.ip() == http2.ip() || http.ip().is_unspecified() || http2.ip().is_unspecified();
        if http.port() == http2.port() && overlap && http.port() != 0 {
            // The file sets at least one of the two (their defaults differ); point at it.
            return Err(ConfigError::invalid(
                spans
                    .table_value("listen", "http2")
                    .or_else(|| spans.table_value("listen", "http")),
                format!(
                    "listen.http2 must differ from listen.http ({}): each is a port of its own",
                    self.listen.http
                ),
            ));
        }
        self.validate_tls(spans)?;
        if let Some(tracing) = &self.tracing {
            tracing.config().map_err(|(key, problem)| {
                ConfigError::invalid(
                    spans
                        .table_value("tracing", key)
                        .or_else(|| spans.table("tracing")),
                    format!("tracing.{key}: {problem}"),
                )
            })?;
        }
        let mut seen = HashSet::new();
        for (index, revision) in self.revisions.iter().enumerate() {
            let at = |key: &str| spans.revision_value(index, key);
            for (key, value) in [("namespace", &revision.namespace), ("name", &revision.name)] {
                if value.is_empty() || value.contains('/') || value.chars().any(char::is_whitespace)
                {
                    return Err(ConfigError::invalid(
                        at(key),
                        format!(
                            "revision {key} {value:?} must be non-empty, without '/' or spaces"
                        ),
                    ));
                }
            }
            let key = format!("{}/{}", revision.namespace, revision.name);
            if !seen.insert((revision.namespace.as_str(), revision.name.as_str())) {
                return Err(ConfigError::invalid(
                    at("name"),
                    format!("revision {key} is declared twice"),
                ));
            }
            for (field, value, least) in [
                ("timeout_seconds", revision.timeout_seconds, 1),
                (
                    "response_start_timeout_seconds",
                    revision.response_start_timeout_seconds,
                    0,
                ),
                ("idle_timeout_seconds", revision.idle_timeout_seconds, 0),
            ] {
                check_range(
                    at(field),
                    &format!("revision {key}: {field}"),
                    value,
                    least,
                    MAX_TIMEOUT_SECONDS,
                )?;
            }
            check_range(
                at("queue_depth"),
                &format!("revision {key}: queue_depth"),
                u64::from(revision.queue_depth),
                1,
                MAX_QUEUED,
            )?;
            if let Some(priority) = &revision.priority {
                if let Err(error) = priority.policy().check() {
                    return Err(ConfigError::invalid(
                        spans.revision_priority_value(index, error.field),
                        format!("revision {key}: priority.{} {}", error.field, error.reason),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Ceiling of every interval and timeout in milliseconds the file sets: one hour.
pub const MAX_INTERVAL_MS: u64 = 60 * 60 * 1000;
/// Ceiling of every period in seconds the file sets (grace, sweeps, freshness): one day.
pub const MAX_SETTING_SECONDS: u64 = 24 * 60 * 60;
/// Ceiling of every count the file sets (queues, trackers, connections, streams): 2²⁰.
pub const MAX_COUNT: u64 = 1 << 20;
/// Ceiling of the queue bounds (`queue_depth`, `max_queued_requests`): 10⁷ requests, about
/// 20 GiB of waiting requests at 2 KiB each.
pub const MAX_QUEUED: u64 = 10_000_000;

/// `value` within `least..=most`, or an error naming `what` at `position`.
fn check_range(
    position: Option<(usize, usize)>,
    what: &str,
    value: u64,
    least: u64,
    most: u64,
) -> Result<(), ConfigError> {
    if (least..=most).contains(&value) {
        return Ok(());
    }
    let message = if value < least {
        format!("{what} must be at least {least}")
    } else {
        format!("{what} is {value}, more than the most allowed, {most}")
    };
    Err(ConfigError::invalid(position, message))
}

/// The parsed document beside the typed config: where each value sits in the text.
struct Spans<'a> {
    text: &'a str,
    root: &'a DeTable<'a>,
}

impl Spans<'_> {
    /// Line and column of `[table]`'s `key` value, when the file sets it.
    fn table_value(&self, table: &str, key: &str) -> Option<(usize, usize)> {
        self.value_in(self.root.get(table)?.get_ref().as_table()?, key)
    }

    /// Line and column of `[table]` itself, when the file has it.
    fn table(&self, table: &str) -> Option<(usize, usize)> {
        Some(line_and_column(
            self.text,
            self.root.get(table)?.span().start,
        ))
    }

    /// Line and column of `key`'s value in the `index`th `[[revisions]]` table, when set.
    fn revision_value(&self, index: usize, key: &str) -> Option<(usize, usize)> {
        let revisions = self.root.get("revisions")?.get_ref().as_array()?;
        self.value_in(revisions.get(index)?.get_ref().as_table()?, key)
    }

    /// Line and column of `key`'s value in the `index`th revision's `priority` table (or of
    /// the table, when the key is a default).
    fn revision_priority_value(&self, index: usize, key: &str) -> Option<(usize, usize)> {
        let revisions = self.root.get("revisions")?.get_ref().as_array()?;
        let revision = revisions.get(index)?.get_ref().as_table()?;
        let priority = revision.get("priority")?;
        match priority.get_ref().as_table() {
            Some(table) if table.contains_key(key) => self.value_in(table, key),
            _ => Some(line_and_column(self.text, priority.span().start)),
        }
    }

    fn value_in(&self, table: &DeTable<'_>, key: &str) -> Option<(usize, usize)> {
        let value = table.get(key)?;
        Some(line_and_column(self.text, value.span().start))
    }
}

fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map_or(0, |last| last.chars().count())
        + 1;
    (line, column)
}

#[cfg(test)]
mod tests;
