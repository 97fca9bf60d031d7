//! What a configured collector endpoint means: the collector's address, the path posted to, and
//! the endpoints refused, read as Knative 1.19–1.23 reads `tracing-endpoint` (and the
//! queue-proxy's `requestMetrics.endpoint`) and 1.18 reads `zipkin-endpoint`.
//!
//! What upstream does (knative.dev/pkg, branches release-1.19 to release-1.23, whose
//! `observability/tracing/provider.go` is the same file in all five; line numbers from
//! release-1.23, commit 521cb33b33ddfe74529a68ff564450c051287436):
//!
//! * `buildGRPC` and `buildHTTP` (lines 104-137) hand the endpoint to the OpenTelemetry Go
//!   exporters' `WithEndpointURL` through `endpointFor` (lines 139-165), which first parses it
//!   with Go's `url.Parse`: a parse error refuses the config, and an endpoint with no `//`
//!   after its scheme (`collector:4317`: scheme `collector`, opaque `4317`) gets `https://`
//!   put in front (lines 159-161), so a bare `host:port` means TLS. (`endpointFor` also gives
//!   way to `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` when set;
//!   kactivator does not read those variables.)
//! * `WithEndpointURL` in otlptracehttp and otlptracegrpc (v1.37 to v1.44; read in
//!   knative/serving release-1.23's `vendor/go.opentelemetry.io/otel/exporters/otlp/otlptrace/
//!   otlptrace{http,grpc}/internal/otlpconfig/options.go`, lines 279-293) keeps the URL's host
//!   (with its port), its path, and `Insecure = scheme != "https"`: any scheme but `https` is
//!   plaintext.
//! * OTLP/HTTP: `NewHTTPConfig` (same file, line 96; `cleanPath`, lines 102-111) replaces an
//!   empty path with `DefaultTracesPath`, `/v1/traces` (line 33), and puts `/` before a relative
//!   one; `client.go` line 287 posts to `scheme://host/path`. So `http://collector:4318` posts
//!   to `/v1/traces`, and `http://collector:4318/v1/traces` (the example in serving's
//!   `config/core/configmaps/observability.yaml`, line 142) or any other path is posted to as
//!   written: `/v1/traces` is never appended to a path. With no port, Go's HTTP client dials 80.
//! * OTLP/gRPC: only the host is used (`otlptracegrpc/client.go` line 94,
//!   `grpc.NewClient(endpoint)`); the path is ignored, and with no port grpc-go's resolver dials
//!   443.
//! * Zipkin (1.18, knative.dev/pkg release-1.18 `tracing/opencensus.go` line 180):
//!   `httpreporter.NewReporter(zipkin-endpoint)` posts to the URL exactly as written.
//!
//! Metrics (knative.dev/pkg `observability/metrics/provider.go`, release-1.23, `buildGRPC` and
//! `buildHTTP`, lines 85-129, and its own `endpointFor`, lines 144-169) read the endpoint the
//! same way through otlpmetricgrpc's and otlpmetrichttp's `WithEndpointURL`; only the defaults
//! differ: OTLP/HTTP posts to `/v1/metrics` when the endpoint has no path
//! (`DefaultMetricsPath`), and OTLP/gRPC calls `MetricsService/Export` ([`Signal`]).
//!
//! kactivator follows all of that, and refuses what it cannot do: every `https://` endpoint,
//! and so every bare `host:port` (TLS to collectors is not built), with a message that says to
//! write `http://`.

use std::fmt;

use crate::{MetricsProtocol, TraceProtocol};

/// The path OTLP/HTTP posts spans to when the endpoint has none (otlptracehttp's
/// `DefaultTracesPath`).
pub const DEFAULT_OTLP_HTTP_PATH: &str = "/v1/traces";
/// The path OTLP/HTTP posts metrics to when the endpoint has none (otlpmetrichttp's
/// `DefaultMetricsPath`).
pub const DEFAULT_OTLP_HTTP_METRICS_PATH: &str = "/v1/metrics";
/// The port an `http://` endpoint without one means for OTLP/HTTP and Zipkin (HTTP's).
pub const DEFAULT_HTTP_PORT: u16 = 80;
/// The port an endpoint without one means for OTLP/gRPC (grpc-go's resolver default).
pub const DEFAULT_GRPC_PORT: u16 = 443;

/// Which of OpenTelemetry's signals an endpoint is for: the default path and the gRPC method
/// differ, and so does how messages name the setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Traces,
    Metrics,
}

impl Signal {
    /// Where OTLP/HTTP posts when the endpoint has no path.
    pub const fn default_http_path(self) -> &'static str {
        match self {
            Self::Traces => DEFAULT_OTLP_HTTP_PATH,
            Self::Metrics => DEFAULT_OTLP_HTTP_METRICS_PATH,
        }
    }

    /// The gRPC method OTLP/gRPC calls.
    pub const fn grpc_path(self) -> &'static str {
        match self {
            Self::Traces => crate::proto::TRACE_SERVICE_EXPORT_PATH,
            Self::Metrics => crate::proto::METRICS_SERVICE_EXPORT_PATH,
        }
    }

    /// The setting, in messages: `tracing endpoint`, `metrics endpoint`.
    const fn setting(self) -> &'static str {
        match self {
            Self::Traces => "tracing",
            Self::Metrics => "metrics",
        }
    }

    /// The collectors, in messages.
    const fn collectors(self) -> &'static str {
        match self {
            Self::Traces => "trace collectors",
            Self::Metrics => "metrics collectors",
        }
    }
}

/// How a collector is spoken to, which decides the defaults an endpoint leaves out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    OtlpGrpc,
    OtlpHttp,
    Zipkin,
}

/// A collector the exporters can reach: plaintext, by host and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collector {
    /// The host as written, without brackets around an IPv6 address; what is resolved.
    pub host: String,
    pub port: u16,
    /// `host[:port]` as written in the endpoint: the `Host` header, or HTTP/2's `:authority`.
    pub authority: String,
    /// The path posted to (OTLP/HTTP, Zipkin), or the gRPC method's (OTLP/gRPC).
    pub path: String,
    /// How messages name the collector: `http://authority/path`.
    pub url: String,
}

/// Why an endpoint cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointError {
    /// `https://`: TLS to collectors is not built.
    Tls { signal: Signal, endpoint: String },
    /// `host:port` with no scheme, which Knative reads as `https://host:port`.
    NoScheme { signal: Signal, endpoint: String },
    /// A scheme other than `http` for Zipkin, which posts with an HTTP client.
    Scheme { endpoint: String, scheme: String },
    /// Not a URL with a host (Go's `url.Parse` refuses it, or it names no host).
    Malformed {
        signal: Signal,
        endpoint: String,
        reason: &'static str,
    },
}

impl fmt::Display for EndpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tls { signal, endpoint } => write!(
                f,
                "{} endpoint {endpoint:?}: TLS to {} is not built; use an http:// endpoint (a \
                 plaintext collector)",
                signal.setting(),
                signal.collectors()
            ),
            Self::NoScheme { signal, endpoint } => write!(
                f,
                "{} endpoint {endpoint:?} has no scheme, which Knative reads as \
                 https://{endpoint} (TLS to {} is not built); write http://{endpoint} for a \
                 plaintext collector",
                signal.setting(),
                signal.collectors()
            ),
            Self::Scheme { endpoint, scheme } => write!(
                f,
                "tracing endpoint {endpoint:?}: scheme {scheme:?} is not http"
            ),
            Self::Malformed {
                signal,
                endpoint,
                reason,
            } => {
                write!(f, "{} endpoint {endpoint:?}: {reason}", signal.setting())
            }
        }
    }
}

impl std::error::Error for EndpointError {}

impl Collector {
    /// Reads `endpoint` as the span exporter for `protocol` would (the module's doc says how).
    /// `protocol` must be one that sends to a collector.
    pub fn parse(protocol: &TraceProtocol, endpoint: &str) -> Result<Collector, EndpointError> {
        let transport = match protocol {
            TraceProtocol::Grpc => Transport::OtlpGrpc,
            TraceProtocol::Zipkin => Transport::Zipkin,
            _ => Transport::OtlpHttp,
        };
        Self::parse_as(transport, Signal::Traces, endpoint)
    }

    /// Reads `endpoint` as the metrics exporter for `protocol` would.
    pub fn parse_metrics(
        protocol: MetricsProtocol,
        endpoint: &str,
    ) -> Result<Collector, EndpointError> {
        let transport = match protocol {
            MetricsProtocol::Grpc => Transport::OtlpGrpc,
            MetricsProtocol::HttpProtobuf => Transport::OtlpHttp,
        };
        Self::parse_as(transport, Signal::Metrics, endpoint)
    }

    fn parse_as(
        transport: Transport,
        signal: Signal,
        endpoint: &str,
    ) -> Result<Collector, EndpointError> {
        let malformed = |reason| EndpointError::Malformed {
            signal,
            endpoint: endpoint.to_owned(),
            reason,
        };
        let Some((scheme, rest)) = split_scheme(endpoint) else {
            // Go's url.Parse: no scheme, and a colon in the first segment is an error;
            // without one the whole is a path, and there is no host.
            return Err(malformed(
                if endpoint.split('/').next().unwrap_or("").contains(':') {
                    "first path segment in URL cannot contain colon"
                } else {
                    "no host (write http://host:port)"
                },
            ));
        };
        let Some(rest) = rest.strip_prefix("//") else {
            return if rest.starts_with('/') {
                Err(malformed("no host (write http://host:port)"))
            } else {
                Err(EndpointError::NoScheme {
                    signal,
                    endpoint: endpoint.to_owned(),
                })
            };
        };
        if scheme.eq_ignore_ascii_case("https") {
            return Err(EndpointError::Tls {
                signal,
                endpoint: endpoint.to_owned(),
            });
        }
        if transport == Transport::Zipkin && !scheme.eq_ignore_ascii_case("http") {
            return Err(EndpointError::Scheme {
                endpoint: endpoint.to_owned(),
                scheme: scheme.to_owned(),
            });
        }
        // The authority runs to the first `/`, `?` or `#`; the path to the first `?` or `#`
        // (a query or fragment is dropped, as `WithEndpointURL` drops it).
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, after) = rest.split_at(authority_end);
        let path = &after[..after.find(['?', '#']).unwrap_or(after.len())];
        if authority.contains('@') {
            return Err(malformed(
                "user information in the endpoint is not supported",
            ));
        }
        let default_port = match transport {
            Transport::OtlpGrpc => DEFAULT_GRPC_PORT,
            _ => DEFAULT_HTTP_PORT,
        };
        let (host, port) = split_host_port(authority, default_port).map_err(malformed)?;
        // What the request line and the Host header will carry must be valid there.
        if http::uri::Authority::try_from(authority).is_err() {
            return Err(malformed("the host is not valid in a URL"));
        }
        if !path.is_empty() && http::uri::PathAndQuery::try_from(path).is_err() {
            return Err(malformed("the path is not valid in a URL"));
        }
        let path = match transport {
            Transport::OtlpGrpc => signal.grpc_path().to_owned(),
            Transport::OtlpHttp if path.trim().is_empty() => signal.default_http_path().to_owned(),
            _ if path.is_empty() => "/".to_owned(),
            _ => path.to_owned(),
        };
        Ok(Collector {
            url: format!("http://{authority}{path}"),
            host: host.to_owned(),
            port,
            authority: authority.to_owned(),
            path,
        })
    }
}

/// Go's `getScheme`: a letter, then letters, digits, `+`, `-`, `.`, up to a `:`.
fn split_scheme(endpoint: &str) -> Option<(&str, &str)> {
    let colon = endpoint.find(':')?;
    let scheme = &endpoint[..colon];
    let mut chars = scheme.chars();
    let first = chars.next()?;
    let valid = first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then(|| (scheme, &endpoint[colon + 1..]))
}

fn split_host_port(authority: &str, default_port: u16) -> Result<(&str, u16), &'static str> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or("an IPv6 address without its closing bracket")?;
        match after {
            "" => (host, None),
            _ => (
                host,
                Some(
                    after
                        .strip_prefix(':')
                        .ok_or("junk after the IPv6 address")?,
                ),
            ),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("no host (write http://host:port)");
    }
    let port = match port {
        None => default_port,
        Some(port) => match port.parse::<u16>() {
            Ok(port) if port != 0 => port,
            _ => return Err("the port is not a number from 1 to 65535"),
        },
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(protocol: TraceProtocol, endpoint: &str) -> Result<Collector, EndpointError> {
        Collector::parse(&protocol, endpoint)
    }

    #[test]
    fn otlp_http_posts_to_v1_traces_only_when_the_endpoint_has_no_path() {
        // (endpoint, host, port, path): otlptracehttp's WithEndpointURL and cleanPath.
        let table = [
            ("http://collector:4318", "collector", 4318, "/v1/traces"),
            (
                "http://collector:4318/v1/traces",
                "collector",
                4318,
                "/v1/traces",
            ),
            ("http://collector:4318/", "collector", 4318, "/"),
            (
                "http://collector:4318/otlp/traces?x=1",
                "collector",
                4318,
                "/otlp/traces",
            ),
            ("http://collector", "collector", 80, "/v1/traces"),
            ("HTTP://127.0.0.1:4318", "127.0.0.1", 4318, "/v1/traces"),
            ("http://[::1]:4318/v1/traces", "::1", 4318, "/v1/traces"),
            // any scheme but https is plaintext (Insecure = scheme != "https")
            ("otlp://collector:4318", "collector", 4318, "/v1/traces"),
        ];
        for (endpoint, host, port, path) in table {
            let collector = parse(TraceProtocol::HttpProtobuf, endpoint).unwrap();
            assert_eq!(
                (
                    collector.host.as_str(),
                    collector.port,
                    collector.path.as_str()
                ),
                (host, port, path),
                "{endpoint}"
            );
        }
    }

    #[test]
    fn grpc_uses_the_host_and_ignores_the_path() {
        let collector =
            parse(TraceProtocol::Grpc, "http://collector.observability:4317/x").unwrap();
        assert_eq!(collector.host, "collector.observability");
        assert_eq!(collector.port, 4317);
        assert_eq!(collector.authority, "collector.observability:4317");
        assert_eq!(
            collector.path,
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        );
        assert_eq!(
            parse(TraceProtocol::Grpc, "http://collector").unwrap().port,
            443
        );
    }

    #[test]
    fn zipkin_posts_to_the_url_as_written() {
        let collector = parse(
            TraceProtocol::Zipkin,
            "http://zipkin.istio-system.svc.cluster.local:9411/api/v2/spans",
        )
        .unwrap();
        assert_eq!(collector.path, "/api/v2/spans");
        assert_eq!(
            collector.url,
            "http://zipkin.istio-system.svc.cluster.local:9411/api/v2/spans"
        );
        assert!(matches!(
            parse(TraceProtocol::Zipkin, "otlp://zipkin:9411"),
            Err(EndpointError::Scheme { .. })
        ));
    }

    #[test]
    fn tls_endpoints_are_refused_including_a_bare_host_port() {
        for protocol in [
            TraceProtocol::HttpProtobuf,
            TraceProtocol::Grpc,
            TraceProtocol::Zipkin,
        ] {
            assert!(matches!(
                parse(protocol.clone(), "https://collector:4318"),
                Err(EndpointError::Tls { .. })
            ));
            // Knative: url.Parse gives an opaque URL, and endpointFor prefixes https://.
            let error = parse(protocol, "collector.observability:4317").unwrap_err();
            assert_eq!(
                error.to_string(),
                "tracing endpoint \"collector.observability:4317\" has no scheme, which Knative \
                 reads as https://collector.observability:4317 (TLS to trace collectors is not \
                 built); write http://collector.observability:4317 for a plaintext collector"
            );
        }
    }

    #[test]
    fn metrics_endpoints_follow_the_same_rules_with_their_own_defaults() {
        // (endpoint, protocol, path): otlpmetrichttp's DefaultMetricsPath, otlpmetricgrpc's
        // method; a path written is kept (HTTP) or ignored (gRPC), as for spans.
        let table = [
            (
                "http://collector:4318",
                MetricsProtocol::HttpProtobuf,
                "/v1/metrics",
            ),
            (
                "http://collector:4318/otlp/v1/metrics",
                MetricsProtocol::HttpProtobuf,
                "/otlp/v1/metrics",
            ),
            (
                "http://collector:4317/v1/metrics",
                MetricsProtocol::Grpc,
                "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            ),
        ];
        for (endpoint, protocol, path) in table {
            let collector = Collector::parse_metrics(protocol, endpoint).unwrap();
            assert_eq!(collector.path, path, "{endpoint}");
        }
        assert_eq!(
            Collector::parse_metrics(MetricsProtocol::Grpc, "http://collector")
                .unwrap()
                .port,
            443
        );
        let error =
            Collector::parse_metrics(MetricsProtocol::HttpProtobuf, "otel:4318").unwrap_err();
        assert_eq!(
            error.to_string(),
            "metrics endpoint \"otel:4318\" has no scheme, which Knative reads as \
             https://otel:4318 (TLS to metrics collectors is not built); write http://otel:4318 \
             for a plaintext collector"
        );
        let error = Collector::parse_metrics(MetricsProtocol::Grpc, "http://").unwrap_err();
        assert_eq!(
            error.to_string(),
            "metrics endpoint \"http://\": no host (write http://host:port)"
        );
    }

    #[test]
    fn endpoints_without_a_host_are_refused() {
        let refused = [
            "10.0.0.1:4317",
            "collector",
            "http://",
            "http:///v1/traces",
            "http://collector:0",
            "http://collector:99999",
            "http://collector:port",
            "http://user@collector:4318",
            "http://[::1",
            "file:/v1/traces",
            "http://collector:4318/v1/tra ces",
        ];
        for endpoint in refused {
            assert!(
                matches!(
                    parse(TraceProtocol::HttpProtobuf, endpoint),
                    Err(EndpointError::Malformed { .. })
                ),
                "{endpoint}"
            );
        }
    }
}
