//! `kactivator queue-proxy`'s configuration: the environment Knative's revision reconciler gives
//! its queue-proxy container, read with the rules upstream reads it with.
//!
//! Upstream (release-1.18 `pkg/queue/sharedmain/main.go`, `config`) decodes the environment with
//! envconfig (`reference/queue-proxy.md` §1.2): a *required* key must be present (an empty string
//! is a present string), a present number or boolean must parse, integers in Go's base-0 syntax
//! (`0x10`, `0o17`, `0b101`, `017`, `1_000` after a prefix), booleans as Go's `ParseBool`.
//! Every problem is reported at once, each naming its key, so one restart fixes them all.
//!
//! Differences, on purpose:
//! * `SERVING_LOGGING_CONFIG` and `SERVING_LOGGING_LEVEL` (required by 1.18) are optional: the
//!   zap configuration they carry has no meaning for this binary's logger, and later releases
//!   carry observability settings in `OBSERVABILITY_CONFIG` instead.
//! * Numbers are bounded where upstream's arithmetic would overflow or misbehave: ports are
//!   1..=65535 (upstream fails later, at listen), timeouts 0..=[`MAX_TIMEOUT_SECONDS`] (a
//!   negative timeout fires at once upstream), containerConcurrency at most [`MAX_CONCURRENCY`]
//!   (a negative one is "no limit", as upstream's `< 1`).
//!
//! Two generations of the contract are read. Knative 1.18's reconciler configures the request
//! log, request metrics and tracing with `SERVING_ENABLE_REQUEST_LOG`,
//! `SERVING_REQUEST_LOG_TEMPLATE`, `SERVING_REQUEST_METRICS_*` and `TRACING_CONFIG_*`; from 1.19
//! it sets one `OBSERVABILITY_CONFIG` instead ([`observability`](super::observability)), and
//! 1.23's queue-proxy reads nothing else for them (`pkg/queue/sharedmain/main.go:88-111,
//! 193-197`). So a non-empty `OBSERVABILITY_CONFIG` decides, and the 1.18 keys are then not
//! read, as upstream's ([`QueueProxyEnv::superseded`] names those present so start-up can say
//! so); without it the 1.18 keys are read as before. An empty `OBSERVABILITY_CONFIG` counts as
//! absent (1.23's queue-proxy skips an empty one too). 1.21.2+ adds
//! `QUEUE_PROXY_TLS_*` ([`tls::settings`](crate::tls::settings)).
//!
//! Tracing, either way, becomes one [`TracingConfig`] ([`QueueProxyEnv::tracing`], meanings in
//! [`crate::config::trace`]). From 1.18's keys as its queue-proxy reads them
//! (release-1.18 `pkg/queue/sharedmain/main.go:106-110,196-205`): `TRACING_CONFIG_DEBUG` a
//! boolean and `TRACING_CONFIG_SAMPLE_RATE` a float (Go's `ParseFloat`; absent, 0), either one
//! that does not parse exits 2 naming it, as envconfig fails; `TRACING_CONFIG_BACKEND`
//! `zipkin` exports to `TRACING_CONFIG_ZIPKIN_ENDPOINT` (every trace with `DEBUG`, else the rate
//! clamped to 0..=1 as OpenCensus' sampler clamps it), `none` is off. Upstream tests
//! `backend != none` (`main.go:196`, `handlers.go:56`), so an absent, empty or unknown backend
//! builds a tracer there too, but one with no exporter (only `zipkin` registers one,
//! `vendor/knative.dev/pkg/tracing/opencensus.go:160-186`): requests are sampled and the app
//! is sent trace headers (`traceparent` and B3, `main.go:354-361`) of spans that go nowhere.
//! Here that is tracing off: nothing is exported either, and the headers pass through as the
//! client sent them (★; an unknown backend is warned about). The reconciler always sets the
//! key, `none` or `zipkin` from config-tracing (`pkg/reconciler/revision/resources/
//! queue.go:417-427`), so only a hand-written environment meets the difference. `zipkin` with
//! an endpoint the exporter cannot use ([`TracingConfig::validate`]: empty, not an `http://`
//! URL; `https://` is not built) is off too, with a warning naming the key, and the pod
//! starts: upstream starts with a bad one too, and its reporter fails every export.
//!
//! Keys present that this binary does not act on are returned in
//! [`QueueProxyEnv::not_acted_on`] so start-up can say so; unknown keys are ignored, as envconfig
//! ignores them, so a newer reconciler's additions do not stop the container.

use std::net::IpAddr;

use kactivator_shards::routing::MAX_TIMEOUT_SECONDS;

use crate::budget;
use crate::config::trace::{self, TracingConfig};
use crate::queue_proxy::observability::{ObservabilityConfig, RequestMetricsExport};
use crate::tls::settings::{self as tls_settings, TlsSettings};

/// Keys whose absence is an error (release-1.18's `required:"true"` fields, less the two logging
/// keys, see the module docs).
pub const REQUIRED: [&str; 10] = [
    "SERVING_NAMESPACE",
    "SERVING_CONFIGURATION",
    "SERVING_REVISION",
    "SERVING_POD",
    "SERVING_POD_IP",
    "QUEUE_SERVING_PORT",
    "QUEUE_SERVING_TLS_PORT",
    "USER_PORT",
    "CONTAINER_CONCURRENCY",
    "REVISION_TIMEOUT_SECONDS",
];

/// Keys Knative sets that are read and checked but change nothing here (yet): each is named in
/// the log at start-up when present with a non-default value, and in the README. (`ROOT_CA` is
/// for queue-proxy extensions; upstream's queue-proxy does not read it either.)
pub const NOT_ACTED_ON: [&str; 10] = [
    "SERVING_LOGGING_CONFIG",
    "SERVING_LOGGING_LEVEL",
    "SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS",
    "METRICS_COLLECTOR_ADDRESS",
    "METRICS_DOMAIN",
    "ENABLE_PROFILING",
    "ENABLE_HTTP2_AUTO_DETECTION",
    "ENABLE_HTTP_FULL_DUPLEX",
    "SYSTEM_NAMESPACE",
    "ROOT_CA",
];

/// Knative 1.18's tracing keys (`main.go:106-110`).
pub const TRACING_CONFIG_BACKEND: &str = "TRACING_CONFIG_BACKEND";
pub const TRACING_CONFIG_ZIPKIN_ENDPOINT: &str = "TRACING_CONFIG_ZIPKIN_ENDPOINT";
pub const TRACING_CONFIG_DEBUG: &str = "TRACING_CONFIG_DEBUG";
pub const TRACING_CONFIG_SAMPLE_RATE: &str = "TRACING_CONFIG_SAMPLE_RATE";

/// Knative 1.18's observability keys, which 1.19+'s queue-proxy no longer reads: with a
/// non-empty `OBSERVABILITY_CONFIG` they are not read here either (module docs).
pub const SUPERSEDED: [&str; 12] = [
    "SERVING_ENABLE_REQUEST_LOG",
    "SERVING_REQUEST_LOG_TEMPLATE",
    "SERVING_ENABLE_PROBE_REQUEST_LOG",
    "SERVING_REQUEST_METRICS_BACKEND",
    "SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS",
    "METRICS_COLLECTOR_ADDRESS",
    "METRICS_DOMAIN",
    "TRACING_CONFIG_BACKEND",
    "TRACING_CONFIG_ZIPKIN_ENDPOINT",
    "TRACING_CONFIG_DEBUG",
    "TRACING_CONFIG_SAMPLE_RATE",
    "ENABLE_PROFILING",
];

/// Where the request log, request metrics and tracing are configured from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObservabilitySource {
    /// Knative 1.18's keys: the request log from `SERVING_ENABLE_REQUEST_LOG` and
    /// `SERVING_REQUEST_LOG_TEMPLATE`, tracing from `TRACING_CONFIG_*`, and upstream's request
    /// metrics served under both name sets when `request_metrics`
    /// (`SERVING_REQUEST_METRICS_BACKEND`, [`Reader::request_metrics_1_18`]).
    Knative118 { request_metrics: bool },
    /// `OBSERVABILITY_CONFIG` (Knative 1.19+).
    ObservabilityConfig {
        request_metrics: RequestMetricsExport,
        /// Asked for but not built: `(field, what happens instead)`, warned about at start-up.
        not_built: Vec<(&'static str, String)>,
    },
}

/// The largest containerConcurrency accepted: Knative's own ceiling is
/// `container-concurrency-max-limit` (1000 by default); the breaker's queue is ten times this.
pub const MAX_CONCURRENCY: u64 = 1 << 20;

/// The queue-proxy's settings, as read from the environment.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueProxyEnv {
    pub namespace: String,
    pub configuration: String,
    pub revision: String,
    /// `SERVING_SERVICE`; may be empty (a revision without a Service).
    pub service: String,
    pub pod: String,
    pub pod_ip: Option<IpAddr>,
    /// `QUEUE_SERVING_PORT`: the data port (8012, or 8013 for an `h2c` user port).
    pub serving_port: u16,
    /// `QUEUE_SERVING_TLS_PORT`: read and checked; TLS is not served (see README).
    pub tls_port: u16,
    /// `USER_PORT`: the user container, always at `127.0.0.1`.
    pub user_port: u16,
    /// 0 = no limit (upstream: any value below 1).
    pub container_concurrency: u32,
    pub timeout_seconds: u64,
    /// 0 = off.
    pub response_start_timeout_seconds: u64,
    /// 0 = off.
    pub idle_timeout_seconds: u64,
    /// `SERVING_READINESS_PROBE`, undecoded; empty or absent = always ready.
    pub readiness_probe: String,
    /// `ENABLE_MULTI_CONTAINER_PROBES`: the probe is a list (the user container's, then each
    /// sidecar's). Default false.
    pub multi_container_probes: bool,
    /// `ACTIVATOR_SERVICE_URL`: where the fork's push side sends this pod's events
    /// (`queue_proxy::push`); absent = [`FORK_DEFAULT_ACTIVATOR_URL`], as the fork; `None`
    /// (empty) = no push.
    pub activator_service_url: Option<ActivatorUrl>,
    /// Where the three settings below come from.
    pub observability: ObservabilitySource,
    /// The request log's template: `SERVING_REQUEST_LOG_TEMPLATE` when
    /// `SERVING_ENABLE_REQUEST_LOG` is true and the template is not empty (upstream writes no
    /// lines with an empty one), or `OBSERVABILITY_CONFIG`'s `requestLogTemplate` when its
    /// `enableRequestLog` is; `None`: no request log.
    pub request_log_template: Option<String>,
    /// `SERVING_ENABLE_PROBE_REQUEST_LOG` or `enableProbeRequestLog`: probes get lines too.
    /// Default false.
    pub probe_request_log: bool,
    /// `TRACING_CONFIG_*` or `OBSERVABILITY_CONFIG`'s `tracing` (module docs). Default off.
    pub tracing: TracingConfig,
    /// Settings taken otherwise than asked, `(key, what happens instead)`, for start-up to
    /// warn about (a tracing endpoint no exporter could use, an unknown 1.18 backend).
    pub warnings: Vec<(&'static str, String)>,
    /// `QUEUE_PROXY_TLS_*`: read and checked; applied once TLS is served.
    pub tls: TlsSettings,
    /// Keys of [`NOT_ACTED_ON`] that are present with a value.
    pub not_acted_on: Vec<&'static str>,
    /// Keys of [`SUPERSEDED`] present with a value while `OBSERVABILITY_CONFIG` decides.
    pub superseded: Vec<&'static str>,
}

/// Upstream's breaker queue: ten waiting requests per unit of containerConcurrency.
pub const QUEUE_PER_CONCURRENCY: u32 = 10;
/// Client connections a queue-proxy keeps room for beyond its breaker's (containerConcurrency
/// in flight and ten times that waiting, each on a connection of its own over HTTP/1): the
/// kubelet's and the activators' probes, keep-alive connections between requests.
pub const SPARE_CONNECTIONS: usize = 64;
/// Unfinished request heads a queue-proxy always admits (a probe's among them).
pub const SPARE_PENDING_HEADS: usize = 16;

impl QueueProxyEnv {
    /// The key the request log's template came from, for errors about it.
    pub fn request_log_key(&self) -> &'static str {
        match self.observability {
            ObservabilitySource::Knative118 { .. } => "SERVING_REQUEST_LOG_TEMPLATE",
            ObservabilitySource::ObservabilityConfig { .. } => "OBSERVABILITY_CONFIG",
        }
    }

    /// How many requests upstream's breaker lets wait: 10 × containerConcurrency; `None`
    /// without a breaker (containerConcurrency 0).
    pub fn breaker_queue(&self) -> Option<u32> {
        (self.container_concurrency > 0).then(|| {
            self.container_concurrency
                .saturating_mul(QUEUE_PER_CONCURRENCY)
        })
    }

    /// A sidecar's budget: a few MiB kept back rather than the activator's 64, and caps never
    /// below what its breaker promises to admit, so a queue-proxy starts under a sidecar-sized
    /// limit and a limit too small for its containerConcurrency is refused at start, naming it.
    pub fn budget_needs(&self) -> budget::Needs {
        let concurrency = self.container_concurrency;
        let waiting = self.breaker_queue().unwrap_or(0);
        budget::Needs {
            reserved: budget::QUEUE_PROXY_RESERVED_BYTES,
            floor: budget::Caps {
                max_connections_per_shard: (concurrency as usize)
                    .saturating_add(waiting as usize)
                    .saturating_add(SPARE_CONNECTIONS),
                max_pending_heads_per_shard: SPARE_PENDING_HEADS,
                max_queued_requests: waiting.max(1),
            },
            floor_from: "CONTAINER_CONCURRENCY (its breaker admits that many requests in flight and ten times that many waiting)",
        }
    }
}

/// `ACTIVATOR_SERVICE_URL`, checked: `http://host[:port][/path]`, where the push side sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivatorUrl {
    /// A DNS name, or an IP address without brackets.
    pub host: String,
    /// [`DEFAULT_ACTIVATOR_PORT`] when the URL names none.
    pub port: u16,
    /// The `Host` header: the URL's authority as written (`host[:port]`).
    pub authority: String,
    /// What to `POST` to: the URL's path without a trailing `/`, then
    /// `kactivator_api::registration::PATH`.
    pub path: String,
}

/// The port of an `http` URL that names none.
pub const DEFAULT_ACTIVATOR_PORT: u16 = 80;

/// The fork's default for `ACTIVATOR_SERVICE_URL` when the key is absent (its
/// `sharedmain/main.go`): the activator's in-cluster Service, port 80 (the activator's 8012).
/// Applied here too: Knative's reconciler sets no such key, so this is what a stock cluster gets
/// (README: As Knative's queue-proxy). An empty value turns the push off.
pub const FORK_DEFAULT_ACTIVATOR_URL: &str =
    "http://activator-service.knative-serving.svc.cluster.local:80";

impl ActivatorUrl {
    /// Parses an `http` URL; the error says what is wrong with it. The fork appends the
    /// registration path to the text as given, so a trailing `/` made its path `//api/…`,
    /// which its activator did not recognise; here the `/` is dropped.
    pub fn parse(text: &str) -> Result<ActivatorUrl, String> {
        let uri: http::Uri = text
            .parse()
            .map_err(|error| format!("{text:?} is not a URL: {error}"))?;
        match uri.scheme_str() {
            Some(scheme) if scheme.eq_ignore_ascii_case("http") => {}
            Some(scheme) if scheme.eq_ignore_ascii_case("https") => {
                return Err(format!(
                    "{text:?}: https is not built (the push speaks plain HTTP)"
                ))
            }
            _ => return Err(format!("{text:?} is not an http:// URL")),
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("{text:?} names no host"))?;
        if authority.as_str().contains('@') {
            return Err(format!("{text:?}: a user name in the URL is not supported"));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("{text:?} names no host"));
        }
        // The text after the host, read here: `http` reads a port that overflows u16 as none.
        let after_host = match authority.as_str().rsplit_once(']') {
            Some((_, rest)) => rest,
            None => authority.as_str(),
        };
        let port = match after_host.rsplit_once(':') {
            None | Some((_, "")) => DEFAULT_ACTIVATOR_PORT,
            Some((_, digits)) => match digits.parse::<u16>() {
                Ok(0) => return Err(format!("{text:?}: port 0")),
                Ok(port) => port,
                Err(_) => return Err(format!("{text:?}: {digits:?} is not a port")),
            },
        };
        if uri.query().is_some() {
            return Err(format!("{text:?}: a query in the URL is not supported"));
        }
        let base = uri.path().trim_end_matches('/');
        Ok(ActivatorUrl {
            host: host.to_string(),
            port,
            authority: authority.as_str().to_string(),
            path: format!("{base}{}", kactivator_api::registration::PATH),
        })
    }
}

/// What is wrong with the environment: every missing key and every bad value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvError {
    pub missing: Vec<&'static str>,
    /// `(key, problem)`.
    pub invalid: Vec<(&'static str, String)>,
}

impl std::fmt::Display for EnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "queue-proxy environment:")?;
        if !self.missing.is_empty() {
            write!(f, " missing {}", self.missing.join(", "))?;
            if !self.invalid.is_empty() {
                write!(f, ";")?;
            }
        }
        for (index, (key, problem)) in self.invalid.iter().enumerate() {
            let separator = if index == 0 { "" } else { ";" };
            write!(f, "{separator} {key}: {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for EnvError {}

/// Reads the settings through `lookup` (the process environment in production, a map in tests).
pub fn parse(lookup: impl Fn(&str) -> Option<String>) -> Result<QueueProxyEnv, EnvError> {
    let mut reader = Reader {
        lookup: &lookup,
        error: EnvError {
            missing: Vec::new(),
            invalid: Vec::new(),
        },
    };
    for key in REQUIRED {
        if lookup(key).is_none() {
            reader.error.missing.push(key);
        }
    }
    let pod_ip = reader.string("SERVING_POD_IP");
    let pod_ip_text_empty = pod_ip.trim().is_empty();
    let pod_ip = match pod_ip.trim() {
        // Present but empty is accepted upstream (it is only a log field there).
        "" => None,
        text => match text.parse() {
            Ok(ip) => Some(ip),
            Err(_) => {
                reader.invalid("SERVING_POD_IP", format!("{text:?} is not an IP address"));
                None
            }
        },
    };
    let observability_config = lookup("OBSERVABILITY_CONFIG").filter(|text| !text.is_empty());
    let mut warnings = Vec::new();
    let (observability, request_log_template, probe_request_log, tracing) =
        match &observability_config {
            None => (
                ObservabilitySource::Knative118 {
                    request_metrics: reader.request_metrics_1_18(&mut warnings),
                },
                lookup("SERVING_ENABLE_REQUEST_LOG")
                    .and_then(|value| go_bool(&value))
                    .unwrap_or(false)
                    .then(|| reader.string("SERVING_REQUEST_LOG_TEMPLATE"))
                    .filter(|template| !template.is_empty()),
                lookup("SERVING_ENABLE_PROBE_REQUEST_LOG")
                    .and_then(|value| go_bool(&value))
                    .unwrap_or(false),
                reader.tracing_1_18(&mut warnings),
            ),
            Some(text) => {
                let plan = ObservabilityConfig::decode(text)
                    .map_err(|error| {
                        vec![format!("not as upstream's queue-proxy decodes it: {error}")]
                    })
                    .and_then(|config| config.plan());
                match plan {
                    Ok(plan) => {
                        warnings.extend(plan.warnings.into_iter().map(|(field, what)| {
                            ("OBSERVABILITY_CONFIG", format!("{field}: {what}"))
                        }));
                        (
                            ObservabilitySource::ObservabilityConfig {
                                request_metrics: plan.request_metrics,
                                not_built: plan.not_built,
                            },
                            plan.request_log_template,
                            plan.probe_request_log,
                            plan.tracing,
                        )
                    }
                    Err(problems) => {
                        for problem in problems {
                            reader.invalid("OBSERVABILITY_CONFIG", problem);
                        }
                        (
                            ObservabilitySource::ObservabilityConfig {
                                request_metrics: RequestMetricsExport::Off,
                                not_built: Vec::new(),
                            },
                            None,
                            false,
                            TracingConfig::OFF,
                        )
                    }
                }
            }
        };
    let superseded_keys: &[&str] = if observability_config.is_some() {
        &SUPERSEDED
    } else {
        &[]
    };
    let present = |key: &&str| lookup(key).is_some_and(|value| !value.is_empty());
    let env = QueueProxyEnv {
        namespace: reader.string("SERVING_NAMESPACE"),
        configuration: reader.string("SERVING_CONFIGURATION"),
        revision: reader.string("SERVING_REVISION"),
        service: reader.string("SERVING_SERVICE"),
        pod: reader.string("SERVING_POD"),
        pod_ip,
        serving_port: reader.port("QUEUE_SERVING_PORT"),
        tls_port: reader.port("QUEUE_SERVING_TLS_PORT"),
        user_port: reader.port("USER_PORT"),
        container_concurrency: reader.concurrency("CONTAINER_CONCURRENCY"),
        timeout_seconds: reader.seconds("REVISION_TIMEOUT_SECONDS"),
        response_start_timeout_seconds: reader.seconds("REVISION_RESPONSE_START_TIMEOUT_SECONDS"),
        idle_timeout_seconds: reader.seconds("REVISION_IDLE_TIMEOUT_SECONDS"),
        readiness_probe: reader.string("SERVING_READINESS_PROBE"),
        multi_container_probes: lookup("ENABLE_MULTI_CONTAINER_PROBES")
            .and_then(|value| go_bool(&value))
            .unwrap_or(false),
        activator_service_url: reader.activator_url(),
        observability,
        request_log_template,
        probe_request_log,
        tracing,
        warnings,
        tls: tls_settings::read(tls_settings::QUEUE_PROXY, &lookup),
        not_acted_on: NOT_ACTED_ON
            .into_iter()
            .filter(|key| !superseded_keys.contains(key))
            .filter(present)
            .collect(),
        superseded: superseded_keys.iter().copied().filter(present).collect(),
    };
    for key in [
        "SERVING_ENABLE_REQUEST_LOG",
        "SERVING_ENABLE_PROBE_REQUEST_LOG",
        "ENABLE_PROFILING",
        "ENABLE_HTTP2_AUTO_DETECTION",
        "ENABLE_HTTP_FULL_DUPLEX",
        "ENABLE_MULTI_CONTAINER_PROBES",
        TRACING_CONFIG_DEBUG,
    ] {
        if superseded_keys.contains(&key) {
            continue;
        }
        if let Some(value) = lookup(key) {
            if go_bool(&value).is_none() {
                reader.invalid(key, format!("{value:?} is not a boolean"));
            }
        }
    }
    if env.activator_service_url.is_some() {
        // Every push names the pod; the activator refuses one without these.
        // (Absent is reported as missing, and unparsable as invalid, above.)
        if lookup("SERVING_POD_IP").is_some() && pod_ip_text_empty {
            reader.invalid(
                "SERVING_POD_IP",
                "empty, but ACTIVATOR_SERVICE_URL is set and every push names the pod's address"
                    .into(),
            );
        }
        for (key, value) in [
            ("SERVING_POD", &env.pod),
            ("SERVING_NAMESPACE", &env.namespace),
            ("SERVING_REVISION", &env.revision),
        ] {
            if lookup(key).is_some() && value.is_empty() {
                reader.invalid(
                    key,
                    "empty, but ACTIVATOR_SERVICE_URL is set and every push names it".into(),
                );
            }
        }
    }
    let period = "SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS";
    if let Some(value) = lookup(period).filter(|_| !superseded_keys.contains(&period)) {
        if go_int(&value).is_none() {
            reader.invalid(
                "SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS",
                format!("{value:?} is not an integer"),
            );
        }
    }
    if reader.error.missing.is_empty() && reader.error.invalid.is_empty() {
        Ok(env)
    } else {
        Err(reader.error)
    }
}

struct Reader<'a, F: Fn(&str) -> Option<String>> {
    lookup: &'a F,
    error: EnvError,
}

impl<F: Fn(&str) -> Option<String>> Reader<'_, F> {
    fn invalid(&mut self, key: &'static str, problem: String) {
        self.error.invalid.push((key, problem));
    }

    fn string(&mut self, key: &'static str) -> String {
        (self.lookup)(key).unwrap_or_default()
    }

    /// A present integer; `None` when absent (a missing required key is reported elsewhere).
    fn integer(&mut self, key: &'static str) -> Option<i128> {
        let value = (self.lookup)(key)?;
        let parsed = go_int(&value);
        if parsed.is_none() {
            self.invalid(key, format!("{value:?} is not an integer"));
        }
        parsed
    }

    /// Whether Knative 1.18's request metrics are served, from `SERVING_REQUEST_METRICS_BACKEND`
    /// as upstream's `supportsMetrics` takes it (release-1.18 `pkg/queue/sharedmain/main.go:381-392`):
    /// empty or unset serves none; `prometheus` serves them on `:9091`; `opencensus` would push
    /// them to `METRICS_COLLECTOR_ADDRESS`'s OpenCensus agent, which is not built: none, with a
    /// warning; any other backend: none, with a warning, as upstream logs its exporter's error
    /// and runs on without request metrics. (Knative's reconciler sets it from
    /// config-observability's `metrics.request-metrics-backend-destination`, `prometheus`
    /// unless changed.)
    fn request_metrics_1_18(&mut self, warnings: &mut Vec<(&'static str, String)>) -> bool {
        const KEY: &str = "SERVING_REQUEST_METRICS_BACKEND";
        match (self.lookup)(KEY).as_deref() {
            None | Some("") => false,
            Some("prometheus") => true,
            Some("opencensus") => {
                warnings.push((
                    KEY,
                    "opencensus: pushing request metrics to an OpenCensus agent is not built;                      they are not exported (README: As Knative's queue-proxy)"
                        .into(),
                ));
                false
            }
            Some(other) => {
                warnings.push((
                    KEY,
                    format!(
                        "{other:?} is not a backend Knative 1.18 has (prometheus, opencensus);                          request metrics are not exported, as upstream's queue-proxy runs on                          without them"
                    ),
                ));
                false
            }
        }
    }

    /// Knative 1.18's `TRACING_CONFIG_*` (module docs). A `DEBUG` that does not parse is
    /// reported with the other booleans; a `SAMPLE_RATE` that does not parse here.
    fn tracing_1_18(&mut self, warnings: &mut Vec<(&'static str, String)>) -> TracingConfig {
        let debug = (self.lookup)(TRACING_CONFIG_DEBUG)
            .and_then(|value| go_bool(&value))
            .unwrap_or(false);
        let rate = match (self.lookup)(TRACING_CONFIG_SAMPLE_RATE) {
            None => 0.0,
            Some(text) => trace::go_float(&text).unwrap_or_else(|| {
                self.invalid(
                    TRACING_CONFIG_SAMPLE_RATE,
                    format!("{text:?} is not a number"),
                );
                0.0
            }),
        };
        let backend = (self.lookup)(TRACING_CONFIG_BACKEND).unwrap_or_default();
        match backend.as_str() {
            trace::ZIPKIN => {
                let endpoint = self.string(TRACING_CONFIG_ZIPKIN_ENDPOINT);
                let tracing = trace::opencensus(true, &endpoint, debug, rate);
                match tracing.validate() {
                    Ok(()) => tracing,
                    Err(error) => {
                        warnings.push((
                            TRACING_CONFIG_ZIPKIN_ENDPOINT,
                            format!("{error}; tracing is off"),
                        ));
                        TracingConfig::OFF
                    }
                }
            }
            // Upstream: no exporter (module docs).
            trace::NONE | "" => TracingConfig::OFF,
            other => {
                warnings.push((
                    TRACING_CONFIG_BACKEND,
                    format!(
                        "{other:?} is neither \"zipkin\" nor \"none\": upstream exports nothing \
                         for it either, so tracing is off"
                    ),
                ));
                TracingConfig::OFF
            }
        }
    }

    /// `ACTIVATOR_SERVICE_URL`; absent = the fork's default; empty or blank = no push.
    fn activator_url(&mut self) -> Option<ActivatorUrl> {
        let text = (self.lookup)("ACTIVATOR_SERVICE_URL")
            .unwrap_or_else(|| FORK_DEFAULT_ACTIVATOR_URL.to_string());
        if text.trim().is_empty() {
            return None;
        }
        match ActivatorUrl::parse(&text) {
            Ok(url) => Some(url),
            Err(problem) => {
                self.invalid("ACTIVATOR_SERVICE_URL", problem);
                None
            }
        }
    }

    fn port(&mut self, key: &'static str) -> u16 {
        // Upstream keeps ports as strings and fails at listen; a clear error now is kinder.
        let Some(value) = (self.lookup)(key) else {
            return 0;
        };
        match value.trim().parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => {
                self.invalid(key, format!("{value:?} is not a port (1 to 65535)"));
                0
            }
        }
    }

    fn seconds(&mut self, key: &'static str) -> u64 {
        match self.integer(key) {
            None => 0,
            Some(seconds) if (0..=i128::from(MAX_TIMEOUT_SECONDS)).contains(&seconds) => {
                seconds as u64
            }
            Some(seconds) => {
                self.invalid(
                    key,
                    format!("{seconds} is outside 0 to {MAX_TIMEOUT_SECONDS} seconds"),
                );
                0
            }
        }
    }

    fn concurrency(&mut self, key: &'static str) -> u32 {
        match self.integer(key) {
            None => 0,
            // Upstream: any value below 1 means no breaker.
            Some(value) if value < 1 => 0,
            Some(value) if value <= i128::from(MAX_CONCURRENCY) => value as u32,
            Some(value) => {
                self.invalid(key, format!("{value} is above {MAX_CONCURRENCY}"));
                0
            }
        }
    }
}

/// Go's `strconv.ParseInt(text, 0, 64)`: optional sign, then decimal, `0x`/`0o`/`0b`-prefixed,
/// or `0`-prefixed octal; underscores only between digits and only with a prefix. `None` when
/// it does not parse or leaves the 64-bit range (as Go's range error).
pub fn go_int(text: &str) -> Option<i128> {
    let (negative, body) = match text.as_bytes().first()? {
        b'+' => (false, &text[1..]),
        b'-' => (true, &text[1..]),
        _ => (false, text),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(rest) = lower.strip_prefix("0x") {
        (16, rest.to_string(), true)
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (8, rest.to_string(), true)
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (2, rest.to_string(), true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower[1..].to_string(), true)
    } else {
        (10, lower.clone(), false)
    };
    if digits.is_empty() {
        return None;
    }
    if digits.contains('_') {
        // Go: underscores only in base-prefixed literals, each between two digits (or right
        // after the prefix).
        if !prefixed || digits.ends_with('_') || digits.contains("__") {
            return None;
        }
    }
    let cleaned: String = digits.chars().filter(|c| *c != '_').collect();
    let magnitude = i128::from_str_radix(&cleaned, radix).ok()?;
    let value = if negative { -magnitude } else { magnitude };
    (i128::from(i64::MIN)..=i128::from(i64::MAX))
        .contains(&value)
        .then_some(value)
}

/// Go's `strconv.ParseBool`.
pub fn go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
