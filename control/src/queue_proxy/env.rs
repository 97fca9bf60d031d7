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
//! `QUEUE_PROXY_TLS_*` ([`tls_settings`](super::tls_settings)).
//!
//! Keys present that this binary does not act on are returned in
//! [`QueueProxyEnv::not_acted_on`] so start-up can say so; unknown keys are ignored, as envconfig
//! ignores them, so a newer reconciler's additions do not stop the container.

use std::net::IpAddr;

use kactivator_shards::routing::MAX_TIMEOUT_SECONDS;

use crate::budget;
use crate::queue_proxy::observability::{ObservabilityConfig, RequestMetricsExport};
use crate::queue_proxy::tls_settings::{self, TlsSettings};

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
pub const NOT_ACTED_ON: [&str; 15] = [
    "SERVING_LOGGING_CONFIG",
    "SERVING_LOGGING_LEVEL",
    "SERVING_REQUEST_METRICS_BACKEND",
    "SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS",
    "METRICS_COLLECTOR_ADDRESS",
    "METRICS_DOMAIN",
    "TRACING_CONFIG_BACKEND",
    "TRACING_CONFIG_ZIPKIN_ENDPOINT",
    "TRACING_CONFIG_DEBUG",
    "TRACING_CONFIG_SAMPLE_RATE",
    "ENABLE_PROFILING",
    "ENABLE_HTTP2_AUTO_DETECTION",
    "ENABLE_HTTP_FULL_DUPLEX",
    "SYSTEM_NAMESPACE",
    "ROOT_CA",
];

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
    /// `SERVING_REQUEST_LOG_TEMPLATE`; upstream's request metrics served under both name sets
    /// (the metrics and tracing keys are read and checked, not acted on).
    Knative118,
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
#[derive(Clone, Debug, PartialEq, Eq)]
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
            ObservabilitySource::Knative118 => "SERVING_REQUEST_LOG_TEMPLATE",
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
    let (observability, request_log_template, probe_request_log) = match &observability_config {
        None => (
            ObservabilitySource::Knative118,
            lookup("SERVING_ENABLE_REQUEST_LOG")
                .and_then(|value| go_bool(&value))
                .unwrap_or(false)
                .then(|| reader.string("SERVING_REQUEST_LOG_TEMPLATE"))
                .filter(|template| !template.is_empty()),
            lookup("SERVING_ENABLE_PROBE_REQUEST_LOG")
                .and_then(|value| go_bool(&value))
                .unwrap_or(false),
        ),
        Some(text) => {
            let plan = ObservabilityConfig::decode(text)
                .map_err(|error| vec![format!("not as upstream's queue-proxy decodes it: {error}")])
                .and_then(|config| config.plan());
            match plan {
                Ok(plan) => (
                    ObservabilitySource::ObservabilityConfig {
                        request_metrics: plan.request_metrics,
                        not_built: plan.not_built,
                    },
                    plan.request_log_template,
                    plan.probe_request_log,
                ),
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
        tls: tls_settings::read(&lookup),
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
        "TRACING_CONFIG_DEBUG",
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
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// What Knative 1.18's reconciler sets for a revision with CC 10 (`queue.go:354-469`).
    fn knative() -> HashMap<&'static str, String> {
        [
            ("SERVING_NAMESPACE", "default"),
            ("SERVING_SERVICE", "hello"),
            ("SERVING_CONFIGURATION", "hello"),
            ("SERVING_REVISION", "hello-00001"),
            ("SERVING_POD", "hello-00001-deployment-abc"),
            ("SERVING_POD_IP", "10.0.0.7"),
            ("QUEUE_SERVING_PORT", "8012"),
            ("QUEUE_SERVING_TLS_PORT", "8112"),
            ("USER_PORT", "8080"),
            ("CONTAINER_CONCURRENCY", "10"),
            ("REVISION_TIMEOUT_SECONDS", "300"),
            ("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "0"),
            ("REVISION_IDLE_TIMEOUT_SECONDS", "0"),
            (
                "SERVING_READINESS_PROBE",
                r#"{"tcpSocket":{"port":8080,"host":"127.0.0.1"},"successThreshold":1}"#,
            ),
            ("SERVING_LOGGING_CONFIG", "{}"),
            ("SERVING_LOGGING_LEVEL", ""),
            ("SERVING_REQUEST_METRICS_BACKEND", "prometheus"),
            ("ENABLE_HTTP2_AUTO_DETECTION", "false"),
            ("SOME_KEY_OF_A_LATER_RELEASE", "whatever"),
        ]
        .into_iter()
        .map(|(key, value)| (key, value.to_string()))
        .collect()
    }

    fn parse_map(env: &HashMap<&'static str, String>) -> Result<QueueProxyEnv, EnvError> {
        parse(|key| env.get(key).cloned())
    }

    #[test]
    fn knatives_environment_reads_as_set() {
        let env = parse_map(&knative()).expect("valid");
        assert_eq!(env.namespace, "default");
        assert_eq!(env.revision, "hello-00001");
        assert_eq!(env.pod_ip, Some("10.0.0.7".parse().unwrap()));
        assert_eq!(
            (env.serving_port, env.tls_port, env.user_port),
            (8012, 8112, 8080)
        );
        assert_eq!(env.container_concurrency, 10);
        assert_eq!(env.timeout_seconds, 300);
        assert!(env.readiness_probe.contains("tcpSocket"));
        assert_eq!(
            env.activator_service_url.map(|url| url.authority),
            Some(FORK_DEFAULT_ACTIVATOR_URL[7..].to_string()),
            "Knative sets none: the fork's default"
        );
        assert_eq!(
            env.not_acted_on,
            vec![
                "SERVING_LOGGING_CONFIG",
                "SERVING_REQUEST_METRICS_BACKEND",
                "ENABLE_HTTP2_AUTO_DETECTION"
            ]
        );
    }

    #[test]
    fn the_request_log_is_on_only_when_enabled_with_a_template() {
        let template = r#"{"status": {{.Response.Code}}}"#;
        let cases = [
            (Some("true"), Some(template), Some(template)),
            (Some("1"), Some(template), Some(template)),
            (Some("false"), Some(template), None),
            (None, Some(template), None),
            (Some("true"), Some(""), None),
            (Some("true"), None, None),
        ];
        for (enabled, text, expected) in cases {
            let mut env = knative();
            if let Some(enabled) = enabled {
                env.insert("SERVING_ENABLE_REQUEST_LOG", enabled.into());
            }
            if let Some(text) = text {
                env.insert("SERVING_REQUEST_LOG_TEMPLATE", text.into());
            }
            let parsed = parse_map(&env).expect("valid");
            assert_eq!(
                parsed.request_log_template.as_deref(),
                expected,
                "{enabled:?} {text:?}"
            );
            assert!(!parsed
                .not_acted_on
                .contains(&"SERVING_REQUEST_LOG_TEMPLATE"));
        }
        let mut env = knative();
        env.insert("SERVING_ENABLE_PROBE_REQUEST_LOG", "true".into());
        assert!(parse_map(&env).expect("valid").probe_request_log);
        env.insert("SERVING_ENABLE_REQUEST_LOG", "yes".into());
        let error = parse_map(&env).unwrap_err();
        assert!(error.to_string().contains("SERVING_ENABLE_REQUEST_LOG"));
    }

    /// What Knative 1.23's reconciler sets, every key (`queue.go:355-449`), for CC 10 with
    /// config-observability's request log and Prometheus request metrics on.
    fn knative_1_23() -> HashMap<&'static str, String> {
        let observability = r#"{"tracing":{"protocol":"none"},"metrics":{"protocol":"none"},"runtime":{"profiling":"disabled","exportInterval":15000000000},"requestMetrics":{"protocol":"prometheus"},"enableRequestLog":true,"requestLogTemplate":"{{.Request.Method}} {{.Response.Code}}","enableProbeRequestLog":true}"#;
        [
            ("SERVING_NAMESPACE", "default"),
            ("SERVING_SERVICE", "hello"),
            ("SERVING_CONFIGURATION", "hello"),
            ("SERVING_REVISION", "hello-00001"),
            ("QUEUE_SERVING_PORT", "8012"),
            ("QUEUE_SERVING_TLS_PORT", "8112"),
            ("CONTAINER_CONCURRENCY", "10"),
            ("REVISION_TIMEOUT_SECONDS", "300"),
            ("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "0"),
            ("REVISION_IDLE_TIMEOUT_SECONDS", "0"),
            ("SERVING_POD", "hello-00001-deployment-abc"),
            ("SERVING_POD_IP", "10.0.0.7"),
            ("SERVING_LOGGING_CONFIG", "{}"),
            ("SERVING_LOGGING_LEVEL", ""),
            ("USER_PORT", "8080"),
            ("SYSTEM_NAMESPACE", "knative-serving"),
            (
                "SERVING_READINESS_PROBE",
                r#"{"tcpSocket":{"port":8080,"host":"127.0.0.1"},"successThreshold":1}"#,
            ),
            ("HOST_IP", "10.1.0.3"),
            ("ENABLE_HTTP2_AUTO_DETECTION", "false"),
            ("ENABLE_HTTP_FULL_DUPLEX", "false"),
            ("ROOT_CA", ""),
            ("QUEUE_PROXY_TLS_MIN_VERSION", ""),
            ("QUEUE_PROXY_TLS_MAX_VERSION", ""),
            ("QUEUE_PROXY_TLS_CIPHER_SUITES", ""),
            ("QUEUE_PROXY_TLS_CURVE_PREFERENCES", ""),
            ("ENABLE_MULTI_CONTAINER_PROBES", "false"),
            ("OBSERVABILITY_CONFIG", observability),
        ]
        .into_iter()
        .map(|(key, value)| (key, value.to_string()))
        .collect()
    }

    #[test]
    fn knative_1_23s_environment_reads_as_set() {
        let env = parse_map(&knative_1_23()).expect("valid");
        assert_eq!(
            env.observability,
            ObservabilitySource::ObservabilityConfig {
                request_metrics: RequestMetricsExport::Prometheus { listen: None },
                not_built: Vec::new(),
            }
        );
        assert_eq!(
            env.request_log_template.as_deref(),
            Some("{{.Request.Method}} {{.Response.Code}}")
        );
        assert!(env.probe_request_log);
        assert_eq!(env.request_log_key(), "OBSERVABILITY_CONFIG");
        assert!(env.tls.is_default() && env.tls.problems.is_empty());
        assert_eq!(
            env.not_acted_on,
            vec![
                "SERVING_LOGGING_CONFIG",
                "ENABLE_HTTP2_AUTO_DETECTION",
                "ENABLE_HTTP_FULL_DUPLEX",
                "SYSTEM_NAMESPACE"
            ]
        );
        assert!(env.superseded.is_empty());
        assert_eq!(env.container_concurrency, 10);
    }

    /// 1.23's queue-proxy reads only OBSERVABILITY_CONFIG for these; with it set, the 1.18 keys
    /// are not read here either, not even checked, and are named for start-up to say so.
    #[test]
    fn with_observability_config_the_1_18_keys_are_not_read() {
        let mut env = knative_1_23();
        env.insert("SERVING_ENABLE_REQUEST_LOG", "yes".into());
        env.insert("SERVING_REQUEST_LOG_TEMPLATE", "{{.Request.Host}}".into());
        env.insert("SERVING_ENABLE_PROBE_REQUEST_LOG", "false".into());
        env.insert(
            "SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS",
            "often".into(),
        );
        env.insert("TRACING_CONFIG_BACKEND", "zipkin".into());
        let parsed = parse_map(&env).expect("the 1.18 keys are not read");
        assert_eq!(
            parsed.request_log_template.as_deref(),
            Some("{{.Request.Method}} {{.Response.Code}}")
        );
        assert!(parsed.probe_request_log);
        assert_eq!(
            parsed.superseded,
            vec![
                "SERVING_ENABLE_REQUEST_LOG",
                "SERVING_REQUEST_LOG_TEMPLATE",
                "SERVING_ENABLE_PROBE_REQUEST_LOG",
                "SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS",
                "TRACING_CONFIG_BACKEND"
            ]
        );
        assert!(!parsed.not_acted_on.contains(&"TRACING_CONFIG_BACKEND"));

        // Empty counts as absent: the 1.18 keys decide (and are checked) again.
        env.insert("OBSERVABILITY_CONFIG", String::new());
        let error = parse_map(&env).unwrap_err();
        let keys: Vec<&str> = error.invalid.iter().map(|(key, _)| *key).collect();
        assert_eq!(
            keys,
            [
                "SERVING_ENABLE_REQUEST_LOG",
                "SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS"
            ]
        );
        env.insert("SERVING_ENABLE_REQUEST_LOG", "true".into());
        env.remove("SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS");
        let parsed = parse_map(&env).unwrap();
        assert_eq!(parsed.observability, ObservabilitySource::Knative118);
        assert_eq!(
            parsed.request_log_template.as_deref(),
            Some("{{.Request.Host}}")
        );
        assert!(!parsed.probe_request_log);
        assert_eq!(parsed.request_log_key(), "SERVING_REQUEST_LOG_TEMPLATE");
    }

    #[test]
    fn a_bad_observability_config_is_named_with_the_field() {
        for (text, said) in [
            ("{", "not as upstream's queue-proxy decodes it: EOF"),
            (
                r#"{"enableRequestLog":1}"#,
                "enableRequestLog to be a boolean",
            ),
            (
                r#"{"requestMetrics":{"protocol":"opencensus"}}"#,
                "requestMetrics.protocol: \"opencensus\"",
            ),
        ] {
            let mut env = knative_1_23();
            env.insert("OBSERVABILITY_CONFIG", text.into());
            env.insert("USER_PORT", "0".into());
            let error = parse_map(&env).unwrap_err();
            let keys: Vec<&str> = error.invalid.iter().map(|(key, _)| *key).collect();
            assert_eq!(
                keys,
                ["OBSERVABILITY_CONFIG", "USER_PORT"],
                "{text}: every problem"
            );
            assert!(error.invalid[0].1.contains(said), "{text}: {error}");
            assert!(
                error.to_string().contains("OBSERVABILITY_CONFIG: "),
                "{error}"
            );
        }
    }

    #[test]
    fn tls_settings_are_read_with_the_rest() {
        let mut env = knative_1_23();
        env.insert("QUEUE_PROXY_TLS_MIN_VERSION", "1.2".into());
        env.insert(
            "QUEUE_PROXY_TLS_CURVE_PREFERENCES",
            "X25519,brainpool".into(),
        );
        // Upstream fails on a bad one only when TLS is on (queue_proxy.rs decides that).
        let parsed = parse_map(&env).expect("not an environment error by itself");
        assert_eq!(
            parsed.tls.min_version,
            Some(tls_settings::TlsVersion::Tls12)
        );
        assert_eq!(parsed.tls.problems.len(), 1);
        assert_eq!(
            parsed.tls.problems[0].0,
            "QUEUE_PROXY_TLS_CURVE_PREFERENCES"
        );
    }

    #[test]
    fn every_missing_key_is_named_at_once_and_empty_strings_count_as_present() {
        let error = parse(|_| None).unwrap_err();
        assert_eq!(error.missing, REQUIRED.to_vec());
        let text = error.to_string();
        assert!(text.contains("missing SERVING_NAMESPACE, SERVING_CONFIGURATION"));

        let mut env = knative();
        env.remove("USER_PORT");
        env.remove("SERVING_REVISION");
        env.insert("SERVING_CONFIGURATION", String::new());
        let error = parse_map(&env).unwrap_err();
        assert_eq!(error.missing, vec!["SERVING_REVISION", "USER_PORT"]);
        assert!(error.invalid.is_empty());
    }

    #[test]
    fn numbers_parse_as_go_does_and_are_bounded() {
        let table: [(&str, Option<i128>); 16] = [
            ("10", Some(10)),
            ("+7", Some(7)),
            ("-1", Some(-1)),
            ("0x10", Some(16)),
            ("0X1f", Some(31)),
            ("0o17", Some(15)),
            ("017", Some(15)),
            ("0b101", Some(5)),
            ("0x_1_0", Some(16)),
            ("0", Some(0)),
            ("", None),
            ("1_000", None),
            ("0x", None),
            (" 5", None),
            ("9223372036854775808", None),
            ("-9223372036854775808", Some(i128::from(i64::MIN))),
        ];
        for (text, expected) in table {
            assert_eq!(go_int(text), expected, "{text:?}");
        }

        let mut env = knative();
        env.insert("CONTAINER_CONCURRENCY", "-3".into());
        assert_eq!(parse_map(&env).unwrap().container_concurrency, 0);
        env.insert("CONTAINER_CONCURRENCY", "0x10".into());
        assert_eq!(parse_map(&env).unwrap().container_concurrency, 16);

        env.insert("CONTAINER_CONCURRENCY", "99999999999".into());
        env.insert("REVISION_TIMEOUT_SECONDS", "18446744073709551615".into());
        env.insert("REVISION_IDLE_TIMEOUT_SECONDS", "-5".into());
        env.insert("USER_PORT", "70000".into());
        env.insert("SERVING_POD_IP", "not-an-ip".into());
        env.insert("ENABLE_HTTP_FULL_DUPLEX", "yes".into());
        env.insert("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "".into());
        let error = parse_map(&env).unwrap_err();
        let keys: Vec<&str> = error.invalid.iter().map(|(key, _)| *key).collect();
        assert_eq!(
            keys,
            vec![
                "SERVING_POD_IP",
                "USER_PORT",
                "CONTAINER_CONCURRENCY",
                "REVISION_TIMEOUT_SECONDS",
                "REVISION_RESPONSE_START_TIMEOUT_SECONDS",
                "REVISION_IDLE_TIMEOUT_SECONDS",
                "ENABLE_HTTP_FULL_DUPLEX",
            ]
        );
        assert!(error.missing.is_empty());
        assert!(error
            .to_string()
            .contains("USER_PORT: \"70000\" is not a port"));
    }

    #[test]
    fn the_push_goes_to_the_forks_default_unless_turned_off_with_an_empty_url() {
        let mut env = knative();
        env.remove("ACTIVATOR_SERVICE_URL");
        let default = parse_map(&env).unwrap().activator_service_url;
        assert_eq!(
            default,
            Some(ActivatorUrl::parse(FORK_DEFAULT_ACTIVATOR_URL).unwrap()),
            "absent: the fork's default"
        );
        for off in ["", "  "] {
            env.insert("ACTIVATOR_SERVICE_URL", off.into());
            assert_eq!(
                parse_map(&env).unwrap().activator_service_url,
                None,
                "{off:?}"
            );
        }
        let table = [
            (
                FORK_DEFAULT_ACTIVATOR_URL,
                "activator-service.knative-serving.svc.cluster.local",
                80,
                "activator-service.knative-serving.svc.cluster.local:80",
                "/api/v1/pod-registration",
            ),
            (
                "http://activator-service.knative-serving",
                "activator-service.knative-serving",
                80,
                "activator-service.knative-serving",
                "/api/v1/pod-registration",
            ),
            (
                "HTTP://10.0.0.9:8012/",
                "10.0.0.9",
                8012,
                "10.0.0.9:8012",
                "/api/v1/pod-registration",
            ),
            (
                "http://[fd00::9]:8012/prefix//",
                "fd00::9",
                8012,
                "[fd00::9]:8012",
                "/prefix/api/v1/pod-registration",
            ),
        ];
        for (text, host, port, authority, path) in table {
            env.insert("ACTIVATOR_SERVICE_URL", text.into());
            let url = parse_map(&env)
                .unwrap_or_else(|error| panic!("{text}: {error}"))
                .activator_service_url
                .unwrap();
            assert_eq!(
                url,
                ActivatorUrl {
                    host: host.into(),
                    port,
                    authority: authority.into(),
                    path: path.into(),
                },
                "{text}"
            );
        }
    }

    #[test]
    fn a_bad_activator_url_is_named() {
        for (text, problem) in [
            ("activator-service:80", "not an http:// URL"),
            ("https://activator-service", "https is not built"),
            ("ftp://activator-service", "not an http:// URL"),
            ("http://", "not a URL"),
            ("http://user@activator-service", "user name"),
            ("http://activator-service:0", "port 0"),
            ("http://activator-service:70000", "not a port"),
            ("http://activator-service/?a=b", "query"),
            ("http://activator service", "not a URL"),
            (" http://activator-service", "not a URL"),
        ] {
            let mut env = knative();
            env.insert("ACTIVATOR_SERVICE_URL", text.into());
            let error = parse_map(&env).expect_err(text);
            assert_eq!(error.invalid.len(), 1, "{text}: {error}");
            let (key, said) = &error.invalid[0];
            assert_eq!(*key, "ACTIVATOR_SERVICE_URL", "{text}");
            assert!(said.contains(problem), "{text}: {said}");
        }
    }

    #[test]
    fn with_the_push_on_every_name_a_registration_carries_must_be_set() {
        let mut env = knative();
        env.insert("ACTIVATOR_SERVICE_URL", "http://10.0.0.9".into());
        env.insert("SERVING_POD_IP", String::new());
        env.insert("SERVING_POD", String::new());
        env.insert("SERVING_REVISION", String::new());
        let error = parse_map(&env).unwrap_err();
        let keys: Vec<&str> = error.invalid.iter().map(|(key, _)| *key).collect();
        assert_eq!(keys, ["SERVING_POD_IP", "SERVING_POD", "SERVING_REVISION"]);
        // Without the push they are only log fields, as upstream.
        env.insert("ACTIVATOR_SERVICE_URL", String::new());
        assert!(parse_map(&env).is_ok());
    }

    #[test]
    fn booleans_parse_as_go_does() {
        for text in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(go_bool(text), Some(true));
        }
        for text in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(go_bool(text), Some(false));
        }
        for text in ["", "yes", "tRUE", " true"] {
            assert_eq!(go_bool(text), None);
        }
    }

    /// Review finding: the sidecar got the activator's budget (64 MiB kept back, 75 % of the
    /// rest for the caps), so a 64 MiB limit exited 2 and 128 MiB queued 6 144 requests at most,
    /// fewer than the breaker's 10 × CC from CC 615. Rows: (limit MiB, containerConcurrency) →
    /// fits; then every request the breaker promises (CC in flight, 10 × CC waiting, each on a
    /// connection) is admitted by the caps. Each of those connections is counted at the worst a
    /// connection costs (`budget::CONNECTION_BYTES`), so 128 MiB holds CC 250 but not 615: that
    /// is refused at start, naming CONTAINER_CONCURRENCY, instead of answering 503 later.
    #[test]
    fn a_sidecar_sized_limit_holds_the_breaker_or_is_refused_naming_containerconcurrency() {
        const MIB: u64 = 1 << 20;
        let rows: &[(u64, u32, bool)] = &[
            (32, 0, true),
            (32, 1, true),
            (32, 10, true),
            (64, 10, true),
            (128, 250, true),
            (32, 100, false),
            (128, 615, false),
            (64, 1000, false),
        ];
        for &(limit, concurrency, fits) in rows {
            let mut vars = knative();
            vars.insert("CONTAINER_CONCURRENCY", concurrency.to_string());
            let env = parse_map(&vars).expect("a Knative environment");
            let proxy = crate::config::ProxySettings::default();
            let fitted = budget::fit(&proxy, 1, Some(limit * MIB), &env.budget_needs());
            match fitted {
                Ok(fitted) => {
                    assert!(fits, "{limit} MiB, CC {concurrency}: fits, unexpectedly");
                    let waiting = concurrency * QUEUE_PER_CONCURRENCY;
                    let caps = fitted.caps;
                    assert!(
                        caps.max_queued_requests >= waiting.max(1),
                        "{limit} MiB {caps:?}"
                    );
                    assert!(
                        caps.max_connections_per_shard
                            >= (concurrency + waiting) as usize + SPARE_CONNECTIONS,
                        "{limit} MiB, CC {concurrency}: {caps:?}"
                    );
                    let room = (limit * MIB - budget::QUEUE_PROXY_RESERVED_BYTES) / 100
                        * budget::CAPS_PERCENT;
                    assert!(fitted.worst <= room, "{limit} MiB, CC {concurrency}");
                }
                Err(error) => {
                    assert!(!fits, "{limit} MiB, CC {concurrency}: {error}");
                    assert!(error.contains("CONTAINER_CONCURRENCY"), "{error}");
                }
            }
        }
    }
}
