//! `kactivator keda-http`: the same request path as the activator, run as KEDA's HTTP add-on's
//! interceptor and external scaler in one process (issue 40), configured by the add-on's
//! environment (`kactivator_control::keda::env`).
//!
//! What the role changes (`kactivator_shards::role::Interceptor`): a request's route is the
//! HTTPScaledObject whose hosts, path prefixes and headers match it, in the add-on's
//! precedence; it goes straight to one of the route's ready endpoints (its Service's
//! EndpointSlices), held while there is none; a per-pod concurrency limit from the
//! `kactivator.dev/container-concurrency` annotation (★). A data port (`KEDA_HTTP_PROXY_PORT`,
//! HTTP/1.1 and h2c) and, with `KEDA_HTTP_PROXY_TLS_ENABLED`, a TLS port
//! (`KEDA_HTTP_PROXY_TLS_PORT`) whose requests reach pods over TLS (`keda::tls`); health and
//! metrics on `KEDA_HTTP_ADMIN_PORT`, KEDA's external scaler and gRPC health on
//! `KEDA_HTTP_SCALER_PORT`.

use std::net::SocketAddr;

use kactivator_control::config::Config;
use kactivator_control::drain::DrainRule;
use kactivator_control::keda::env;
use kactivator_control::keda::peers::PeerService;
use kactivator_shards::role::{Interceptor, Roles};
use kactivator_shards::runtime::reactor;

use crate::cli::Cli;
use crate::start::{self, KedaSetup, RoleSetup, StartError};

pub fn run(cli: &Cli) -> Result<(), StartError> {
    let env = env::parse(|key| std::env::var(key).ok())?;
    if !env.not_acted_on.is_empty() {
        tracing::warn!(
            keys = ?env.not_acted_on,
            "set for KEDA's HTTP add-on but not acted on here (README: As KEDA's HTTP add-on)"
        );
    }
    let mut config = Config::default();
    config.listen.http = reactor::any_address(env.proxy_port);
    config.listen.admin = reactor::any_address(env.admin_port);
    config.metrics.component = kactivator_control::config::MetricsComponent::Interceptor;
    // No active health checks: the add-on has none (a pod is ready when its EndpointSlice says
    // so, from the kubelet's own probes), and the prober's check is a Knative queue-proxy's
    // (`K-Network-Probe: queue`, answered `queue`), which a plain app cannot pass: every new pod
    // would be probed once, fail and stay quarantined. A pod a shard cannot reach is still
    // passed over for a moment by that shard (`LocalPod::hold_off`).
    config.features.insert(
        kactivator_control::features::POD_QUARANTINE.to_owned(),
        "disabled".to_owned(),
    );
    config.proxy.drain_grace_seconds = env.shutdown_delay.as_secs();
    config.proxy.connect_timeout_ms =
        u64::try_from(env.connect_timeout.as_millis()).unwrap_or(u64::MAX);
    let scaler: SocketAddr = reactor::any_address(env.scaler_port);
    let mut setup = RoleSetup::activator(cli);
    // Its own footprint, not the activator's: under the add-on's chart limit (64 MiB) the
    // activator's reserve would leave nothing and the pod would crash-loop.
    setup.needs = kactivator_control::budget::Needs::keda_http();
    let mut upstream_tls = None;
    if let Some(proxy_tls) = &env.tls {
        let tls = kactivator_control::keda::tls::load(proxy_tls)?;
        config.listen.https = Some(reactor::any_address(proxy_tls.port));
        tracing::info!(
            port = proxy_tls.port,
            certificates = tls.files.certificates.len(),
            verify_pods = !proxy_tls.skip_verify,
            "keda-http: TLS port on; its requests reach pods over TLS"
        );
        setup.server_tls = Some(tls.files);
        upstream_tls = Some(tls.upstream);
    }
    setup.role = Roles::Interceptor(Interceptor {
        cold_start_field: env.cold_start_header,
    });
    setup.second_data_port = false;
    setup.finds_autoscaler = false;
    setup.drain_rule = DrainRule::Grace;
    setup.drain_timeout = env.drain_timeout;
    // The add-on's caps are over the process (per pod, and over every pod); each shard placed
    // keeps its share.
    setup.idle_per_pod_in_all_shards = Some(env.max_idle_per_host);
    setup.idle_in_all_shards = env.max_idle;
    if env.log_requests {
        let (sink, writer) = kactivator_shards::request::log::sink::start(
            std::io::stdout(),
            kactivator_shards::request::log::sink::DEFAULT_QUEUE_LINES,
        )
        .map_err(|error| {
            StartError::Shard(format!("starting the request log's writer: {error}"))
        })?;
        setup.request_log = Some(crate::start::RequestLogSetup {
            log: std::sync::Arc::new(kactivator_shards::request::log::RequestLog::combined(sink)),
            writer,
        });
    }
    setup.metrics_port = env.metrics_port.map(reactor::any_address);
    setup.trace_resource.service_name = "keda-add-ons-http-interceptor".into();
    let me = std::env::var("POD_IP").ok().and_then(|ip| ip.parse().ok());
    let peers = env.peers.map(|(namespace, service, port)| {
        if me.is_none() {
            tracing::warn!(
                "POD_IP not set: this replica cannot tell itself from the others in \
                 {namespace}/{service}, and counts its own requests twice"
            );
        }
        PeerService {
            namespace,
            service,
            port,
            me,
        }
    });
    if peers.is_none() {
        tracing::info!(
            "KEDA_HTTP_SCALER_TARGET_ADMIN_NAMESPACE not set: the scaler answers with this \
             replica's counts only (run one replica)"
        );
    }
    setup.keda = Some(KedaSetup {
        namespace: env.watch_namespace,
        defaults: env.defaults,
        scaler,
        peers,
        upstream_tls,
        stream_every: env.stream_interval,
    });
    tracing::info!(
        proxy = env.proxy_port,
        admin = env.admin_port,
        scaler = env.scaler_port,
        shutdown_delay_ms = env.shutdown_delay.as_millis() as u64,
        "keda-http: KEDA's HTTP add-on role"
    );
    start::run_as(cli, Some(config), setup, || {})
}
