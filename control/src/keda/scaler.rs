//! KEDA's external-scaler calls in the add-on's terms (`scaler/handlers.go`, `scaler/naming.go`
//! at v0.15.0): which object a ScaledObject's trigger names, the metric names byte for byte,
//! the targets, the values and whether the route is active. Pure.

use std::collections::BTreeMap;
use std::fmt;

#[cfg(test)]
mod tests;

/// The trigger metadata key that names an InterceptorRoute (`k8s.InterceptorRouteKey`).
pub const INTERCEPTOR_ROUTE_KEY: &str = "interceptorRoute";
/// The trigger metadata key that names an HTTPScaledObject (`k8s.HTTPScaledObjectKey`).
pub const HTTP_SCALED_OBJECT_KEY: &str = "httpScaledObject";
/// The trigger metadata key of the interceptors' own ScaledObject (the chart's).
pub const INTERCEPTOR_TARGET_PENDING_REQUESTS_KEY: &str = "interceptorTargetPendingRequests";
/// An HTTPScaledObject's target when it sets none (`targetPendingRequests`' default).
pub const DEFAULT_TARGET_PENDING_REQUESTS: i64 = 100;

/// What a ScaledObject's trigger asks about, in the add-on's order of precedence: an
/// InterceptorRoute, else an HTTPScaledObject, else the whole fleet of interceptors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    InterceptorRoute {
        name: String,
    },
    HttpScaledObject {
        name: String,
    },
    /// The sum of every route's concurrency, against `target` (the interceptors' own scaling).
    Fleet {
        target: i64,
    },
}

/// Why a trigger's metadata names nothing this scaler answers for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubjectError {
    /// None of the three keys.
    NoReference,
    /// `interceptorTargetPendingRequests` is not a 64-bit integer.
    BadTarget(String),
}

impl fmt::Display for SubjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The add-on's words.
            SubjectError::NoReference => f.write_str("unable to get HTTPScaledObject reference"),
            SubjectError::BadTarget(value) => write!(
                f,
                "strconv.ParseInt: parsing {value:?}: invalid syntax ({INTERCEPTOR_TARGET_PENDING_REQUESTS_KEY})"
            ),
        }
    }
}

impl Subject {
    /// The subject of a trigger whose metadata is `metadata`.
    pub fn of(metadata: &BTreeMap<String, String>) -> Result<Subject, SubjectError> {
        if let Some(name) = metadata.get(INTERCEPTOR_ROUTE_KEY) {
            return Ok(Subject::InterceptorRoute { name: name.clone() });
        }
        if let Some(name) = metadata.get(HTTP_SCALED_OBJECT_KEY) {
            return Ok(Subject::HttpScaledObject { name: name.clone() });
        }
        match metadata.get(INTERCEPTOR_TARGET_PENDING_REQUESTS_KEY) {
            Some(value) => go_parse_int(value)
                .map(|target| Subject::Fleet { target })
                .ok_or_else(|| SubjectError::BadTarget(value.clone())),
            None => Err(SubjectError::NoReference),
        }
    }
}

/// Go's `strconv.ParseInt(s, 10, 64)`: an optional sign and decimal digits, nothing else.
fn go_parse_int(text: &str) -> Option<i64> {
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The metric name of an HTTPScaledObject, `http-<namespace>/<name>` with every byte outside
/// `[-.0-9A-Za-z]` written `_` and its character's UTF-8 bytes in upper-case hex, at least four
/// digits (`/` is `_002F`), as the add-on's `MetricNameHTTPSO` (which formats the matched text
/// with `%04X`). The fleet's metric is the same name of the ScaledObject itself.
pub fn http_scaled_object_metric_name(namespace: &str, name: &str) -> String {
    let text = format!("http-{namespace}/{name}");
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
            out.push(c);
        } else {
            let mut bytes = [0; 4];
            let hex: String = c
                .encode_utf8(&mut bytes)
                .bytes()
                .map(|b| format!("{b:02X}"))
                .collect();
            out.push_str(&format!("_{hex:0>4}"));
        }
    }
    out
}

/// An InterceptorRoute's concurrency metric, `http_<name>_concurrency`.
pub fn concurrency_metric_name(route: &str) -> String {
    format!("http_{route}_concurrency")
}

/// An InterceptorRoute's request-rate metric, `http_<name>_rate`.
pub fn rate_metric_name(route: &str) -> String {
    format!("http_{route}_rate")
}

/// What a route scales on, as its object declares it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Scaling {
    /// `scalingMetric.concurrency.targetValue`, when that metric is set.
    pub concurrency: Option<i64>,
    /// `scalingMetric.requestRate.targetValue` (an HTTPScaledObject's `rate`), when set.
    pub rate: Option<i64>,
    /// An HTTPScaledObject's deprecated `targetPendingRequests`.
    pub target_pending_requests: Option<i64>,
}

/// One metric's specification: its name and target (`MetricSpec`). An HTTPScaledObject's
/// target goes out as the integer `targetSize`, an InterceptorRoute's as `targetSizeFloat`.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricSpec {
    pub name: String,
    pub target: Target,
}

/// A target or a value, in the field the add-on fills.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    Integer(i64),
    Float(f64),
}

impl Target {
    /// Whether it counts as activity (`IsActive`: any value above zero, in either field).
    pub fn is_positive(self) -> bool {
        match self {
            Target::Integer(value) => value > 0,
            Target::Float(value) => value > 0.0,
        }
    }

    /// The message's two fields, the deprecated integer and the float: the one this is, the
    /// other zero.
    pub fn fields(self) -> (i64, f64) {
        match self {
            Target::Integer(value) => (value, 0.0),
            Target::Float(value) => (0, value),
        }
    }
}

/// One metric's value (`MetricValue`).
#[derive(Clone, Debug, PartialEq)]
pub struct MetricValue {
    pub name: String,
    pub value: Target,
}

/// A route's counts summed over every replica: requests in it now (held, or at a pod), and
/// its request rate over its window (per granularity bucket, as the add-on's).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RouteCount {
    pub concurrency: i64,
    pub rate: f64,
}

/// An HTTPScaledObject's one metric: its target is the rate's if set, else the concurrency's,
/// else `targetPendingRequests`, else [`DEFAULT_TARGET_PENDING_REQUESTS`].
pub fn http_scaled_object_spec(namespace: &str, name: &str, scaling: &Scaling) -> MetricSpec {
    let target = scaling
        .rate
        .or(scaling.concurrency)
        .or(scaling.target_pending_requests)
        .unwrap_or(DEFAULT_TARGET_PENDING_REQUESTS);
    MetricSpec {
        name: http_scaled_object_metric_name(namespace, name),
        target: Target::Integer(target),
    }
}

/// An HTTPScaledObject's one value, whatever metric name was asked for: the rate rounded up
/// when it scales on rate, else the concurrency.
pub fn http_scaled_object_value(
    namespace: &str,
    name: &str,
    scaling: &Scaling,
    count: RouteCount,
) -> MetricValue {
    let value = if scaling.rate.is_some() {
        // Go's int(math.Ceil(x)) of a finite, non-negative rate.
        count.rate.ceil() as i64
    } else {
        count.concurrency
    };
    MetricValue {
        name: http_scaled_object_metric_name(namespace, name),
        value: Target::Integer(value),
    }
}

/// An InterceptorRoute's specifications: one per metric it sets, concurrency first.
pub fn interceptor_route_specs(route: &str, scaling: &Scaling) -> Vec<MetricSpec> {
    let mut specs = Vec::with_capacity(2);
    if let Some(target) = scaling.concurrency {
        specs.push(MetricSpec {
            name: concurrency_metric_name(route),
            target: Target::Float(target as f64),
        });
    }
    if let Some(target) = scaling.rate {
        specs.push(MetricSpec {
            name: rate_metric_name(route),
            target: Target::Float(target as f64),
        });
    }
    specs
}

/// An InterceptorRoute's values: the metric asked for, or every one it sets when `asked` is
/// empty (as `IsActive` asks); a name it does not set gives none.
pub fn interceptor_route_values(
    route: &str,
    scaling: &Scaling,
    asked: &str,
    count: RouteCount,
) -> Vec<MetricValue> {
    let mut values = Vec::with_capacity(2);
    let concurrency = concurrency_metric_name(route);
    if scaling.concurrency.is_some() && (asked.is_empty() || asked == concurrency) {
        values.push(MetricValue {
            name: concurrency,
            value: Target::Float(count.concurrency as f64),
        });
    }
    let rate = rate_metric_name(route);
    if scaling.rate.is_some() && (asked.is_empty() || asked == rate) {
        values.push(MetricValue {
            name: rate,
            value: Target::Float(count.rate),
        });
    }
    values
}

/// `IsActive`: whether any value is above zero; no value at all is the add-on's error
/// ("no metric values in response").
pub fn is_active(values: &[MetricValue]) -> Result<bool, &'static str> {
    if values.is_empty() {
        return Err("no metric values in response");
    }
    Ok(values.iter().any(|value| value.value.is_positive()))
}
