//! `OBSERVABILITY_CONFIG`: how Knative 1.19–1.23 tells its queue-proxy about request logs,
//! request metrics, tracing and profiling, decoded as upstream decodes it and turned into what
//! this queue-proxy does.
//!
//! Upstream (release-1.23; paths in knative/serving, `vendor/` is knative.dev/pkg as vendored
//! there):
//! * The reconciler marshals serving's `observability.Config` with `encoding/json` into the one
//!   variable (`pkg/reconciler/revision/resources/queue.go:325,447-448`); 1.19 replaced
//!   `SERVING_ENABLE_REQUEST_LOG`, `SERVING_REQUEST_LOG_TEMPLATE`, `SERVING_REQUEST_METRICS_*`
//!   and `TRACING_CONFIG_*` with it.
//! * The queue-proxy starts from `observability.DefaultConfig()` (`pkg/queue/sharedmain/
//!   main.go:179`) and, when the variable is not empty, `json.Unmarshal`s it over those defaults
//!   (`main.go:193-197`); an error is fatal. It never reads the 1.18 keys (its `config` struct,
//!   `main.go:88-111`, has none of them), so with this variable they are not read here either.
//!
//! The JSON (`pkg/observability/config.go:54-81`, `vendor/knative.dev/pkg/observability/
//! config.go:33-37`; `BaseConfig` is embedded, so its three fields sit at the top level):
//!
//! ```text
//! {
//!   "tracing":        {"protocol": str, "endpoint": str, "samplingRate": float},
//!   "metrics":        {"protocol": str, "endpoint": str, "exportInterval": int ns},
//!   "runtime":        {"profiling": str, "exportInterval": int ns},
//!   "requestMetrics": {"protocol": str, "endpoint": str, "exportInterval": int ns},
//!   "EnableVarLogCollection": bool, "LoggingURLTemplate": str,
//!   "enableRequestLog": bool, "requestLogTemplate": str, "enableProbeRequestLog": bool
//! }
//! ```
//!
//! Every inner field is `omitempty`, so the reconciler leaves out zero values and an absent
//! field keeps its default: protocols `none` (`vendor/.../metrics/config.go:66-69`,
//! `tracing/config.go:61-64`), profiling `disabled` and a 15 s runtime interval
//! (`runtime/config.go:54-59`), and the request-log template Knative's default
//! (`pkg/observability/config.go:34,97-104`). With an empty `config-observability` the variable
//! reads [`KNATIVE_1_23_DEFAULTS`]. Durations are Go `time.Duration`s: integer nanoseconds.
//!
//! What each field means to the queue-proxy, and what this one does with it:
//! * `enableRequestLog`, `requestLogTemplate`, `enableProbeRequestLog`: the request log
//!   (`pkg/queue/sharedmain/handlers.go:92-96`, `main.go:423-445`): on only when enabled; an
//!   empty template writes nothing (`pkg/http/request_log.go:104-123`). Acted on, as the 1.18
//!   keys are.
//! * `requestMetrics`: where the queue-proxy's request metrics go (`pkg/queue/sharedmain/
//!   otel.go:49-62`, `vendor/.../metrics/provider.go:53-87`): `none` exports nothing;
//!   `prometheus` serves them at `endpoint` (`host:port`, port 1024–65535, empty host: every
//!   interface; `prometheus_enabled.go:42-55`, `prometheus/server.go:154-163`), `:9091` when
//!   empty; `grpc` and `http/protobuf` push over OTLP every `exportInterval`; anything else is
//!   fatal. Acted on: `grpc` and `http/protobuf` push upstream's instruments
//!   ([`crate::queue_proxy::request_metrics`]) to the endpoint, read as the tracing endpoint is
//!   read (`vendor/.../metrics/provider.go:144-169`, [`kactivator_telemetry::endpoint`]), every
//!   `exportInterval`, or 60 s when it is 0 or negative (OpenTelemetry Go's `WithInterval`
//!   ignores a duration that is not positive, `vendor/go.opentelemetry.io/otel/sdk/metric/
//!   periodic_reader.go:92-100`). An endpoint the exporter cannot use is fatal (exit 2 naming
//!   the field): one Go's `url.Parse` refuses is fatal upstream too; an empty one, or
//!   `https://` and a bare `host:port` (read as `https://`), which upstream would use, are
//!   refused because TLS to collectors is not built and a pod whose metrics silently go
//!   nowhere is worse than one that says why it will not start.
//! * `tracing`: the span exporter (`otel.go:75-85`, `vendor/.../tracing/provider.go:54-100`):
//!   `none`, `grpc`, `http/protobuf`, `stdout`; anything else is fatal. Acted on: read into the
//!   [`TracingConfig`] the exporters take, with upstream's meanings ([`trace::opentelemetry`]:
//!   `stdout` samples every trace, and the endpoint matters only to `grpc` and
//!   `http/protobuf`). The rate is clamped to 0..=1, as upstream's sampler treats it
//!   (`provider.go:188-194`). An endpoint the exporters cannot use
//!   ([`TracingConfig::validate`]: empty, not a URL, or `https://` and a bare `host:port`, which
//!   upstream reads as `https://`, since TLS to collectors is not built) turns tracing off with
//!   a warning naming the field, and the pod starts: a missing exporter loses spans, not
//!   requests (upstream starts with an empty or hostless endpoint too, its exports going
//!   nowhere; it exits on one Go's `url.Parse` refuses, `provider.go:153-157`).
//! * `runtime.profiling`: `enabled` serves pprof on :8008 (`main.go:261-266`). Not built
//!   (warned about). `runtime.exportInterval` paces Go's runtime metrics: nothing to pace here.
//! * `metrics`, `EnableVarLogCollection`, `LoggingURLTemplate`: the controllers' settings; the
//!   queue-proxy does not use them (the last two are even documented as not for it,
//!   `config.go:59-71`). Decoded and type-checked only.
//!
//! The decoder follows `encoding/json` where a hand-written value could tell the difference:
//! unknown fields are skipped; a name matches its field without regard to case (Go's
//! `bytes.EqualFold`, under which `ſ` is `s` and the Kelvin sign is `k`); a repeated name
//! applies again, and a repeated object merges into what is there; `null` leaves a field as it
//! was, at the top too; an integer field refuses `1.0`, `1e9` and anything outside `i64`.
//! Differences: a lone UTF-16 surrogate escape (`"\ud800"`) in a field the queue-proxy reads is
//! refused where Go substitutes U+FFFD, and a skipped value may nest deeper than Go's limit of
//! 10 000 (it is walked without recursion); the reconciler's `json.Marshal` writes neither.
//!
//! Upstream's queue-proxy checks nothing the reconciler's own validation checks (`Validate` is
//! not called on this path), and this one follows it: a value config-observability would refuse
//! but the queue-proxy can run with (a negative interval, a sampling rate of 2, taken as 1)
//! starts. What the queue-proxy itself fails on exits 2 here, naming the field: JSON that does
//! not decode, a request-metrics or tracing protocol it does not know, a Prometheus endpoint it
//! cannot listen on, an OTLP metrics endpoint it cannot push to. The request-log template is
//! parsed at start too (README: request logs).

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use kactivator_telemetry::{MetricsConfig, MetricsProtocol};

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Unexpected, Visitor};

use crate::config::trace::{self, TracingConfig};

/// What the 1.23 reconciler sets with an empty `config-observability`: `DefaultConfig()`
/// marshalled (produced with `encoding/json` from the structs above).
pub const KNATIVE_1_23_DEFAULTS: &str = r#"{"tracing":{"protocol":"none"},"metrics":{"protocol":"none"},"runtime":{"profiling":"disabled","exportInterval":15000000000},"requestMetrics":{"protocol":"none"},"requestLogTemplate":"{\"httpRequest\": {\"requestMethod\": \"{{.Request.Method}}\", \"requestUrl\": \"{{js .Request.RequestURI}}\", \"requestSize\": \"{{.Request.ContentLength}}\", \"status\": {{.Response.Code}}, \"responseSize\": \"{{.Response.Size}}\", \"userAgent\": \"{{js .Request.UserAgent}}\", \"remoteIp\": \"{{js .Request.RemoteAddr}}\", \"serverIp\": \"{{.Revision.PodIP}}\", \"referer\": \"{{js .Request.Referer}}\", \"latency\": \"{{.Response.Latency}}s\", \"protocol\": \"{{.Request.Proto}}\"}, \"traceId\": \"{{.TraceID}}\"}"}"#;

/// Knative's default request-log template, the same text since 1.21
/// (`pkg/observability/config.go:34`).
pub const DEFAULT_REQUEST_LOG_TEMPLATE: &str = kactivator_template::KNATIVE_1_21_DEFAULT;

/// Where upstream serves Prometheus request metrics when `requestMetrics.endpoint` is empty
/// (`networking.UserQueueMetricsPort`, `otel.go:51-54`).
pub const USER_METRICS_PORT: u16 = 9091;

/// The lowest port upstream's Prometheus server accepts (`prometheus/server.go:38,160`).
pub const MIN_PROMETHEUS_PORT: u16 = 1024;

/// Upstream's protocol names (`vendor/.../metrics/config.go:27-30`, `tracing/config.go:27-30`).
pub const PROTOCOL_NONE: &str = "none";
pub const PROTOCOL_PROMETHEUS: &str = "prometheus";
pub const PROTOCOL_GRPC: &str = "grpc";
pub const PROTOCOL_HTTP_PROTOBUF: &str = "http/protobuf";
pub const PROTOCOL_STDOUT: &str = "stdout";

/// Serving's `observability.Config` as the queue-proxy holds it after decoding.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservabilityConfig {
    pub tracing: Tracing,
    /// The controllers' metrics exporter; the queue-proxy does not use it.
    pub metrics: MetricsExport,
    pub runtime: Runtime,
    pub request_metrics: MetricsExport,
    /// Not for the queue-proxy (`config.go:59-64`).
    pub enable_var_log_collection: bool,
    /// Not for the queue-proxy (`config.go:66-71`).
    pub logging_url_template: String,
    pub enable_request_log: bool,
    pub request_log_template: String,
    pub enable_probe_request_log: bool,
}

/// knative.dev/pkg `tracing.Config`.
#[derive(Clone, Debug, PartialEq)]
pub struct Tracing {
    /// Default `none`.
    pub protocol: String,
    pub endpoint: String,
    /// 0 to 1 in a valid config-observability. Default 0.
    pub sampling_rate: f64,
}

/// knative.dev/pkg `metrics.Config`.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsExport {
    /// Default `none`.
    pub protocol: String,
    pub endpoint: String,
    /// Nanoseconds; 0: the OpenTelemetry default (60 s). Default 0.
    pub export_interval_nanos: i64,
}

/// knative.dev/pkg `runtime.Config`.
#[derive(Clone, Debug, PartialEq)]
pub struct Runtime {
    /// Only `enabled` turns profiling on. Default `disabled`.
    pub profiling: String,
    /// Nanoseconds. Default 15 s.
    pub export_interval_nanos: i64,
}

impl Default for ObservabilityConfig {
    /// `observability.DefaultConfig()` (`config.go:97-104`).
    fn default() -> ObservabilityConfig {
        let none = || MetricsExport {
            protocol: PROTOCOL_NONE.into(),
            endpoint: String::new(),
            export_interval_nanos: 0,
        };
        ObservabilityConfig {
            tracing: Tracing {
                protocol: PROTOCOL_NONE.into(),
                endpoint: String::new(),
                sampling_rate: 0.0,
            },
            metrics: none(),
            runtime: Runtime {
                profiling: "disabled".into(),
                export_interval_nanos: 15_000_000_000,
            },
            request_metrics: none(),
            enable_var_log_collection: false,
            logging_url_template: String::new(),
            enable_request_log: false,
            request_log_template: DEFAULT_REQUEST_LOG_TEMPLATE.into(),
            enable_probe_request_log: false,
        }
    }
}

/// Where upstream's request metrics go, decided by `requestMetrics`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestMetricsExport {
    /// `none`: upstream's names are neither served nor pushed.
    Off,
    /// `prometheus`: served for scraping, on `listen` (`None`: [`USER_METRICS_PORT`] on every
    /// interface, the queue-proxy's usual metrics port).
    Prometheus { listen: Option<SocketAddr> },
    /// `grpc` or `http/protobuf`: pushed over OTLP; upstream's names are not served.
    Otlp(MetricsConfig),
}

/// What this queue-proxy does with a decoded [`ObservabilityConfig`].
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The request log's template, when the log is on and the template is not empty.
    pub request_log_template: Option<String>,
    pub probe_request_log: bool,
    pub request_metrics: RequestMetricsExport,
    /// The tracing asked for (`tracing.*`).
    pub tracing: TracingConfig,
    /// Settings asked for that are not built here, each `(field, what happens instead)`, for
    /// start-up to warn about.
    pub not_built: Vec<(&'static str, String)>,
    /// Settings taken otherwise than asked, each `(field, what happens instead)`, for start-up
    /// to warn about.
    pub warnings: Vec<(&'static str, String)>,
}

impl ObservabilityConfig {
    /// Decodes the variable's text over the defaults, as `json.Unmarshal` over
    /// `DefaultConfig()`. The error says what and where (line and column).
    pub fn decode(text: &str) -> Result<ObservabilityConfig, String> {
        let mut config = ObservabilityConfig::default();
        let mut deserializer = serde_json::Deserializer::from_str(text);
        Object {
            target: &mut config,
            path: "",
        }
        .deserialize(&mut deserializer)
        .and_then(|()| deserializer.end())
        .map_err(|error| error.to_string())?;
        Ok(config)
    }

    /// What this queue-proxy does with the configuration; `Err` lists each field upstream's
    /// queue-proxy would exit on, with why.
    pub fn plan(&self) -> Result<Plan, Vec<String>> {
        let mut problems = Vec::new();
        let mut not_built = Vec::new();
        let metrics = &self.request_metrics;
        let request_metrics = match metrics.protocol.as_str() {
            PROTOCOL_NONE => RequestMetricsExport::Off,
            PROTOCOL_PROMETHEUS => match prometheus_listen(&metrics.endpoint) {
                Ok(listen) => RequestMetricsExport::Prometheus { listen },
                Err(problem) => {
                    problems.push(format!("requestMetrics.endpoint: {problem}"));
                    RequestMetricsExport::Off
                }
            },
            PROTOCOL_GRPC | PROTOCOL_HTTP_PROTOBUF => {
                let config = MetricsConfig {
                    protocol: match metrics.protocol.as_str() {
                        PROTOCOL_GRPC => MetricsProtocol::Grpc,
                        _ => MetricsProtocol::HttpProtobuf,
                    },
                    endpoint: metrics.endpoint.clone(),
                    interval: export_interval(metrics.export_interval_nanos),
                };
                match config.collector() {
                    Ok(_) => RequestMetricsExport::Otlp(config),
                    Err(error) => {
                        problems.push(format!("requestMetrics.endpoint: {error}"));
                        RequestMetricsExport::Off
                    }
                }
            }
            other => {
                problems.push(format!(
                    "requestMetrics.protocol: {other:?} is not one of none, prometheus, grpc, \
                     http/protobuf"
                ));
                RequestMetricsExport::Off
            }
        };
        let mut warnings = Vec::new();
        let tracing = match trace::opentelemetry_protocol(&self.tracing.protocol) {
            Some(protocol) => {
                let rate = trace::clamped_rate(self.tracing.sampling_rate);
                let tracing = trace::opentelemetry(protocol, &self.tracing.endpoint, rate);
                match tracing.validate() {
                    Ok(()) => tracing,
                    Err(error) => {
                        warnings.push(("tracing.endpoint", format!("{error}; tracing is off")));
                        TracingConfig::OFF
                    }
                }
            }
            None => {
                problems.push(format!(
                    "tracing.protocol: {:?} is not one of {}",
                    self.tracing.protocol,
                    trace::OPENTELEMETRY_PROTOCOLS.join(", ")
                ));
                TracingConfig::OFF
            }
        };
        // Upstream: only the exact word turns profiling on (`runtime/config.go:50-52`).
        if self.runtime.profiling == "enabled" {
            not_built.push((
                "runtime.profiling",
                "\"enabled\": the profiling server (:8008) is not built".into(),
            ));
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Plan {
            request_log_template: (self.enable_request_log
                && !self.request_log_template.is_empty())
            .then(|| self.request_log_template.clone()),
            probe_request_log: self.enable_probe_request_log,
            request_metrics,
            tracing,
            not_built,
            warnings,
        })
    }
}

/// `requestMetrics.exportInterval` as OpenTelemetry Go's periodic reader takes it: a positive
/// duration as is, anything else its default (60 s).
fn export_interval(nanos: i64) -> Duration {
    match u64::try_from(nanos) {
        Ok(nanos) if nanos > 0 => Duration::from_nanos(nanos),
        _ => kactivator_telemetry::metrics::DEFAULT_EXPORT_INTERVAL,
    }
}

/// `requestMetrics.endpoint` for `prometheus`: `""` is the usual port; otherwise Go's
/// `net.SplitHostPort` grammar, a decimal port of at least [`MIN_PROMETHEUS_PORT`], and an
/// empty host for every interface. ★ The host must be an IP address (Go would also resolve a
/// name) and carry no zone.
fn prometheus_listen(endpoint: &str) -> Result<Option<SocketAddr>, String> {
    if endpoint.is_empty() {
        return Ok(None);
    }
    let shape = || {
        format!(
            "{endpoint:?} is not \"host:port\" or \"[host]:port\" (upstream's Prometheus \
             exporter needs one)"
        )
    };
    let (host, port) = match endpoint.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest.split_once(']').ok_or_else(shape)?;
            let port = after.strip_prefix(':').ok_or_else(shape)?;
            if host.contains(['[', ']']) || port.contains(['[', ']', ':']) {
                return Err(shape());
            }
            (host, port)
        }
        None => {
            let (host, port) = endpoint.rsplit_once(':').ok_or_else(shape)?;
            if host.contains([':', '[', ']']) || port.contains([']', '[']) {
                return Err(shape());
            }
            (host, port)
        }
    };
    // Go's `strconv.ParseUint(port, 10, 16)`: decimal digits only (no sign), at most 65535.
    let not_a_port = || format!("{endpoint:?}: {port:?} is not a port number");
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(not_a_port());
    }
    let port: u16 = port.parse().map_err(|_| not_a_port())?;
    if port < MIN_PROMETHEUS_PORT {
        return Err(format!(
            "{endpoint:?}: port {port} is below {MIN_PROMETHEUS_PORT} (upstream's Prometheus \
             exporter refuses it)"
        ));
    }
    if host.is_empty() {
        return Ok(Some(SocketAddr::new(
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            port,
        )));
    }
    if host.contains('%') {
        return Err(format!(
            "{endpoint:?}: an address with a zone is not supported"
        ));
    }
    match host.parse::<IpAddr>() {
        Ok(ip) => Ok(Some(SocketAddr::new(ip, port))),
        Err(_) => Err(format!(
            "{endpoint:?}: {host:?} is not an IP address (a host name is not supported; leave \
             the host empty for every interface)"
        )),
    }
}

// === The decoder: encoding/json's rules over serde ===

/// A struct of upstream's, decoded field by field in the order the JSON gives them.
trait GoStruct {
    /// The fields' JSON names as upstream tags them.
    const FIELDS: &'static [&'static str];

    /// Decodes the value of field `index` (of [`GoStruct::FIELDS`]) into `self`.
    fn field<'de, A: MapAccess<'de>>(
        &mut self,
        index: usize,
        path: &str,
        map: &mut A,
    ) -> Result<(), A::Error>;
}

/// Whether a JSON name selects a field named `field`, as `encoding/json` matches: exactly or
/// under Unicode simple case folding. Every field name here is ASCII letters, and the only
/// non-ASCII characters that fold to ASCII letters are `ſ` (s) and the Kelvin sign (k).
fn names_field(name: &str, field: &str) -> bool {
    let mut name = name.chars().map(|c| match c {
        '\u{17f}' => 's',
        '\u{212a}' => 'k',
        c => c.to_ascii_lowercase(),
    });
    let mut field = field.chars().map(|c| c.to_ascii_lowercase());
    loop {
        match (name.next(), field.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

/// Decodes an object into an existing struct, as `json.Unmarshal` into a filled-in value.
struct Object<'a, T> {
    target: &'a mut T,
    path: &'a str,
}

impl<'de, T: GoStruct> DeserializeSeed<'de> for Object<'_, T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, T: GoStruct> Visitor<'de> for Object<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "a JSON object")
        } else {
            write!(f, "{} to be an object", self.path)
        }
    }

    /// `null` leaves the value as it was.
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name) = map.next_key::<String>()? {
            match T::FIELDS.iter().position(|field| names_field(&name, field)) {
                Some(index) => self.target.field(index, self.path, &mut map)?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// A JSON scalar as `encoding/json` puts it into a Go field of the type.
trait GoScalar: Sized {
    /// "a string", "a boolean", …
    const WHAT: &'static str;
    fn from_text(_: &str) -> Option<Self> {
        None
    }
    fn from_bool(_: bool) -> Option<Self> {
        None
    }
    fn from_i64(_: i64) -> Option<Self> {
        None
    }
    fn from_u64(_: u64) -> Option<Self> {
        None
    }
    fn from_f64(_: f64) -> Option<Self> {
        None
    }
}

impl GoScalar for String {
    const WHAT: &'static str = "a string";
    fn from_text(text: &str) -> Option<String> {
        Some(text.to_string())
    }
}

impl GoScalar for bool {
    const WHAT: &'static str = "a boolean";
    fn from_bool(value: bool) -> Option<bool> {
        Some(value)
    }
}

/// A Go `time.Duration`: an `int64` of nanoseconds; `1.0` and `1e9` are refused, as Go's
/// `strconv.ParseInt` of the literal refuses them.
impl GoScalar for i64 {
    const WHAT: &'static str = "an integer (nanoseconds)";
    fn from_i64(value: i64) -> Option<i64> {
        Some(value)
    }
    fn from_u64(value: u64) -> Option<i64> {
        i64::try_from(value).ok()
    }
}

impl GoScalar for f64 {
    const WHAT: &'static str = "a number";
    fn from_i64(value: i64) -> Option<f64> {
        Some(value as f64)
    }
    fn from_u64(value: u64) -> Option<f64> {
        Some(value as f64)
    }
    fn from_f64(value: f64) -> Option<f64> {
        Some(value)
    }
}

/// Decodes a scalar into an existing field; `null` leaves it as it was.
struct Scalar<'a, T> {
    target: &'a mut T,
    path: String,
}

impl<'de, T: GoScalar> DeserializeSeed<'de> for Scalar<'_, T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<T: GoScalar> Scalar<'_, T> {
    fn set<E: de::Error>(self, value: Option<T>, unexpected: Unexpected) -> Result<(), E> {
        match value {
            Some(value) => {
                *self.target = value;
                Ok(())
            }
            None => Err(E::invalid_type(unexpected, &self)),
        }
    }
}

impl<'de, T: GoScalar> Visitor<'de> for Scalar<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} to be {}", self.path, T::WHAT)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<(), E> {
        self.set(T::from_text(value), Unexpected::Str(value))
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<(), E> {
        self.set(T::from_bool(value), Unexpected::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<(), E> {
        self.set(T::from_i64(value), Unexpected::Signed(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<(), E> {
        self.set(T::from_u64(value), Unexpected::Unsigned(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<(), E> {
        self.set(T::from_f64(value), Unexpected::Float(value))
    }
}

fn scalar<'de, A: MapAccess<'de>, T: GoScalar>(
    map: &mut A,
    target: &mut T,
    path: &str,
    name: &str,
) -> Result<(), A::Error> {
    map.next_value_seed(Scalar {
        target,
        path: child(path, name),
    })
}

fn object<'de, A: MapAccess<'de>, T: GoStruct>(
    map: &mut A,
    target: &mut T,
    path: &str,
    name: &str,
) -> Result<(), A::Error> {
    let path = child(path, name);
    map.next_value_seed(Object {
        target,
        path: &path,
    })
}

impl GoStruct for ObservabilityConfig {
    const FIELDS: &'static [&'static str] = &[
        "tracing",
        "metrics",
        "runtime",
        "requestMetrics",
        "EnableVarLogCollection",
        "LoggingURLTemplate",
        "enableRequestLog",
        "requestLogTemplate",
        "enableProbeRequestLog",
    ];

    fn field<'de, A: MapAccess<'de>>(
        &mut self,
        index: usize,
        path: &str,
        map: &mut A,
    ) -> Result<(), A::Error> {
        let name = Self::FIELDS[index];
        match index {
            0 => object(map, &mut self.tracing, path, name),
            1 => object(map, &mut self.metrics, path, name),
            2 => object(map, &mut self.runtime, path, name),
            3 => object(map, &mut self.request_metrics, path, name),
            4 => scalar(map, &mut self.enable_var_log_collection, path, name),
            5 => scalar(map, &mut self.logging_url_template, path, name),
            6 => scalar(map, &mut self.enable_request_log, path, name),
            7 => scalar(map, &mut self.request_log_template, path, name),
            _ => scalar(map, &mut self.enable_probe_request_log, path, name),
        }
    }
}

impl GoStruct for Tracing {
    const FIELDS: &'static [&'static str] = &["protocol", "endpoint", "samplingRate"];

    fn field<'de, A: MapAccess<'de>>(
        &mut self,
        index: usize,
        path: &str,
        map: &mut A,
    ) -> Result<(), A::Error> {
        let name = Self::FIELDS[index];
        match index {
            0 => scalar(map, &mut self.protocol, path, name),
            1 => scalar(map, &mut self.endpoint, path, name),
            _ => scalar(map, &mut self.sampling_rate, path, name),
        }
    }
}

impl GoStruct for MetricsExport {
    const FIELDS: &'static [&'static str] = &["protocol", "endpoint", "exportInterval"];

    fn field<'de, A: MapAccess<'de>>(
        &mut self,
        index: usize,
        path: &str,
        map: &mut A,
    ) -> Result<(), A::Error> {
        let name = Self::FIELDS[index];
        match index {
            0 => scalar(map, &mut self.protocol, path, name),
            1 => scalar(map, &mut self.endpoint, path, name),
            _ => scalar(map, &mut self.export_interval_nanos, path, name),
        }
    }
}

impl GoStruct for Runtime {
    const FIELDS: &'static [&'static str] = &["profiling", "exportInterval"];

    fn field<'de, A: MapAccess<'de>>(
        &mut self,
        index: usize,
        path: &str,
        map: &mut A,
    ) -> Result<(), A::Error> {
        let name = Self::FIELDS[index];
        match index {
            0 => scalar(map, &mut self.profiling, path, name),
            _ => scalar(map, &mut self.export_interval_nanos, path, name),
        }
    }
}

#[cfg(test)]
mod tests;
