//! Tracing from the cluster: config-observability (Knative 1.19+) and config-tracing (1.18) in
//! `SYSTEM_NAMESPACE`, each read as upstream reads it, and which of the two decides on a
//! cluster that has both. Pure: a map's data in, a [`TracingConfig`] out; the informers
//! (`informers.rs`) watch the two maps and send what [`ClusterTracing::effective`] says.
//!
//! Upstream (paths in knative/serving; `vendor/` is knative.dev/pkg as vendored on the branch):
//! * 1.18's activator builds its tracer from config-tracing alone and applies every change
//!   (release-1.18 `cmd/activator/main.go:182-196`, `pkg/activator/config/store.go:66-73`,
//!   `vendor/knative.dev/pkg/tracing/config/tracing.go:75-122`). A map that does not parse
//!   keeps the last good one, logged (`vendor/knative.dev/pkg/configmap/store.go:131-153`;
//!   fatal only when the first one is bad).
//! * 1.19–1.23's activator reads config-observability once, at start-up, and exits on a bad one
//!   (release-1.23 `cmd/activator/main.go:137`, `pkg/observability/otel/otel.go:54-56,122-137`;
//!   the tracing keys: `vendor/knative.dev/pkg/observability/tracing/config.go:39-84`); its
//!   watch on the map updates the request log and profiling only (`main.go:281-283`). It never
//!   reads config-tracing (`pkg/activator/config/store.go:66-71` on release-1.19+), which 1.19+
//!   still ships, empty but for an `_example` saying it is deprecated
//!   (`config/core/configmaps/tracing.yaml`).
//!
//! Here both maps are watched and a change applies at once (★ 1.19+ needs a restart), and a
//! value upstream would refuse keeps the tracing in force, logged naming the map and the key
//! (★ 1.19+ exits at start-up; 1.18 does the same, but exits on a bad first map).
//!
//! **Which decides.** config-observability, once it has any `tracing-*` key; until then
//! config-tracing; with neither, tracing is off. 1.18's config-observability has no `tracing-*`
//! key (tracing is config-tracing's there), so a 1.18 cluster is read as its activator reads
//! it; a 1.19+ cluster's config-tracing is the shipped empty map (off, as its activator) until
//! the operator sets `tracing-protocol` in config-observability, which then decides alone. ★
//! One cluster is read otherwise than its activator reads it: 1.19+ upgraded in place from 1.18,
//! config-tracing still saying `backend: zipkin` and config-observability naming no `tracing-*`
//! key. 1.19's activator traces nothing there; this one keeps exporting to that Zipkin until
//! config-observability says otherwise (`tracing-protocol: none` turns it off).
//!
//! A map that does not exist, or was deleted, says nothing (its defaults, as upstream's
//! constructors given no data). Only the tracing keys are read: a problem in another key of
//! config-observability (which upstream's start-up would also exit on) is other readers' to
//! report.

use std::collections::BTreeMap;
use std::fmt;

use crate::config::trace::{self, TracingConfig};
use crate::queue_proxy::env::go_bool;

/// The 1.19+ map's name unless `CONFIG_OBSERVABILITY_NAME` says otherwise (upstream reads the
/// same variable, `vendor/knative.dev/pkg/observability/configmap/parse.go:27-35`; Knative's
/// activator Deployment sets it to this).
pub const OBSERVABILITY_CONFIG_MAP: &str = "config-observability";
/// The variable that renames it.
pub const OBSERVABILITY_CONFIG_MAP_ENV: &str = "CONFIG_OBSERVABILITY_NAME";
/// 1.18's map (`tracing/config/tracing.go:32`, a constant).
pub const TRACING_CONFIG_MAP: &str = "config-tracing";

/// config-observability's tracing keys (`observability/tracing/config.go:74-78`).
pub const TRACING_PROTOCOL: &str = "tracing-protocol";
pub const TRACING_ENDPOINT: &str = "tracing-endpoint";
pub const TRACING_SAMPLING_RATE: &str = "tracing-sampling-rate";
/// config-tracing's keys (`tracing/config/tracing.go:34-38`); `enable` is the boolean
/// `backend` replaced, read only without `backend`.
pub const BACKEND: &str = "backend";
pub const ZIPKIN_ENDPOINT: &str = "zipkin-endpoint";
pub const DEBUG: &str = "debug";
pub const SAMPLE_RATE: &str = "sample-rate";
pub const ENABLE: &str = "enable";

/// config-tracing's `sample-rate` when the map does not set it (`NoopConfig`,
/// `tracing/config/tracing.go:66-73`); config-observability's is 0 (`DefaultConfig`,
/// `observability/tracing/config.go:61-65`).
pub const CONFIG_TRACING_DEFAULT_SAMPLE_RATE: f64 = 0.1;

/// Longest part of a value quoted in a log line: a ConfigMap value may be megabytes.
const QUOTED_MAX_CHARS: usize = 64;

/// A value upstream would refuse: the map, the key, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub config_map: String,
    pub key: &'static str,
    pub problem: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.config_map, self.key, self.problem)
    }
}

/// Which map the tracing in force comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decider {
    ConfigObservability,
    ConfigTracing,
    /// Neither says anything: off.
    Neither,
}

/// `value` as a log line quotes it, cut to [`QUOTED_MAX_CHARS`] characters.
fn quoted(value: &str) -> String {
    match value.char_indices().nth(QUOTED_MAX_CHARS) {
        Some((cut, _)) => format!("{:?}… ({} bytes)", &value[..cut], value.len()),
        None => format!("{value:?}"),
    }
}

/// config-observability's tracing (Knative 1.19+), as `tracing.NewFromMap` and `Validate` read
/// it: `Ok(None)` when the map has no `tracing-*` key (it does not decide, above). Strings are
/// trimmed (`configmap/parser/parse.go:74-75`), the rate is not; a protocol other than
/// upstream's four, a rate that is not a number from 0 to 1, an endpoint missing for `grpc` and
/// `http/protobuf` or present for `none` and `stdout` are refused, as upstream refuses them; ★
/// so are a NaN rate and an endpoint the exporters cannot use ([`TracingConfig::validate`]:
/// `https://`, or a bare `host:port`, which upstream reads as `https://`, since TLS to
/// collectors is not built).
pub fn from_config_observability(
    config_map: &str,
    data: &BTreeMap<String, String>,
) -> Result<Option<TracingConfig>, Refused> {
    let keys = [TRACING_PROTOCOL, TRACING_ENDPOINT, TRACING_SAMPLING_RATE];
    if !keys.iter().any(|key| data.contains_key(*key)) {
        return Ok(None);
    }
    let refused = |key, problem| Refused {
        config_map: config_map.to_string(),
        key,
        problem,
    };
    let protocol_text = data
        .get(TRACING_PROTOCOL)
        .map_or(trace::NONE, |text| text.trim());
    let endpoint = data.get(TRACING_ENDPOINT).map_or("", |text| text.trim());
    let rate = match data.get(TRACING_SAMPLING_RATE) {
        None => 0.0,
        Some(text) => trace::go_float(text).ok_or_else(|| {
            refused(
                TRACING_SAMPLING_RATE,
                format!("{} is not a number", quoted(text)),
            )
        })?,
    };
    let protocol = trace::opentelemetry_protocol(protocol_text).ok_or_else(|| {
        refused(
            TRACING_PROTOCOL,
            format!(
                "{} is not one of {}",
                quoted(protocol_text),
                trace::OPENTELEMETRY_PROTOCOLS.join(", ")
            ),
        )
    })?;
    // Upstream's `Validate` order: the endpoint for the protocol, then the rate.
    if !protocol.needs_endpoint() && !endpoint.is_empty() {
        return Err(refused(
            TRACING_ENDPOINT,
            format!(
                "{} is set, but protocol {protocol_text:?} sends nowhere (upstream refuses it \
                 too)",
                quoted(endpoint)
            ),
        ));
    }
    let config = trace::opentelemetry(protocol, endpoint, rate);
    config
        .validate()
        .map_err(|error| refused(TRACING_ENDPOINT, error.to_string()))?;
    if !trace::rate_in_range(rate) {
        return Err(refused(
            TRACING_SAMPLING_RATE,
            format!("{rate} is not from 0 to 1"),
        ));
    }
    Ok(Some(config))
}

/// config-tracing (Knative 1.18), as `NewTracingConfigFromMap` reads it: `backend` exactly
/// `zipkin` or `none` (default `none`; without it, the legacy boolean `enable` true means
/// `zipkin`), `zipkin-endpoint` as written, `debug` Go's boolean, `sample-rate` Go's float
/// (default [`CONFIG_TRACING_DEFAULT_SAMPLE_RATE`]); refused as upstream refuses: an unknown
/// backend, a value that does not parse, `zipkin` without an endpoint, a rate outside 0 to 1;
/// ★ and a NaN rate, or a Zipkin endpoint the exporter cannot use ([`TracingConfig::validate`]:
/// an `http://` URL; upstream takes any text and its reporter fails every export to a bad
/// one). Nothing but `zipkin` exports ([`trace::opencensus`]).
pub fn from_config_tracing(data: &BTreeMap<String, String>) -> Result<TracingConfig, Refused> {
    let refused = |key, problem| Refused {
        config_map: TRACING_CONFIG_MAP.to_string(),
        key,
        problem,
    };
    let zipkin = match (data.get(BACKEND), data.get(ENABLE)) {
        (Some(backend), _) => match backend.as_str() {
            trace::ZIPKIN => true,
            trace::NONE => false,
            other => {
                return Err(refused(
                    BACKEND,
                    format!("{} is neither \"zipkin\" nor \"none\"", quoted(other)),
                ))
            }
        },
        (None, Some(enable)) => go_bool(enable)
            .ok_or_else(|| refused(ENABLE, format!("{} is not a boolean", quoted(enable))))?,
        (None, None) => false,
    };
    let endpoint = data.get(ZIPKIN_ENDPOINT).map_or("", String::as_str);
    let debug = match data.get(DEBUG) {
        None => false,
        Some(text) => go_bool(text)
            .ok_or_else(|| refused(DEBUG, format!("{} is not a boolean", quoted(text))))?,
    };
    let rate = match data.get(SAMPLE_RATE) {
        None => CONFIG_TRACING_DEFAULT_SAMPLE_RATE,
        Some(text) => trace::go_float(text)
            .ok_or_else(|| refused(SAMPLE_RATE, format!("{} is not a number", quoted(text))))?,
    };
    if zipkin && endpoint.is_empty() {
        return Err(refused(
            ZIPKIN_ENDPOINT,
            "empty, but backend is zipkin (upstream refuses it too)".into(),
        ));
    }
    if !trace::rate_in_range(rate) {
        return Err(refused(SAMPLE_RATE, format!("{rate} is not from 0 to 1")));
    }
    let config = trace::opencensus(zipkin, endpoint, debug, rate);
    config
        .validate()
        .map_err(|error| refused(ZIPKIN_ENDPOINT, error.to_string()))?;
    Ok(config)
}

/// What the two maps said last, each as last accepted.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterTracing {
    /// config-observability's name (`CONFIG_OBSERVABILITY_NAME`, else
    /// [`OBSERVABILITY_CONFIG_MAP`]).
    observability_map: String,
    /// Its tracing; `None`: absent, or no `tracing-*` key.
    observability: Option<TracingConfig>,
    /// config-tracing's; `None`: absent.
    tracing: Option<TracingConfig>,
}

impl ClusterTracing {
    /// Neither map seen yet: off.
    pub fn new(observability_map: &str) -> ClusterTracing {
        ClusterTracing {
            observability_map: observability_map.to_string(),
            observability: None,
            tracing: None,
        }
    }

    /// The tracing in force, and which map it comes from (module docs).
    pub fn effective(&self) -> (TracingConfig, Decider) {
        match (&self.observability, &self.tracing) {
            (Some(config), _) => (config.clone(), Decider::ConfigObservability),
            (None, Some(config)) => (config.clone(), Decider::ConfigTracing),
            (None, None) => (TracingConfig::OFF, Decider::Neither),
        }
    }

    /// config-observability as listed or changed (`None`: absent or deleted). Refused: the map's
    /// previous reading stays, and so does the tracing in force.
    pub fn observability_seen(
        &mut self,
        data: Option<&BTreeMap<String, String>>,
    ) -> Result<(), Refused> {
        self.observability = match data {
            None => None,
            Some(data) => from_config_observability(&self.observability_map, data)?,
        };
        Ok(())
    }

    /// config-tracing as listed or changed (`None`: absent or deleted). Refused: as
    /// [`ClusterTracing::observability_seen`].
    pub fn tracing_seen(&mut self, data: Option<&BTreeMap<String, String>>) -> Result<(), Refused> {
        self.tracing = match data {
            None => None,
            Some(data) => Some(from_config_tracing(data)?),
        };
        Ok(())
    }

    /// config-observability's name, as the log should say it.
    pub fn observability_map(&self) -> &str {
        &self.observability_map
    }
}

impl Decider {
    /// For the log: where the tracing in force comes from, the maps named with their
    /// `namespace`.
    pub fn describe(self, tracing: &ClusterTracing, namespace: &str) -> String {
        let observability = &tracing.observability_map;
        match self {
            Decider::ConfigObservability => {
                format!("{namespace}/{observability}'s tracing-* keys")
            }
            Decider::ConfigTracing => {
                format!("{namespace}/{TRACING_CONFIG_MAP} ({observability} names no tracing-* key)")
            }
            Decider::Neither => format!(
                "no tracing-* key in {namespace}/{observability} and no \
                 {namespace}/{TRACING_CONFIG_MAP}"
            ),
        }
    }
}

#[cfg(test)]
mod tests;
