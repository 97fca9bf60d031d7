//! Tracing settings as every place Knative keeps them means them, turned into the one
//! [`TracingConfig`] the exporters take (`kactivator_telemetry`). The readers are elsewhere —
//! the file's `[tracing]` ([`TracingSettings`](super::TracingSettings)), config-observability
//! and config-tracing in the activator's cluster (`sources::kubernetes::trace_config`),
//! `OBSERVABILITY_CONFIG` and `TRACING_CONFIG_*` in the queue-proxy's environment
//! (`queue_proxy::observability`, `queue_proxy::env`); what the values mean is here, once, and
//! what an endpoint means is the exporters' ([`TracingConfig::validate`],
//! `kactivator_telemetry::endpoint`): an endpoint is kept as written.
//!
//! Two generations of upstream give the same three settings two meanings (paths in
//! knative/serving; `vendor/` is knative.dev/pkg as vendored on that branch):
//! * **OpenTelemetry**, Knative 1.19–1.23 (release-1.23
//!   `vendor/knative.dev/pkg/observability/tracing/`, the same text on every branch from 1.19):
//!   the protocols `none`, `grpc`, `http/protobuf`, `stdout` (`config.go:26-31`). The sampler
//!   (`provider.go:167-198`): `stdout` samples every trace whatever the rate; otherwise a rate
//!   of 1 or more samples every trace, 0 or less none, and one between is parent-based with that
//!   ratio for new traces. `none` builds no exporter at all (`provider.go:59-64`).
//! * **OpenCensus**, Knative 1.18 (release-1.18 `vendor/knative.dev/pkg/tracing/`): the
//!   backends `none` and `zipkin` (`config/tracing.go:41-50`); spans are exported only for
//!   `zipkin`, to `zipkin-endpoint` as Zipkin's v2 JSON (`opencensus.go:153-186`); `debug`
//!   samples every trace, otherwise `sample-rate` is the ratio (`opencensus.go:124-138`).
//!   OpenCensus' probability sampler takes a ratio that is not ≥ 0 (NaN included) as 0 and one
//!   ≥ 1 as always.
//!
//! Which values a reader refuses is the reader's rule (config-observability's validation
//! refuses a rate above 1; the queue-proxy, whose upstream never validates, clamps it as the
//! sampler does); these functions take values already judged.

pub use kactivator_telemetry::{TraceProtocol, TracingConfig, TracingConfigError};

/// Upstream's OpenTelemetry protocol names (`config.go:26-31`) and 1.18's Zipkin backend
/// (`config/tracing.go:48-49`), as the file, config-observability and `OBSERVABILITY_CONFIG`
/// spell them.
pub const NONE: &str = "none";
pub const GRPC: &str = "grpc";
pub const HTTP_PROTOBUF: &str = "http/protobuf";
pub const STDOUT: &str = "stdout";
pub const ZIPKIN: &str = "zipkin";

/// The protocols Knative 1.19+ knows, in its order.
pub const OPENTELEMETRY_PROTOCOLS: [&str; 4] = [NONE, GRPC, HTTP_PROTOBUF, STDOUT];

/// Knative 1.19+'s protocol by name: exactly one of [`OPENTELEMETRY_PROTOCOLS`] (upstream
/// compares the words as written: `NONE` and `Grpc` are refused).
pub fn opentelemetry_protocol(name: &str) -> Option<TraceProtocol> {
    match name {
        NONE => Some(TraceProtocol::None),
        GRPC => Some(TraceProtocol::Grpc),
        HTTP_PROTOBUF => Some(TraceProtocol::HttpProtobuf),
        STDOUT => Some(TraceProtocol::Stdout),
        _ => None,
    }
}

/// The file's protocol by name: Knative 1.19+'s, and `zipkin`.
pub fn file_protocol(name: &str) -> Option<TraceProtocol> {
    match name {
        ZIPKIN => Some(TraceProtocol::Zipkin),
        _ => opentelemetry_protocol(name),
    }
}

/// A sampling rate as upstream's samplers take it: at least 1 samples every trace, anything
/// not above 0 (NaN included) none (`provider.go:188-194`; OpenCensus' `ProbabilitySampler`).
pub fn clamped_rate(rate: f64) -> f64 {
    if rate >= 1.0 {
        1.0
    } else if rate > 0.0 {
        rate
    } else {
        0.0
    }
}

/// Whether a reader that validates (config-observability, config-tracing, the file) takes
/// `rate`: a number from 0 to 1. ★ NaN is refused: upstream's range checks (`rate < 0 ||
/// rate > 1`) let it through.
pub fn rate_in_range(rate: f64) -> bool {
    (0.0..=1.0).contains(&rate)
}

/// Go's `strconv.ParseFloat(text, 64)` for the values a ConfigMap or the environment holds:
/// decimal with an optional sign and exponent, `inf`, `infinity` and `nan` in any case, no
/// space. ★ Go also reads hexadecimal floats (`0x1p-2`) and underscores after a base prefix;
/// a rate written so is refused here. A value beyond `f64`'s range is an error, as Go's range
/// error.
pub fn go_float(text: &str) -> Option<f64> {
    let value: f64 = text.parse().ok()?;
    let spelled_infinite = text
        .trim_start_matches(['+', '-'])
        .to_ascii_lowercase()
        .starts_with("inf");
    (value.is_finite() || value.is_nan() || spelled_infinite).then_some(value)
}

/// What an OpenTelemetry setting (Knative 1.19+, or the file) means once read, `rate` judged by
/// the reader: `none` is [`TracingConfig::OFF`] whatever else is set; `stdout` samples every
/// trace (`provider.go:173-175`) and sends to no endpoint; the others send to `endpoint` with
/// the rate clamped as the sampler clamps it. Whether the endpoint can be used is
/// [`TracingConfig::validate`]'s to say.
pub fn opentelemetry(protocol: TraceProtocol, endpoint: &str, rate: f64) -> TracingConfig {
    match protocol {
        TraceProtocol::None => TracingConfig::OFF,
        TraceProtocol::Stdout => TracingConfig {
            protocol,
            endpoint: String::new(),
            sampling_rate: 1.0,
        },
        _ => TracingConfig {
            protocol,
            endpoint: endpoint.to_string(),
            sampling_rate: clamped_rate(rate),
        },
    }
}

/// What an OpenCensus setting (Knative 1.18's config-tracing, `TRACING_CONFIG_*`) means once
/// read: not `zipkin` is [`TracingConfig::OFF`] (upstream registers an exporter for `zipkin`
/// only, `opencensus.go:160-186`); `zipkin` sends to `endpoint`, every trace sampled under
/// `debug`, else `rate` clamped as OpenCensus' sampler clamps it.
pub fn opencensus(zipkin: bool, endpoint: &str, debug: bool, rate: f64) -> TracingConfig {
    if !zipkin {
        return TracingConfig::OFF;
    }
    TracingConfig {
        protocol: TraceProtocol::Zipkin,
        endpoint: endpoint.to_string(),
        sampling_rate: if debug { 1.0 } else { clamped_rate(rate) },
    }
}

/// One line for the log: `grpc to http://collector:4317, sampling 0.5`, or `off`.
pub fn describe(config: &TracingConfig) -> String {
    match config.protocol {
        TraceProtocol::None => "off".into(),
        TraceProtocol::Stdout => "stdout, every trace sampled".into(),
        _ => format!(
            "{} to {}, sampling {}",
            config.protocol.label(),
            config.endpoint,
            config.sampling_rate
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_are_upstreams_words_exactly() {
        for name in OPENTELEMETRY_PROTOCOLS {
            let protocol = opentelemetry_protocol(name).expect(name);
            assert_eq!(protocol.label(), name);
            assert_eq!(file_protocol(name), Some(protocol));
        }
        assert_eq!(file_protocol("zipkin"), Some(TraceProtocol::Zipkin));
        for refused in ["zipkin", "NONE", "Grpc", "otlp", "http", " grpc", ""] {
            assert_eq!(opentelemetry_protocol(refused), None, "{refused:?}");
        }
        assert_eq!(file_protocol("Zipkin"), None);
    }

    #[test]
    fn a_rate_is_clamped_as_upstreams_samplers_clamp_it() {
        for (rate, clamped) in [
            (0.5, 0.5),
            (1.0, 1.0),
            (2.0, 1.0),
            (f64::INFINITY, 1.0),
            (0.0, 0.0),
            (-0.5, 0.0),
            (f64::NEG_INFINITY, 0.0),
            (f64::NAN, 0.0),
        ] {
            assert_eq!(clamped_rate(rate), clamped, "{rate}");
        }
        assert!(rate_in_range(0.0) && rate_in_range(1.0) && rate_in_range(0.25));
        for refused in [-0.0001, 1.0001, f64::NAN, f64::INFINITY] {
            assert!(!rate_in_range(refused), "{refused}");
        }
    }

    #[test]
    fn floats_read_as_gos_parse_float_reads_them() {
        for (text, value) in [
            ("0.1", 0.1),
            ("1", 1.0),
            ("1e-05", 1e-5),
            (".5", 0.5),
            ("5.", 5.0),
            ("+0.25", 0.25),
            ("-1", -1.0),
            ("1E2", 100.0),
        ] {
            assert_eq!(go_float(text), Some(value), "{text}");
        }
        assert!(go_float("NaN").is_some_and(f64::is_nan));
        assert_eq!(go_float("inf"), Some(f64::INFINITY));
        assert_eq!(go_float("-Infinity"), Some(f64::NEG_INFINITY));
        // Go: "1e400" is a range error; the others do not parse.
        for refused in ["1e400", " 1", "1 ", "1_0", "0.5x", "", "half", "0x1p-2"] {
            assert_eq!(go_float(refused), None, "{refused:?}");
        }
    }

    #[test]
    fn opentelemetry_settings_mean_what_upstreams_provider_does_with_them() {
        let otlp = "http://otel:4318/v1/traces";
        assert_eq!(
            opentelemetry(TraceProtocol::None, otlp, 0.5),
            TracingConfig::OFF,
            "none: off, whatever else is set"
        );
        assert_eq!(
            opentelemetry(TraceProtocol::Stdout, "ignored", 0.1),
            TracingConfig {
                protocol: TraceProtocol::Stdout,
                endpoint: String::new(),
                sampling_rate: 1.0,
            },
            "stdout samples every trace (provider.go:173-175)"
        );
        assert_eq!(
            opentelemetry(TraceProtocol::HttpProtobuf, otlp, 0.25),
            TracingConfig {
                protocol: TraceProtocol::HttpProtobuf,
                endpoint: otlp.into(),
                sampling_rate: 0.25,
            }
        );
        let kept_as_written = opentelemetry(TraceProtocol::Grpc, "otel:4317", 3.0);
        assert_eq!(kept_as_written.endpoint, "otel:4317");
        assert_eq!(kept_as_written.sampling_rate, 1.0);
    }

    #[test]
    fn opencensus_settings_export_only_to_zipkin_and_debug_samples_everything() {
        let url = "http://zipkin:9411/api/v2/spans";
        assert_eq!(opencensus(false, url, true, 1.0), TracingConfig::OFF);
        let zipkin = |debug, rate| opencensus(true, url, debug, rate);
        assert_eq!(
            zipkin(false, 0.1),
            TracingConfig {
                protocol: TraceProtocol::Zipkin,
                endpoint: url.into(),
                sampling_rate: 0.1,
            }
        );
        assert_eq!(zipkin(true, 0.1).sampling_rate, 1.0, "debug: every trace");
        assert_eq!(zipkin(false, 3.0).sampling_rate, 1.0);
        assert_eq!(zipkin(false, f64::NAN).sampling_rate, 0.0);
    }

    #[test]
    fn the_log_line_says_where_and_how_much() {
        assert_eq!(describe(&TracingConfig::OFF), "off");
        let config = opentelemetry(TraceProtocol::Grpc, "http://otel:4317", 0.5);
        assert_eq!(describe(&config), "grpc to http://otel:4317, sampling 0.5");
    }
}
