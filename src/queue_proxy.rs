//! `kactivator queue-proxy`: the same request path as the activator, run as Knative's
//! queue-proxy sidecar in front of one user container, configured by the environment Knative's
//! reconciler sets (`kactivator_control::queue_proxy::env`).
//!
//! What the role changes (`kactivator_shards::role::QueueProxy`): every request is for
//! the pod's own revision and goes to `127.0.0.1:USER_PORT`; health checks are answered from the
//! user container's readiness; one data port (`QUEUE_SERVING_PORT`, HTTP/1.1 and h2c), the
//! drain hook on the admin port (`--drain-admin`, 8022), the autoscaler's protobuf stat on
//! `--autoscaler-metrics` (9090), upstream's request metrics with kactivator's own, and health,
//! on [`METRICS_PORT`]; one shard unless `--shards` says otherwise (a sidecar gets a fraction of a
//! core); upstream's breaker: at most containerConcurrency requests at the app, 10 × that
//! waiting, more get 503 `pending request queue full`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use kactivator_api::RevisionKey;
use kactivator_control::config::{
    trace, Config, MetricNames, MetricsComponent, RevisionConfig, TracingSettings,
};
use kactivator_control::drain::DrainRule;
use kactivator_control::features;
use kactivator_control::queue_proxy::env::{self, EnvError};
use kactivator_control::queue_proxy::observability::RequestMetricsExport;
use kactivator_control::queue_proxy::push::{PodIdentity, Pusher};
use kactivator_control::queue_proxy::{admin, certs, readiness, request_metrics, stat_server};
use kactivator_shards::request::log::{sink, RequestLog};
use kactivator_shards::role::{QueueProxy, Roles};
use kactivator_shards::runtime::reactor;
use kactivator_template::{Revision, Template};

use crate::cli::{Cli, QueueProxyArgs};
use crate::start::{self, AtExit, RequestLogSetup, RoleSetup, StartError};

/// Upstream's user-metrics port (`http-usermetric`); here `/metrics` (upstream's queue-proxy
/// names and kactivator's own), `/healthz` and `/readyz`.
pub const METRICS_PORT: u16 = 9091;
/// Upstream's quiet period: how long a draining queue-proxy keeps serving (`main.go`).
pub const QUIET_PERIOD: Duration = Duration::from_secs(30);
/// How long the end of a drain waits for the request metrics' last push (upstream gives its
/// meter provider's `Shutdown` 10 s, `main.go:210-215`; this one waits as long as for the last
/// spans, [`start::TRACE_EXPORT_AT_EXIT`]: a collector that does not answer holds exit no
/// longer than that).
pub const METRICS_PUSH_AT_EXIT: Duration = start::TRACE_EXPORT_AT_EXIT;

pub fn run(cli: &Cli, args: &QueueProxyArgs) -> Result<(), StartError> {
    let env = env::parse(|key| std::env::var(key).ok())?;
    let tls_asked = certs::tls_asked(&args.certs_dir)?;
    check_tls_settings(&env, tls_asked, &args.certs_dir)?;
    if !env.not_acted_on.is_empty() {
        tracing::info!(
            keys = ?env.not_acted_on,
            "set by Knative but not acted on here (README: As Knative's queue-proxy)"
        );
    }
    if !env.superseded.is_empty() {
        tracing::info!(
            keys = ?env.superseded,
            "OBSERVABILITY_CONFIG is set, so these Knative 1.18 keys are not read (as Knative \
             1.19+'s queue-proxy, which reads only OBSERVABILITY_CONFIG)"
        );
    }
    if let env::ObservabilitySource::ObservabilityConfig { not_built, .. } = &env.observability {
        for (field, what) in not_built {
            tracing::warn!(
                key = "OBSERVABILITY_CONFIG",
                field,
                "configured but not built here: {what}"
            );
        }
    }
    for (key, what) in &env.warnings {
        tracing::warn!(key, "{what}");
    }
    tracing::info!("tracing: {}", trace::describe(&env.tracing));
    let mut config = config_of(&env, cli.drain_grace_seconds);
    // Knative's system-internal-tls: TLS on QUEUE_SERVING_TLS_PORT beside the plain port, with
    // the mounted pair (the admin port stays plain, as 1.20+).
    let server_tls = tls_asked.then(|| {
        config.listen.https = Some(reactor::any_address(env.tls_port));
        let mut files = certs::server_files(&args.certs_dir, env.tls.clone());
        files.every = Duration::from_secs(args.certs_reload_seconds);
        files
    });
    let probes = readiness::decode(
        &env.readiness_probe,
        env.multi_container_probes,
        env.user_port,
    )
    .map_err(|error| EnvError {
        missing: Vec::new(),
        invalid: vec![("SERVING_READINESS_PROBE", error.to_string())],
    })?;
    let pusher = pusher_of(&env)?;
    // Checked before anything starts: a template this binary cannot render exits 2.
    let request_log = request_log_of(&env)?;
    let (user, prober) = readiness::prober(probes);
    let edges = user.edges();
    let revision = RevisionKey::new(&env.namespace, &env.revision).map_err(|error| EnvError {
        missing: Vec::new(),
        invalid: vec![("SERVING_REVISION", error.to_string())],
    })?;
    let pre_stop = Arc::new(AtomicBool::new(false));
    let role = Roles::QueueProxy(QueueProxy {
        revision,
        user: Arc::new(user),
        pre_stop: pre_stop.clone(),
    });
    let admin_addr = args.drain_admin;
    let stats_addr = args.autoscaler_metrics;
    let pod_name = env.pod.clone();
    // One resource for the process: the spans and the pushed request metrics name the same pod.
    let resource = telemetry_resource(&env);
    let push_metrics = match &env.observability {
        env::ObservabilitySource::ObservabilityConfig {
            request_metrics: RequestMetricsExport::Otlp(config),
            ..
        } => Some((config.clone(), resource.clone())),
        _ => None,
    };
    let queue_depth = env.container_concurrency > 0;
    let setup = RoleSetup {
        role,
        second_data_port: false,
        default_shards: Some(1),
        finds_autoscaler: false,
        pod_name: env.pod.clone(),
        request_log,
        needs: env.budget_needs(),
        drain_rule: DrainRule::QuietPeriod,
        drain_timeout: None,
        idle_per_pod_in_all_shards: None,
        idle_in_all_shards: None,
        metrics_port: None,
        unmap_start_up_code: args.unmap_start_up_code,
        server_tls,
        trace_resource: resource,
        keda: None,
        spawn_extra: Some(Box::new(move |runtime, drain, shards, registry| {
            let listener = bind(admin_addr)?;
            let stats_listener = bind(stats_addr)?;
            let _entered = runtime.enter();
            let listener = tokio::net::TcpListener::from_std(listener)?;
            runtime.spawn(admin::serve(listener, drain.clone(), pre_stop));
            stat_server::spawn(
                tokio::net::TcpListener::from_std(stats_listener)?,
                shards.clone(),
                pod_name,
            );
            let mut at_exit = Vec::new();
            if let Some((config, resource)) = push_metrics {
                let (finish, finished) = tokio::sync::oneshot::channel();
                let registry = registry.clone();
                let done = runtime.spawn(async move {
                    request_metrics::run(config, shards, queue_depth, resource, &registry, finished)
                        .await
                });
                at_exit.push(AtExit {
                    what: "request metrics: the last push",
                    finish,
                    done,
                    within: METRICS_PUSH_AT_EXIT,
                });
            }
            runtime.spawn(prober.run());
            if let Some(pusher) = pusher {
                runtime.spawn(pusher.run(edges, drain));
            }
            Ok(at_exit)
        })),
    };
    start::run_as(cli, Some(config), setup, || {})
}

/// `QUEUE_PROXY_TLS_*` as upstream treats them: read when the certificate is mounted, and then
/// a value it cannot use is fatal (exit 2, naming the key); otherwise upstream never reads
/// them, so a bad one is only warned about.
fn check_tls_settings(
    env: &env::QueueProxyEnv,
    tls_asked: bool,
    certs_dir: &Path,
) -> Result<(), StartError> {
    if env.tls.problems.is_empty() {
        return Ok(());
    }
    if tls_asked {
        return Err(EnvError {
            missing: Vec::new(),
            invalid: env.tls.problems.clone(),
        }
        .into());
    }
    for (key, problem) in &env.tls.problems {
        tracing::warn!(
            key,
            "{problem}; not used while TLS is off (no certificate in {}), refused once it is on",
            certs_dir.display()
        );
    }
    Ok(())
}

/// The fork's push side, when `ACTIVATOR_SERVICE_URL` asks for it; refused (exit 2) when the
/// activator would refuse this pod's registrations.
fn pusher_of(env: &env::QueueProxyEnv) -> Result<Option<Pusher>, EnvError> {
    let (Some(url), Some(pod_ip)) = (env.activator_service_url.clone(), env.pod_ip) else {
        // Without a pod IP the environment check has already refused a set URL.
        return Ok(None);
    };
    let pod = PodIdentity {
        pod_name: env.pod.clone(),
        pod_ip,
        namespace: env.namespace.clone(),
        revision: env.revision.clone(),
    };
    Pusher::new(url, pod).map(Some).map_err(|error| EnvError {
        missing: Vec::new(),
        invalid: vec![(
            "ACTIVATOR_SERVICE_URL",
            format!("the activator would refuse this pod's registrations (SERVING_POD, SERVING_POD_IP, SERVING_NAMESPACE, SERVING_REVISION): {error}"),
        )],
    })
}

/// Knative's request log, when `SERVING_ENABLE_REQUEST_LOG` or `OBSERVABILITY_CONFIG` turns it
/// on with a template: the template parsed (refused, exit 2, naming the key it came from, when
/// this binary would not print what Go prints) and the thread that writes the lines to stdout
/// started.
fn request_log_of(env: &env::QueueProxyEnv) -> Result<Option<RequestLogSetup>, StartError> {
    let Some(text) = &env.request_log_template else {
        return Ok(None);
    };
    let template = Template::parse(text).map_err(|error| EnvError {
        missing: Vec::new(),
        invalid: vec![(
            env.request_log_key(),
            match env.observability {
                env::ObservabilitySource::Knative118 { .. } => error.to_string(),
                _ => format!("requestLogTemplate: {error}"),
            },
        )],
    })?;
    let revision = Revision {
        name: env.revision.clone(),
        namespace: env.namespace.clone(),
        service: env.service.clone(),
        configuration: env.configuration.clone(),
        pod_name: env.pod.clone(),
        pod_ip: env.pod_ip.map(|ip| ip.to_string()).unwrap_or_default(),
    };
    let (sink, writer) =
        sink::start(std::io::stdout(), sink::DEFAULT_QUEUE_LINES).map_err(|error| {
            StartError::Shard(format!("starting the request log's writer: {error}"))
        })?;
    let log = RequestLog::new(template, revision, env.probe_request_log, sink);
    Ok(Some(RequestLogSetup {
        log: Arc::new(log),
        writer,
    }))
}

fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, StartError> {
    reactor::bind_listener(addr).map_err(|source| StartError::Bind { addr, source })
}

/// The activator configuration that makes the request path a queue-proxy: one revision whose
/// one pod is the user container.
fn config_of(env: &env::QueueProxyEnv, drain_grace: Option<u64>) -> Config {
    let mut config = Config::default();
    config.listen.http = reactor::any_address(env.serving_port);
    config.listen.admin = reactor::any_address(METRICS_PORT);
    // Upstream's request metrics: 1.18 serves its names (both sets here, as before) when
    // `SERVING_REQUEST_METRICS_BACKEND` is `prometheus`; 1.19+
    // serves its own names only with `requestMetrics.protocol` prometheus, on its endpoint when
    // one is given. Otherwise only kactivator's own names are served (the port also answers
    // `/healthz` and `/readyz`).
    if let env::ObservabilitySource::Knative118 {
        request_metrics: false,
    } = &env.observability
    {
        config.metrics.names = MetricNames::Neither;
    }
    if let env::ObservabilitySource::ObservabilityConfig {
        request_metrics, ..
    } = &env.observability
    {
        match request_metrics {
            // Pushed over OTLP (or not at all): upstream serves none of its names then.
            RequestMetricsExport::Off | RequestMetricsExport::Otlp(_) => {
                config.metrics.names = MetricNames::Neither
            }
            RequestMetricsExport::Prometheus { listen } => {
                config.metrics.names = MetricNames::Opentelemetry;
                if let Some(listen) = listen {
                    config.listen.admin = *listen;
                }
            }
        }
    }
    // Start-up's one tracing channel begins with it (`start::run_as`).
    config.tracing = TracingSettings::of(&env.tracing);
    config.proxy.drain_grace_seconds = drain_grace.unwrap_or(QUIET_PERIOD.as_secs());
    config.metrics.component = MetricsComponent::QueueProxy {
        queue_depth: env.container_concurrency > 0,
    };
    // The pod is the user container: it is not taken out of routing on a failed connection
    // (the activator's quarantine probes a queue-proxy, which an app does not answer); a request
    // that cannot reach it tries again within its deadline.
    config
        .features
        .insert(features::POD_QUARANTINE.into(), "disabled".into());
    let concurrency = env.container_concurrency;
    config.revisions.push(RevisionConfig {
        service: env.service.clone(),
        configuration: env.configuration.clone(),
        container_concurrency: concurrency,
        timeout_seconds: env.timeout_seconds,
        response_start_timeout_seconds: env.response_start_timeout_seconds,
        idle_timeout_seconds: env.idle_timeout_seconds,
        queue_depth: env
            .breaker_queue()
            .unwrap_or(kactivator_shards::routing::DEFAULT_QUEUE_DEPTH),
        pods: vec![SocketAddr::new(Ipv4Addr::LOCALHOST.into(), env.user_port)],
        ..RevisionConfig::new(&env.namespace, &env.revision)
    });
    config
}

/// Who the queue-proxy's spans and pushed metrics come from, as upstream's resource names it
/// (`pkg/queue/sharedmain/otel.go` `res`, release-1.23): the service is the first set of
/// `OTEL_SERVICE_NAME`, `SERVING_SERVICE`, `SERVING_CONFIGURATION`, `SERVING_REVISION` and the
/// pod's name; the instance is the pod; the container, namespace and pod as Kubernetes'
/// semantic conventions name them; the version is the build's commit (upstream's `changeset`:
/// seven hex digits, or `unknown`); and the revision's Knative names, each when set. Upstream
/// merges OpenTelemetry Go's default resource in too (`telemetry.sdk.*`); this one does not
/// claim to be Go's SDK.
fn telemetry_resource(env: &env::QueueProxyEnv) -> kactivator_telemetry::Resource {
    let otel_service_name = std::env::var("OTEL_SERVICE_NAME").unwrap_or_default();
    let service_name = [
        otel_service_name.as_str(),
        &env.service,
        &env.configuration,
        &env.revision,
        &env.pod,
    ]
    .into_iter()
    .find(|name| !name.is_empty())
    .unwrap_or_default()
    .to_string();
    let mut attributes = vec![
        ("k8s.container.name".into(), "queue-proxy".into()),
        ("k8s.namespace.name".into(), env.namespace.clone()),
        ("k8s.pod.name".into(), env.pod.clone()),
        (
            "service.version".into(),
            changeset(env!("KACTIVATOR_GIT_COMMIT")),
        ),
    ];
    for (key, value) in [
        ("kn.service.name", &env.service),
        ("kn.configuration.name", &env.configuration),
        ("kn.revision.name", &env.revision),
    ] {
        if !value.is_empty() {
            attributes.push((key.into(), value.clone()));
        }
    }
    kactivator_telemetry::Resource {
        service_name,
        instance_id: Some(env.pod.clone()).filter(|pod| !pod.is_empty()),
        attributes,
    }
}

/// knative.dev/pkg's `changeset.Get()` of a commit: its first seven characters when it is a
/// full SHA-1 (40 hex digits), else as given (`unknown` outside a git checkout).
fn changeset(commit: &str) -> String {
    if commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        commit[..7].to_owned()
    } else {
        commit.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::changeset;

    #[test]
    fn the_service_version_is_the_commit_as_knatives_changeset_shortens_it() {
        assert_eq!(
            changeset("0f6ec4270f1a0c3b0e6b0f7c2d1e9a8b7c6d5e4f"),
            "0f6ec42"
        );
        assert_eq!(changeset("unknown"), "unknown");
    }
}
