//! An HTTPScaledObject (`http.keda.sh/v1alpha1`) or an InterceptorRoute (`http.keda.sh/v1beta1`)
//! as KEDA's HTTP add-on reads them (`operator/apis/http/v1alpha1/httpscaledobject_types.go`,
//! `operator/apis/http/v1beta1/interceptorroute_types.go`, and the first's conversion to the
//! second, `pkg/routing/table.go:71-162`, at v0.15.0), in kactivator's terms: the route's rules,
//! the Service it goes to, the failover, what it scales on, its timeouts, and ours, the per-pod
//! concurrency limit an annotation sets. Pure: the object's JSON in, a route or an error that
//! names the field out.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kactivator_shards::routing::placeholder::DEFAULT_PLACEHOLDER_STATUS;
use kactivator_shards::routing::rules::{HeaderMatch, RouteOrder, Rule};
use kactivator_shards::routing::MAX_TIMEOUT_SECONDS;
use serde::Deserialize;

use super::scaler::Scaling;
use crate::features::parse_duration;
use crate::sources::kubernetes::objects::priority_policy;
use kactivator_shards::routing::priority::PriorityPolicy;

#[cfg(test)]
mod tests;

/// The annotation that gives an HTTPScaledObject a per-pod concurrency limit (★; the add-on
/// has none, #1038). Absent: unlimited, as the add-on.
pub const CONTAINER_CONCURRENCY_ANNOTATION: &str = "kactivator.dev/container-concurrency";
/// The annotation that gives a route priority bands and per-tenant fairness among its waiting
/// requests (★; the add-on has neither): the grammar of the Knative source's
/// `kactivator.knative.dev/priority` (`sources::kubernetes::objects::priority_policy`). Absent:
/// off.
pub const PRIORITY_ANNOTATION: &str = "kactivator.dev/priority";
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

/// The two kinds of object that make a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    /// `http.keda.sh/v1alpha1` HTTPScaledObject.
    HttpScaledObject,
    /// `http.keda.sh/v1beta1` InterceptorRoute (the add-on's 0.14 and later); one of the same
    /// namespace and name routes instead of an HTTPScaledObject (`table.go` L81-84).
    InterceptorRoute,
}

impl ObjectKind {
    /// The kind as the API names it.
    pub fn describe(self) -> &'static str {
        match self {
            ObjectKind::HttpScaledObject => "HTTPScaledObject",
            ObjectKind::InterceptorRoute => "InterceptorRoute",
        }
    }
}

/// A timeout as an object sets it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Timeout {
    /// Unset: the process's (the add-on's environment).
    #[default]
    Default,
    /// An InterceptorRoute's `"0s"`: none, whatever the environment says.
    Off,
    After(Duration),
}

impl Timeout {
    /// The timeout, given the process's.
    pub fn or(self, default: Option<Duration>) -> Option<Duration> {
        match self {
            Timeout::Default => default,
            Timeout::Off => None,
            Timeout::After(duration) => Some(duration),
        }
    }
}

/// One HTTPScaledObject or InterceptorRoute, read.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteObject {
    pub kind: ObjectKind,
    pub namespace: String,
    pub name: String,
    /// What orders it among routes of the same host, prefix and headers.
    pub order: RouteOrder,
    /// An HTTPScaledObject's `hosts`, `pathPrefixes` and `headers` as one rule; an
    /// InterceptorRoute's `rules`.
    pub rules: Vec<Rule>,
    /// `scaleTargetRef`'s (`target`'s) Service and port (the Deployment is KEDA's to scale).
    pub target: ServiceRef,
    pub failover: Option<Failover>,
    pub scaling: Scaling,
    /// With a rate metric: its window.
    pub rate: Option<RateWindow>,
    /// How long a request waits for a ready endpoint: an HTTPScaledObject's failover's
    /// `timeoutSeconds`, else its `timeouts.conditionWait` when above zero; an
    /// InterceptorRoute's `timeouts.readiness`.
    pub readiness: Timeout,
    /// An InterceptorRoute's `timeouts.request` (an HTTPScaledObject has none).
    pub request: Timeout,
    /// `timeouts.responseHeader` (an HTTPScaledObject's only when above zero).
    pub response_header: Timeout,
    /// [`CONTAINER_CONCURRENCY_ANNOTATION`]; `None`: unlimited.
    pub container_concurrency: Option<u32>,
    /// [`PRIORITY_ANNOTATION`]; `None`: one band, first come first served.
    pub priority: Option<Box<PriorityPolicy>>,
    /// An InterceptorRoute's `coldStart.placeholder.response`: what a request gets at once
    /// while the route has no ready endpoint.
    pub placeholder: Option<PlaceholderSpec>,
    /// An InterceptorRoute's `coldStart.maxPendingRequests` (the add-on 0.16's, at least 1):
    /// the most requests held for it on this replica; `None`: the role's default
    /// (`KEDA_HTTP_COLD_START_MAX_PENDING_REQUESTS`).
    pub max_pending: Option<u32>,
    /// An InterceptorRoute's `coldStart.overflow` (0.16): what a request beyond
    /// `max_pending` gets.
    pub overflow: Overflow,
    /// An InterceptorRoute's `staticRoutes` (0.16), in order.
    pub static_routes: Vec<StaticRouteSpec>,
}

/// One static route as a route declares it (`StaticRoute`): requests of the route one of its
/// rules matches are not counted and get its response (when `always`, or while the route has no
/// ready endpoint).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticRouteSpec {
    pub rules: Vec<Rule>,
    pub response: PlaceholderSpec,
    /// `responseMode: Always`; false: `WhenUnavailable` (the default).
    pub always: bool,
}

/// A static route's status when its response sets none (`http.StatusOK` in the add-on's
/// `StaticRouting`).
pub const STATIC_ROUTE_STATUS: u16 = 200;

/// What a request that finds its route's held requests at their limit gets (`coldStart.overflow`,
/// the add-on 0.16's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overflow {
    /// A 503 (`Reject`, the default).
    #[default]
    Reject,
    /// The route's placeholder (`Placeholder`); with an explicit `maxPendingRequests`, requests
    /// are then held up to the limit instead of getting the placeholder at once.
    Placeholder,
}

/// A placeholder response as a route declares it (`StaticResponse`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlaceholderSpec {
    /// `statusCode`, 503 when unset.
    pub status: u16,
    /// `headers`, in name order.
    pub fields: Vec<(String, Vec<u8>)>,
    pub body: PlaceholderSource,
}

/// Where a placeholder's body comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlaceholderSource {
    /// `body`; none is an empty body.
    Inline(String),
    /// `bodyFromConfigMap`: a ConfigMap of the route's namespace, and its key (`None`: the
    /// request's path).
    ConfigMap { name: String, key: Option<String> },
}

/// The label a ConfigMap needs for a placeholder to read it (`k8s.ResponseBodyLabels`).
pub const RESPONSE_BODY_LABEL: &str = "http.keda.sh/response-body";

/// The longest inline placeholder body (the CRD's `maxLength`).
pub const MAX_PLACEHOLDER_BODY: usize = 32 * 1024;

/// Fields a placeholder may not declare: the writer frames the response and dates it.
const WRITERS_FIELDS: [&str; 9] = [
    "connection",
    "content-length",
    "date",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

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

#[derive(Deserialize)]
struct RouteWire {
    #[serde(default)]
    metadata: ObjectMeta,
    spec: Option<RouteSpecWire>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RouteSpecWire {
    target: Option<TargetWire>,
    cold_start: Option<ColdStartWire>,
    timeouts: Option<RouteTimeoutsWire>,
    rules: Option<Vec<RuleWire>>,
    scaling_metric: Option<ScalingMetricWire>,
    /// 0.16 (#1622, #1689); a 0.15 CRD prunes it.
    static_routes: Option<Vec<StaticRouteWire>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct StaticRouteWire {
    rules: Option<Vec<RuleWire>>,
    response: Option<StaticResponseWire>,
    response_mode: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RuleWire {
    hosts: Option<Vec<String>>,
    paths: Option<Vec<PathWire>>,
    headers: Option<Vec<HeaderWire>>,
}

#[derive(Deserialize)]
struct PathWire {
    value: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct ColdStartWire {
    fallback: Option<FallbackWire>,
    placeholder: Option<PlaceholderWire>,
    /// 0.16 (#1733); a 0.15 CRD prunes it.
    max_pending_requests: Option<i64>,
    overflow: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct PlaceholderWire {
    response: Option<StaticResponseWire>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct StaticResponseWire {
    status_code: Option<i64>,
    body: Option<String>,
    body_from_config_map: Option<ConfigMapRefWire>,
    headers: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct ConfigMapRefWire {
    name: String,
    key: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct FallbackWire {
    service: Option<ServiceRefWire>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct ServiceRefWire {
    name: String,
    port: Option<i32>,
    port_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RouteTimeoutsWire {
    readiness: Option<String>,
    request: Option<String>,
    response_header: Option<String>,
}

/// The CRD's default target of a metric that sets none.
const DEFAULT_TARGET_VALUE: i64 = 100;

/// What every object has in its metadata: who it is, what orders it, and our annotation.
struct Identity {
    namespace: String,
    name: String,
    order: RouteOrder,
    container_concurrency: Option<u32>,
    priority: Option<Box<PriorityPolicy>>,
}

fn identity(metadata: ObjectMeta) -> Result<Identity, ObjectError> {
    let namespace = metadata
        .namespace
        .filter(|namespace| !namespace.is_empty())
        .ok_or_else(|| error("metadata.namespace", "missing"))?;
    let name = metadata
        .name
        .filter(|name| !name.is_empty())
        .ok_or_else(|| error("metadata.name", "missing"))?;
    let annotations = metadata.annotations.unwrap_or_default();
    let container_concurrency = container_concurrency(&annotations)?;
    let priority = match annotations.get(PRIORITY_ANNOTATION) {
        None => None,
        Some(value) => priority_policy(value)
            .map_err(|problem| {
                error(
                    format!("metadata.annotations[{PRIORITY_ANNOTATION:?}]"),
                    problem,
                )
            })?
            .map(Box::new),
    };
    let created = metadata
        .creation_timestamp
        .map_or(0, |time| time.0.as_second());
    Ok(Identity {
        order: RouteOrder {
            created,
            namespace: namespace.clone(),
            name: name.clone(),
        },
        namespace,
        name,
        container_concurrency,
        priority,
    })
}

/// A rule's header matches; `field` names the list.
fn header_matches(field: &str, headers: Vec<HeaderWire>) -> Result<Vec<HeaderMatch>, ObjectError> {
    headers
        .into_iter()
        .enumerate()
        .map(|(index, header)| {
            if header.name.is_empty() {
                return Err(error(format!("{field}[{index}].name"), "empty"));
            }
            Ok(HeaderMatch {
                name: header.name.into(),
                value: header.value.map(Into::into),
            })
        })
        .collect()
}

/// A metric's target: the CRD's default when `default_target` allows one, else required.
fn target_value(
    field: &str,
    value: Option<i64>,
    default_target: Option<i64>,
) -> Result<i64, ObjectError> {
    match value.or(default_target) {
        None => Err(error(format!("{field}.targetValue"), "missing")),
        Some(value) if value < 1 && default_target.is_none() => Err(error(
            format!("{field}.targetValue"),
            format!("{value} is below 1"),
        )),
        Some(value) => Ok(value),
    }
}

/// A rate metric's window and granularity, the CRD's defaults when unset, refused when they
/// make no buckets.
fn rate_window(field: &str, rate: &RateWire) -> Result<RateWindow, ObjectError> {
    let window = duration(&format!("{field}.window"), rate.window.as_deref())?
        .unwrap_or(DEFAULT_RATE_WINDOW);
    let granularity = duration(&format!("{field}.granularity"), rate.granularity.as_deref())?
        .unwrap_or(DEFAULT_RATE_GRANULARITY);
    super::rate::RequestBuckets::new(window, granularity).map_err(|problem| {
        error(
            field,
            format!("no buckets for that window and granularity: {problem:?}"),
        )
    })?;
    Ok(RateWindow {
        window,
        granularity,
    })
}

impl RouteObject {
    /// Reads one object of `kind` as the API server serves it.
    pub fn from_json(
        kind: ObjectKind,
        object: &serde_json::Value,
    ) -> Result<RouteObject, ObjectError> {
        match kind {
            ObjectKind::HttpScaledObject => RouteObject::from_http_scaled_object(object),
            ObjectKind::InterceptorRoute => RouteObject::from_interceptor_route(object),
        }
    }

    /// Reads an HTTPScaledObject, as the add-on makes an InterceptorRoute of it.
    pub fn from_http_scaled_object(object: &serde_json::Value) -> Result<RouteObject, ObjectError> {
        let wire = Wire::deserialize(object)
            .map_err(|problem| error("object", format!("not an HTTPScaledObject: {problem}")))?;
        let identity = identity(wire.metadata)?;
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
            headers: header_matches("spec.headers", spec.headers.unwrap_or_default())?,
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
                scaling.concurrency = Some(target_value(
                    "spec.scalingMetric.concurrency",
                    concurrency.target_value,
                    Some(DEFAULT_TARGET_VALUE),
                )?);
            }
            if let Some(request_rate) = metric.request_rate {
                let field = "spec.scalingMetric.requestRate";
                scaling.rate = Some(target_value(
                    field,
                    request_rate.target_value,
                    Some(DEFAULT_TARGET_VALUE),
                )?);
                rate = Some(rate_window(field, &request_rate)?);
            }
        }

        let timeouts = spec.timeouts.unwrap_or_default();
        // Only above zero: the add-on's conversion copies nothing else.
        let positive = |duration: Option<Duration>| match duration {
            Some(duration) if !duration.is_zero() => Timeout::After(duration),
            _ => Timeout::Default,
        };
        let mut readiness = positive(duration(
            "spec.timeouts.conditionWait",
            timeouts.condition_wait.as_deref(),
        )?);
        let response_header = positive(duration(
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
                        readiness = Timeout::After(within_a_year(
                            &format!("{field}.timeoutSeconds"),
                            Duration::from_secs(seconds as u64),
                        )?);
                    }
                    None => readiness = Timeout::After(DEFAULT_FAILOVER_TIMEOUT),
                }
                Some(Failover { to })
            }
        };

        Ok(RouteObject {
            kind: ObjectKind::HttpScaledObject,
            namespace: identity.namespace,
            name: identity.name,
            order: identity.order,
            rules: vec![rule],
            target,
            failover,
            scaling,
            rate,
            readiness,
            request: Timeout::Default,
            response_header,
            container_concurrency: identity.container_concurrency,
            priority: identity.priority,
            placeholder: None,
            max_pending: None,
            overflow: Overflow::Reject,
            static_routes: Vec::new(),
        })
    }

    /// Reads an InterceptorRoute.
    pub fn from_interceptor_route(object: &serde_json::Value) -> Result<RouteObject, ObjectError> {
        let wire = RouteWire::deserialize(object)
            .map_err(|problem| error("object", format!("not an InterceptorRoute: {problem}")))?;
        let identity = identity(wire.metadata)?;
        let spec = wire.spec.ok_or_else(|| error("spec", "missing"))?;
        let target = spec.target.ok_or_else(|| error("spec.target", "missing"))?;
        let target = service_ref("spec.target", target.service, target.port, target.port_name)?;

        let rules = spec
            .rules
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(index, rule)| routing_rule(&format!("spec.rules[{index}]"), rule))
            .collect::<Result<Vec<_>, ObjectError>>()?;
        let static_routes = spec
            .static_routes
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(index, route)| static_route(&format!("spec.staticRoutes[{index}]"), route))
            .collect::<Result<Vec<_>, ObjectError>>()?;

        // Both metrics may be set: KEDA takes the larger replica count.
        let metric = spec
            .scaling_metric
            .ok_or_else(|| error("spec.scalingMetric", "missing"))?;
        let mut scaling = Scaling::default();
        let mut rate = None;
        if let Some(concurrency) = metric.concurrency {
            scaling.concurrency = Some(target_value(
                "spec.scalingMetric.concurrency",
                concurrency.target_value,
                None,
            )?);
        }
        if let Some(request_rate) = metric.request_rate {
            let field = "spec.scalingMetric.requestRate";
            scaling.rate = Some(target_value(field, request_rate.target_value, None)?);
            rate = Some(rate_window(field, &request_rate)?);
        }
        if scaling.concurrency.is_none() && scaling.rate.is_none() {
            // The CRD's own words.
            return Err(error(
                "spec.scalingMetric",
                "at least one of 'concurrency' or 'requestRate' must be set",
            ));
        }

        let timeouts = spec.timeouts.unwrap_or_default();
        let timeout = |field: &str, text: Option<&str>| -> Result<Timeout, ObjectError> {
            Ok(match duration(field, text)? {
                None => Timeout::Default,
                Some(duration) if duration.is_zero() => Timeout::Off,
                Some(duration) => Timeout::After(duration),
            })
        };
        let readiness = timeout("spec.timeouts.readiness", timeouts.readiness.as_deref())?;
        let request = timeout("spec.timeouts.request", timeouts.request.as_deref())?;
        let response_header = timeout(
            "spec.timeouts.responseHeader",
            timeouts.response_header.as_deref(),
        )?;

        let cold_start = spec.cold_start.unwrap_or_default();
        let max_pending = match cold_start.max_pending_requests {
            None => None,
            Some(limit) => Some(
                u32::try_from(limit)
                    .ok()
                    .filter(|limit| *limit >= 1)
                    .ok_or_else(|| {
                        error(
                            "spec.coldStart.maxPendingRequests",
                            format!("{limit}: at least 1, at most {}", u32::MAX),
                        )
                    })?,
            ),
        };
        let overflow = match cold_start.overflow.as_deref() {
            None | Some("Reject") => Overflow::Reject,
            Some("Placeholder") => Overflow::Placeholder,
            Some(other) => {
                return Err(error(
                    "spec.coldStart.overflow",
                    format!("{other:?}: Reject or Placeholder"),
                ))
            }
        };
        let failover = match cold_start.fallback.and_then(|fallback| fallback.service) {
            None => None,
            Some(service) if service.name.is_empty() => {
                return Err(error("spec.coldStart.fallback.service.name", "missing"))
            }
            Some(service) => Some(Failover {
                to: service_ref(
                    "spec.coldStart.fallback.service",
                    service.name,
                    service.port,
                    service.port_name,
                )?,
            }),
        };

        Ok(RouteObject {
            kind: ObjectKind::InterceptorRoute,
            namespace: identity.namespace,
            name: identity.name,
            order: identity.order,
            rules,
            target,
            failover,
            scaling,
            rate,
            readiness,
            request,
            response_header,
            container_concurrency: identity.container_concurrency,
            priority: identity.priority,
            placeholder: cold_start
                .placeholder
                .and_then(|placeholder| placeholder.response)
                .map(placeholder)
                .transpose()?,
            max_pending,
            overflow,
            static_routes,
        })
    }
}

/// One `RoutingRule` (`field` names it in a refusal).
fn routing_rule(field: &str, rule: RuleWire) -> Result<Rule, ObjectError> {
    let paths = rule
        .paths
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(at, path)| {
            if path.value.is_empty() {
                return Err(error(format!("{field}.paths[{at}].value"), "empty"));
            }
            Ok(path.value)
        })
        .collect::<Result<_, _>>()?;
    Ok(Rule {
        hosts: rule.hosts.unwrap_or_default(),
        paths,
        headers: header_matches(
            &format!("{field}.headers"),
            rule.headers.unwrap_or_default(),
        )?,
    })
}

/// One static route (0.16's `staticRoutes[]`): at least one rule, its response (200 unless it
/// says), its mode.
fn static_route(field: &str, route: StaticRouteWire) -> Result<StaticRouteSpec, ObjectError> {
    let rules = route.rules.unwrap_or_default();
    if rules.is_empty() {
        return Err(error(format!("{field}.rules"), "at least one rule"));
    }
    let rules = rules
        .into_iter()
        .enumerate()
        .map(|(index, rule)| routing_rule(&format!("{field}.rules[{index}]"), rule))
        .collect::<Result<Vec<_>, ObjectError>>()?;
    let response = route
        .response
        .ok_or_else(|| error(format!("{field}.response"), "missing"))?;
    let response = static_response(&format!("{field}.response"), response, STATIC_ROUTE_STATUS)?;
    let always = match route.response_mode.as_deref() {
        None | Some("") | Some("WhenUnavailable") => false,
        Some("Always") => true,
        Some(other) => {
            return Err(error(
                format!("{field}.responseMode"),
                format!("{other:?}: Always or WhenUnavailable"),
            ))
        }
    };
    Ok(StaticRouteSpec {
        rules,
        response,
        always,
    })
}

/// A placeholder's response, as the CRD and Go's server allow it.
fn placeholder(response: StaticResponseWire) -> Result<PlaceholderSpec, ObjectError> {
    static_response(
        "spec.coldStart.placeholder.response",
        response,
        DEFAULT_PLACEHOLDER_STATUS,
    )
}

/// A `StaticResponse` (`field` names it), its status `default_status` when unset.
fn static_response(
    field: &str,
    response: StaticResponseWire,
    default_status: u16,
) -> Result<PlaceholderSpec, ObjectError> {
    let status = match response.status_code {
        None | Some(0) => default_status,
        Some(code @ 100..=599) => code as u16,
        Some(code) => {
            return Err(error(
                format!("{field}.statusCode"),
                format!("{code} is not a status code (100 to 599)"),
            ))
        }
    };
    let body = match (response.body, response.body_from_config_map) {
        (Some(_), Some(_)) => {
            return Err(error(
                field,
                "at most one of 'body' or 'bodyFromConfigMap' may be set",
            ))
        }
        (Some(body), None) if body.len() > MAX_PLACEHOLDER_BODY => {
            return Err(error(
                format!("{field}.body"),
                format!(
                    "{} bytes, more than the {MAX_PLACEHOLDER_BODY} the CRD allows",
                    body.len()
                ),
            ))
        }
        (Some(body), None) => PlaceholderSource::Inline(body),
        (None, None) => PlaceholderSource::Inline(String::new()),
        (None, Some(config_map)) if config_map.name.is_empty() => {
            return Err(error(format!("{field}.bodyFromConfigMap.name"), "missing"))
        }
        (None, Some(config_map)) => PlaceholderSource::ConfigMap {
            name: config_map.name,
            key: config_map.key.filter(|key| !key.is_empty()),
        },
    };
    let mut fields = Vec::new();
    for (name, value) in response.headers.unwrap_or_default() {
        let at = || format!("{field}.headers[{name:?}]");
        if name.is_empty() || !name.bytes().all(is_token_byte) {
            return Err(error(at(), "not a field name"));
        }
        if WRITERS_FIELDS.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(error(at(), "kactivator writes this field itself"));
        }
        if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(error(at(), "a value may not hold CR, LF or NUL"));
        }
        fields.push((name, value.into_bytes()));
    }
    Ok(PlaceholderSpec {
        status,
        fields,
        body,
    })
}

/// A byte of a field name (RFC 9110 `tchar`).
fn is_token_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
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
