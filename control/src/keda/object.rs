//! An HTTPScaledObject (`http.keda.sh/v1alpha1`) as KEDA's HTTP add-on reads it
//! (`operator/apis/http/v1alpha1/httpscaledobject_types.go` and its conversion to a route,
//! `pkg/routing/table.go:71-162`, at v0.15.0), in kactivator's terms: the route's rule, the
//! Service it goes to, the failover, what it scales on, its timeouts, and ours, the per-pod
//! concurrency limit its annotation sets. Pure: the object's JSON in, a route or an error that
//! names the field out.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kactivator_shards::routing::rules::{HeaderMatch, RouteOrder, Rule};
use kactivator_shards::routing::MAX_TIMEOUT_SECONDS;
use serde::Deserialize;

use super::scaler::Scaling;
use crate::features::parse_duration;

#[cfg(test)]
mod tests;

/// The annotation that gives an HTTPScaledObject a per-pod concurrency limit (★; the add-on
/// has none, #1038). Absent: unlimited, as the add-on.
pub const CONTAINER_CONCURRENCY_ANNOTATION: &str = "kactivator.dev/container-concurrency";
/// A failover's wait when its `timeoutSeconds` is unset (the CRD's default).
pub const DEFAULT_FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// A rate's window and granularity when unset (the CRD's defaults).
pub const DEFAULT_RATE_WINDOW: Duration = Duration::from_secs(60);
pub const DEFAULT_RATE_GRANULARITY: Duration = Duration::from_secs(1);

/// A Service's port, by number or by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortRef {
    Number(u16),
    Name(String),
}

/// A Service in the object's namespace, and its port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRef {
    pub service: String,
    pub port: PortRef,
}

/// Where a request goes when the target has no ready endpoint in time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failover {
    pub to: ServiceRef,
}

/// A rate metric's window and granularity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateWindow {
    pub window: Duration,
    pub granularity: Duration,
}

/// One HTTPScaledObject, read.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpScaledObject {
    pub namespace: String,
    pub name: String,
    /// What orders it among routes of the same host, prefix and headers.
    pub order: RouteOrder,
    /// `hosts`, `pathPrefixes` and `headers` as one rule.
    pub rule: Rule,
    /// `scaleTargetRef`'s Service and port (the Deployment itself is KEDA's to scale).
    pub target: ServiceRef,
    pub failover: Option<Failover>,
    pub scaling: Scaling,
    /// With a rate metric: its window.
    pub rate: Option<RateWindow>,
    /// How long a request waits for a ready endpoint: the failover's `timeoutSeconds`, else
    /// `timeouts.conditionWait` when above zero; `None`: the process default.
    pub readiness_timeout: Option<Duration>,
    /// `timeouts.responseHeader` when above zero; `None`: the process default.
    pub response_header_timeout: Option<Duration>,
    /// [`CONTAINER_CONCURRENCY_ANNOTATION`]; `None`: unlimited.
    pub container_concurrency: Option<u32>,
}

/// Why an object cannot be a route: the field, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectError {
    pub field: String,
    pub problem: String,
}

impl fmt::Display for ObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

impl std::error::Error for ObjectError {}

fn error(field: impl Into<String>, problem: impl Into<String>) -> ObjectError {
    ObjectError {
        field: field.into(),
        problem: problem.into(),
    }
}

// === the wire form: what the CRD allows, unknown fields ignored as Go's decoding does ===

#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: ObjectMeta,
    spec: Option<SpecWire>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct SpecWire {
    hosts: Option<Vec<String>>,
    path_prefixes: Option<Vec<String>>,
    headers: Option<Vec<HeaderWire>>,
    scale_target_ref: Option<TargetWire>,
    cold_start_timeout_failover_ref: Option<FailoverWire>,
    target_pending_requests: Option<i32>,
    scaling_metric: Option<ScalingMetricWire>,
    timeouts: Option<TimeoutsWire>,
}

#[derive(Deserialize)]
struct HeaderWire {
    name: String,
    value: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct TargetWire {
    service: String,
    port: Option<i32>,
    port_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct FailoverWire {
    service: String,
    port: Option<i32>,
    port_name: Option<String>,
    timeout_seconds: Option<i32>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct ScalingMetricWire {
    concurrency: Option<ConcurrencyWire>,
    request_rate: Option<RateWire>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct ConcurrencyWire {
    target_value: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RateWire {
    target_value: Option<i64>,
    window: Option<String>,
    granularity: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct TimeoutsWire {
    condition_wait: Option<String>,
    response_header: Option<String>,
}

/// The CRD's default target of a metric that sets none.
const DEFAULT_TARGET_VALUE: i64 = 100;

impl HttpScaledObject {
    /// Reads one object as the API server serves it.
    pub fn from_json(object: &serde_json::Value) -> Result<HttpScaledObject, ObjectError> {
        let wire = Wire::deserialize(object)
            .map_err(|problem| error("object", format!("not an HTTPScaledObject: {problem}")))?;
        let metadata = wire.metadata;
        let namespace = metadata
            .namespace
            .filter(|namespace| !namespace.is_empty())
            .ok_or_else(|| error("metadata.namespace", "missing"))?;
        let name = metadata
            .name
            .filter(|name| !name.is_empty())
            .ok_or_else(|| error("metadata.name", "missing"))?;
        let spec = wire.spec.ok_or_else(|| error("spec", "missing"))?;
        let target = spec
            .scale_target_ref
            .ok_or_else(|| error("spec.scaleTargetRef", "missing"))?;
        let target = service_ref(
            "spec.scaleTargetRef",
            target.service,
            target.port,
            target.port_name,
        )?;

        let rule = Rule {
            hosts: spec.hosts.unwrap_or_default(),
            paths: spec.path_prefixes.unwrap_or_default(),
            headers: spec
                .headers
                .unwrap_or_default()
                .into_iter()
                .enumerate()
                .map(|(index, header)| {
                    if header.name.is_empty() {
                        return Err(error(format!("spec.headers[{index}].name"), "empty"));
                    }
                    Ok(HeaderMatch {
                        name: header.name.into(),
                        value: header.value.map(Into::into),
                    })
                })
                .collect::<Result<_, _>>()?,
        };

        let mut scaling = Scaling {
            target_pending_requests: spec.target_pending_requests.map(i64::from),
            ..Scaling::default()
        };
        let mut rate = None;
        if let Some(metric) = spec.scaling_metric {
            if metric.concurrency.is_some() && metric.request_rate.is_some() {
                return Err(error(
                    "spec.scalingMetric",
                    "concurrency and requestRate are mutually exclusive (the add-on's operator \
                     refuses the object too)",
                ));
            }
            if let Some(concurrency) = metric.concurrency {
                scaling.concurrency =
                    Some(concurrency.target_value.unwrap_or(DEFAULT_TARGET_VALUE));
            }
            if let Some(request_rate) = metric.request_rate {
                scaling.rate = Some(request_rate.target_value.unwrap_or(DEFAULT_TARGET_VALUE));
                let window = duration(
                    "spec.scalingMetric.requestRate.window",
                    request_rate.window.as_deref(),
                )?
                .unwrap_or(DEFAULT_RATE_WINDOW);
                let granularity = duration(
                    "spec.scalingMetric.requestRate.granularity",
                    request_rate.granularity.as_deref(),
                )?
                .unwrap_or(DEFAULT_RATE_GRANULARITY);
                super::rate::RequestBuckets::new(window, granularity).map_err(|problem| {
                    error(
                        "spec.scalingMetric.requestRate",
                        format!("no buckets for that window and granularity: {problem:?}"),
                    )
                })?;
                rate = Some(RateWindow {
                    window,
                    granularity,
                });
            }
        }

        let timeouts = spec.timeouts.unwrap_or_default();
        let positive = |duration: Option<Duration>| duration.filter(|d| !d.is_zero());
        let mut readiness_timeout = positive(duration(
            "spec.timeouts.conditionWait",
            timeouts.condition_wait.as_deref(),
        )?);
        let response_header_timeout = positive(duration(
            "spec.timeouts.responseHeader",
            timeouts.response_header.as_deref(),
        )?);
        let failover = match spec.cold_start_timeout_failover_ref {
            None => None,
            Some(failover) => {
                let field = "spec.coldStartTimeoutFailoverRef";
                let to = service_ref(field, failover.service, failover.port, failover.port_name)?;
                match failover.timeout_seconds {
                    Some(seconds) if seconds < 0 => {
                        return Err(error(
                            format!("{field}.timeoutSeconds"),
                            format!("{seconds} is negative"),
                        ))
                    }
                    Some(0) => {}
                    // The failover's wait is the readiness timeout, over conditionWait.
                    Some(seconds) => {
                        readiness_timeout = Some(within_a_year(
                            &format!("{field}.timeoutSeconds"),
                            Duration::from_secs(seconds as u64),
                        )?);
                    }
                    None => readiness_timeout = Some(DEFAULT_FAILOVER_TIMEOUT),
                }
                Some(Failover { to })
            }
        };

        let container_concurrency =
            container_concurrency(metadata.annotations.as_ref().unwrap_or(&BTreeMap::new()))?;
        let created = metadata
            .creation_timestamp
            .map_or(0, |time| time.0.as_second());
        Ok(HttpScaledObject {
            order: RouteOrder {
                created,
                namespace: namespace.clone(),
                name: name.clone(),
            },
            namespace,
            name,
            rule,
            target,
            failover,
            scaling,
            rate,
            readiness_timeout,
            response_header_timeout,
            container_concurrency,
        })
    }
}

/// A Service and exactly one of its port's number and name (the CRD's rule).
fn service_ref(
    field: &str,
    service: String,
    port: Option<i32>,
    port_name: Option<String>,
) -> Result<ServiceRef, ObjectError> {
    if service.is_empty() {
        return Err(error(format!("{field}.service"), "missing"));
    }
    let port = match (port, port_name.filter(|name| !name.is_empty())) {
        (Some(_), Some(_)) => {
            return Err(error(
                field,
                "must define either the 'portName' or the 'port', not both",
            ))
        }
        (None, None) => {
            return Err(error(
                field,
                "must define either the 'portName' or the 'port'",
            ))
        }
        (Some(number), None) => match u16::try_from(number) {
            Ok(number) if number > 0 => PortRef::Number(number),
            _ => {
                return Err(error(
                    format!("{field}.port"),
                    format!("{number} is not a port"),
                ))
            }
        },
        (None, Some(name)) => PortRef::Name(name),
    };
    Ok(ServiceRef { service, port })
}

/// A `metav1.Duration` (Go's duration text); `None` when absent.
/// A timeout field: a Go duration of at most [`MAX_TIMEOUT_SECONDS`] (one year), refused above
/// it as the Knative source refuses a Revision's, so that no deadline overflows the clock.
fn duration(field: &str, text: Option<&str>) -> Result<Option<Duration>, ObjectError> {
    match text {
        None => Ok(None),
        Some(text) => {
            let duration = parse_duration(text)
                .ok_or_else(|| error(field, format!("{text:?} is not a duration")))?;
            within_a_year(field, duration).map(Some)
        }
    }
}

fn within_a_year(field: &str, duration: Duration) -> Result<Duration, ObjectError> {
    if duration.as_secs() > MAX_TIMEOUT_SECONDS {
        return Err(error(
            field,
            format!("{duration:?} is more than the {MAX_TIMEOUT_SECONDS} s kactivator accepts"),
        ));
    }
    Ok(duration)
}

fn container_concurrency(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<u32>, ObjectError> {
    let Some(text) = annotations.get(CONTAINER_CONCURRENCY_ANNOTATION) else {
        return Ok(None);
    };
    let field = || format!("metadata.annotations[{CONTAINER_CONCURRENCY_ANNOTATION:?}]");
    match text.trim().parse::<u32>() {
        // 0 is Knative's "unlimited" too.
        Ok(0) => Ok(None),
        Ok(limit) if u64::from(limit) <= crate::queue_proxy::env::MAX_CONCURRENCY => {
            Ok(Some(limit))
        }
        Ok(limit) => Err(error(
            field(),
            format!(
                "{limit} is above the largest limit accepted, {}",
                crate::queue_proxy::env::MAX_CONCURRENCY
            ),
        )),
        Err(_) => Err(error(
            field(),
            format!("{text:?} is not a whole number of requests"),
        )),
    }
}
