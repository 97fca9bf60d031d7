#![forbid(unsafe_code)]

//! Tracing (issue 39): what the operator configured ([`TracingConfig`], from whichever source
//! the role reads: config-observability or config-tracing in the activator's cluster,
//! `OBSERVABILITY_CONFIG` or `TRACING_CONFIG_*` in the queue-proxy's environment, `[tracing]`
//! in the file), and the exporters that send the shards' finished spans
//! (`kactivator_api::trace::span`) on the control thread, off the request path.
//!
//! * [`encode`]: pure functions from spans to OTLP protobuf, Zipkin v2 JSON and stdout lines;
//! * [`endpoint`]: what a configured endpoint means, as Knative reads it;
//! * [`run`]: the driver on the control thread: batches, one export at a time, counters.
//!
//! And metrics pushed over OTLP (the queue-proxy's `requestMetrics` with `grpc` or
//! `http/protobuf`): [`metrics`] (the settings, the snapshot a caller hands over, the periodic
//! driver), encoded by [`encode::metrics`] and sent through the same OTLP client as spans.
//!
//! The OTLP messages are compiled from OpenTelemetry's own definitions ([`proto`]).

use std::fmt;

pub mod encode;
pub mod endpoint;
pub mod metrics;
pub mod proto;

mod batch;
mod driver;
mod export;

pub use driver::{
    run, run_with, BatchConfig, CountersSnapshot, ExportCounters, DEFAULT_EXPORT_TIMEOUT,
    DEFAULT_FAILURE_LOG_INTERVAL, DEFAULT_MAX_EXPORT_BATCH_SIZE, DEFAULT_MAX_QUEUE_SIZE,
    DEFAULT_SCHEDULE_DELAY,
};
pub use endpoint::{Collector, EndpointError, Signal};
pub use export::{ExportError, ExportFailure, EXPORTER_USER_AGENT, RESPONSE_BODY_LIMIT};
pub use metrics::{MetricsConfig, MetricsProtocol};

/// The instrumentation scope every exported span carries (OTLP's `InstrumentationScope.name`,
/// Zipkin's `otel.scope.name` tag).
pub const SCOPE_NAME: &str = "kactivator";
/// The scope's version: this crate's, which is the binary's.
pub const SCOPE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where finished spans go.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TraceProtocol {
    /// Tracing off: no span is recorded and the propagation headers pass untouched.
    None,
    /// OTLP over gRPC (`opentelemetry.proto.collector.trace.v1.TraceService/Export`), HTTP/2
    /// without TLS.
    Grpc,
    /// OTLP over HTTP/1.1 with a protobuf body: `POST <endpoint>`, to `/v1/traces` when the
    /// endpoint has no path ([`endpoint`] says why).
    HttpProtobuf,
    /// One line per span on stdout, for debugging ([`encode::stdout`]).
    Stdout,
    /// Zipkin's v2 JSON API (`POST <zipkin-endpoint>`), what Knative 1.18's config-tracing
    /// `backend: zipkin` sends.
    Zipkin,
}

impl TraceProtocol {
    /// The name config-observability gives it (`zipkin` is config-tracing's `backend`).
    pub const fn label(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http/protobuf",
            Self::Stdout => "stdout",
            Self::Zipkin => "zipkin",
        }
    }

    /// Whether this protocol sends to a collector, and so needs an endpoint.
    pub const fn needs_endpoint(&self) -> bool {
        matches!(self, Self::Grpc | Self::HttpProtobuf | Self::Zipkin)
    }
}

/// The tracing settings in force.
#[derive(Clone, Debug, PartialEq)]
pub struct TracingConfig {
    pub protocol: TraceProtocol,
    /// The collector, as Knative's `tracing-endpoint` (or 1.18's `zipkin-endpoint`) writes it:
    /// `http://host[:port][/path]`; [`endpoint`] says how each protocol reads it. Empty for
    /// `None` and `Stdout`. `https://` is refused: TLS to collectors is not built.
    pub endpoint: String,
    /// The ratio of new traces sampled, 0 to 1 (parent-based: a parent's decision is kept).
    pub sampling_rate: f64,
}

impl TracingConfig {
    /// Tracing off.
    pub const OFF: TracingConfig = TracingConfig {
        protocol: TraceProtocol::None,
        endpoint: String::new(),
        sampling_rate: 0.0,
    };

    pub fn enabled(&self) -> bool {
        self.protocol != TraceProtocol::None
    }

    /// Checks the settings as Knative's `tracing.Config.Validate` does (knative.dev/pkg
    /// `observability/tracing/config.go`, release-1.23, lines 39-59: an endpoint for `grpc`
    /// and `http/protobuf`, none for `none` and `stdout`, a rate from 0 to 1), and that the
    /// endpoint is one the exporters can reach ([`Collector::parse`]). Sources call it when they
    /// load a config, to keep the previous setting (activator) or exit naming the key
    /// (queue-proxy); [`run`] calls it again on every change and never applies a config it
    /// refuses.
    pub fn validate(&self) -> Result<(), TracingConfigError> {
        if !(0.0..=1.0).contains(&self.sampling_rate) {
            return Err(TracingConfigError::SamplingRate(self.sampling_rate));
        }
        match (self.protocol.needs_endpoint(), self.endpoint.is_empty()) {
            (true, true) => Err(TracingConfigError::EndpointMissing(self.protocol.clone())),
            (false, false) => Err(TracingConfigError::EndpointNotAllowed(
                self.protocol.clone(),
            )),
            (true, false) => Collector::parse(&self.protocol, &self.endpoint)
                .map(drop)
                .map_err(TracingConfigError::Endpoint),
            (false, true) => Ok(()),
        }
    }
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self::OFF
    }
}

/// Why a [`TracingConfig`] is refused. The messages name the setting by its meaning
/// (endpoint, sampling rate); the source that read it adds the key it came from.
#[derive(Clone, Debug, PartialEq)]
pub enum TracingConfigError {
    /// `grpc`, `http/protobuf` and `zipkin` need an endpoint.
    EndpointMissing(TraceProtocol),
    /// `none` and `stdout` send nowhere; Knative refuses an endpoint with them.
    EndpointNotAllowed(TraceProtocol),
    /// The endpoint cannot be used (see [`EndpointError`]).
    Endpoint(EndpointError),
    /// A sampling rate outside 0 to 1 (or not a number).
    SamplingRate(f64),
}

impl fmt::Display for TracingConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EndpointMissing(protocol) => {
                write!(
                    f,
                    "tracing protocol {:?} needs an endpoint",
                    protocol.label()
                )
            }
            Self::EndpointNotAllowed(protocol) => write!(
                f,
                "tracing protocol {:?} sends nowhere: leave the endpoint empty",
                protocol.label()
            ),
            Self::Endpoint(error) => error.fmt(f),
            Self::SamplingRate(rate) => {
                write!(f, "tracing sampling rate {rate} is not between 0 and 1")
            }
        }
    }
}

impl std::error::Error for TracingConfigError {}

/// Who is exporting: OpenTelemetry's resource attributes on every batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resource {
    /// `service.name`: `activator` for the activator role, the revision's Service
    /// (`SERVING_SERVICE`, else the revision) for the queue-proxy role as upstream names it.
    pub service_name: String,
    /// `service.instance.id`: the pod's name when known.
    pub instance_id: Option<String>,
    /// Further attributes (`k8s.namespace.name`, `kn.revision.name`, …).
    pub attributes: Vec<(String, String)>,
}

impl Resource {
    /// Every attribute in the order the encoders write them: `service.name`, then
    /// `service.instance.id` when known, then [`Resource::attributes`].
    pub fn all_attributes(&self) -> impl Iterator<Item = (&str, &str)> {
        let service = std::iter::once(("service.name", self.service_name.as_str()));
        let instance = self
            .instance_id
            .as_deref()
            .map(|id| ("service.instance.id", id));
        service.chain(instance).chain(
            self.attributes
                .iter()
                .map(|(key, value)| (key.as_str(), value.as_str())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(protocol: TraceProtocol, endpoint: &str, rate: f64) -> TracingConfig {
        TracingConfig {
            protocol,
            endpoint: endpoint.to_owned(),
            sampling_rate: rate,
        }
    }

    #[test]
    fn validation_follows_knatives_rules() {
        use TraceProtocol::*;
        let ok = [
            config(None, "", 0.0),
            config(Stdout, "", 1.0),
            config(HttpProtobuf, "http://collector:4318/v1/traces", 0.5),
            config(Grpc, "http://collector:4317", 1.0),
            config(Zipkin, "http://zipkin:9411/api/v2/spans", 0.1),
        ];
        for config in ok {
            assert_eq!(config.validate(), Ok(()), "{config:?}");
        }
        let refused = [
            (
                config(Grpc, "", 1.0),
                "tracing protocol \"grpc\" needs an endpoint",
            ),
            (
                config(Stdout, "http://collector:4318", 1.0),
                "tracing protocol \"stdout\" sends nowhere: leave the endpoint empty",
            ),
            (
                config(HttpProtobuf, "http://c:4318", 1.5),
                "tracing sampling rate 1.5 is not between 0 and 1",
            ),
            (
                config(HttpProtobuf, "http://c:4318", f64::NAN),
                "tracing sampling rate NaN is not between 0 and 1",
            ),
            (
                config(HttpProtobuf, "https://collector:4318/v1/traces", 1.0),
                "tracing endpoint \"https://collector:4318/v1/traces\": TLS to trace collectors \
                 is not built; use an http:// endpoint (a plaintext collector)",
            ),
        ];
        for (config, message) in refused {
            assert_eq!(config.validate().unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn resource_attributes_start_with_the_service() {
        let resource = Resource {
            service_name: "activator".into(),
            instance_id: Some("activator-7d9f".into()),
            attributes: vec![("k8s.namespace.name".into(), "knative-serving".into())],
        };
        let all: Vec<_> = resource.all_attributes().collect();
        assert_eq!(
            all,
            [
                ("service.name", "activator"),
                ("service.instance.id", "activator-7d9f"),
                ("k8s.namespace.name", "knative-serving"),
            ]
        );
    }
}
