//! What the watched Kubernetes objects say, as the state worker's terms: a Revision's spec, a
//! revision's endpoints (core/v1 Endpoints or an EndpointSlice, v1 or v1beta1), the activators in
//! its public endpoints, its private Service's address. Pure: objects in, values out; anything
//! missing, malformed or out of bounds is an error that names the field, never a panic.
//!
//! Bounds, checked here so that nothing later has to: a Revision's three timeouts are at most
//! [`MAX_TIMEOUT_SECONDS`] (a larger one refuses the Revision, as a bad `containerConcurrency`
//! does); a port is 1–65535 (a subset or slice with another is not used, and the problem is
//! reported); an endpoints object lists at most [`MAX_ADDRESSES_PER_OBJECT`] addresses (beyond
//! that it is not used at all). Values quoted in errors are cut to [`QUOTED_MAX_CHARS`].

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kactivator_api::RevisionKey;
use kactivator_shards::routing::priority::{default_band_of, PriorityPolicy};
use kactivator_shards::routing::{
    LbPolicy, Protocol, RevisionLabels, Timeouts, DEFAULT_QUEUE_DEPTH, MAX_TIMEOUT_SECONDS,
};
use serde_json::Value;

use crate::state::{Activators, RevisionSpec, DEFAULT_H2C_SERVING_PORT, DEFAULT_SERVING_PORT};

/// Label saying whether endpoints or a Service are a revision's `Private` or `Public` ones.
pub const SERVICE_TYPE_LABEL: &str = "networking.internal.knative.dev/serviceType";
/// Label naming the revision an object belongs to.
pub const REVISION_LABEL: &str = "serving.knative.dev/revision";
/// Labels of a Revision naming its Service and Configuration (metric labels).
pub const SERVICE_LABEL: &str = "serving.knative.dev/service";
pub const CONFIGURATION_LABEL: &str = "serving.knative.dev/configuration";
/// Annotation on a Revision choosing its load-balancing policy (ours; the fork's
/// `spec.loadBalancingPolicy` field is honoured too and wins).
pub const LB_POLICY_ANNOTATION: &str = "kactivator.knative.dev/load-balancing-policy";
/// Revision annotation turning on priority bands and per-tenant fairness among its waiting
/// requests (README, "Priority and fairness"): `on` (or empty) for the defaults, `off`, or
/// `key=value` pairs separated by commas, keys `bands`, `default_band`, `priority_header`,
/// `tenant_header` (as in the file's `[revisions.priority]`). Absent: off.
pub const PRIORITY_ANNOTATION: &str = "kactivator.knative.dev/priority";
/// EndpointSlice label naming the Service it belongs to.
pub const SLICE_SERVICE_LABEL: &str = "kubernetes.io/service-name";

/// Most addresses one Endpoints object or EndpointSlice may list (ready and not, over its
/// subsets or endpoints). Kubernetes' own controllers write at most 1000 per object; a larger
/// one is refused whole rather than probed and tracked address by address.
pub const MAX_ADDRESSES_PER_OBJECT: usize = 65_536;

/// Longest part of a value quoted in an error: a field can hold megabytes, a log line should not.
pub const QUOTED_MAX_CHARS: usize = 64;

/// `value` as an error quotes it: its JSON, cut to [`QUOTED_MAX_CHARS`] characters.
fn quoted(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(QUOTED_MAX_CHARS) {
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
        None => text,
    }
}

/// Which of a revision's Services (and their endpoints) an object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ServiceType {
    /// The revision's pods (`<rev>-private`): the backends.
    Private,
    /// The activators in front of the revision (`<rev>`).
    Public,
}

/// The revision and kind an endpoints object or Service belongs to, from its labels.
pub fn owner(meta: &ObjectMeta) -> Option<(RevisionKey, ServiceType)> {
    let labels = meta.labels.as_ref()?;
    let kind = match labels.get(SERVICE_TYPE_LABEL)?.as_str() {
        "Private" => ServiceType::Private,
        "Public" => ServiceType::Public,
        _ => return None,
    };
    let revision = labels.get(REVISION_LABEL).filter(|name| !name.is_empty())?;
    let key = RevisionKey::new(meta.namespace.as_deref()?, revision).ok()?;
    Some((key, kind))
}

/// A Revision (`serving.knative.dev/v1`, read as JSON) as the state worker's spec.
pub fn revision_spec(object: &Value) -> Result<RevisionSpec, String> {
    let metadata = &object["metadata"];
    let namespace = metadata["namespace"]
        .as_str()
        .ok_or("metadata.namespace missing")?;
    let name = metadata["name"].as_str().ok_or("metadata.name missing")?;
    let key = RevisionKey::new(namespace, name).map_err(|error| error.to_string())?;
    let label = |label: &str| {
        metadata["labels"][label]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let spec = &object["spec"];
    let seconds = |field: &str| -> Result<Option<u64>, String> {
        match &spec[field] {
            Value::Null => Ok(None),
            value => match value.as_u64() {
                Some(seconds) if seconds <= MAX_TIMEOUT_SECONDS => Ok(Some(seconds)),
                Some(seconds) => Err(format!(
                    "spec.{field} {seconds} is above the longest timeout kactivator accepts, \
                     {MAX_TIMEOUT_SECONDS} s (a year)"
                )),
                None => Err(format!(
                    "spec.{field} is not a whole number of seconds: {}",
                    quoted(value)
                )),
            },
        }
    };
    let container_concurrency = match &spec["containerConcurrency"] {
        Value::Null => 0,
        value => value
            .as_u64()
            .and_then(|value| u32::try_from(value).ok())
            .ok_or_else(|| {
                format!(
                    "spec.containerConcurrency is not a count: {}",
                    quoted(value)
                )
            })?,
    };
    let timeouts = Timeouts {
        total: seconds("timeoutSeconds")?
            .filter(|&seconds| seconds > 0)
            .map_or(Timeouts::default().total, Duration::from_secs),
        response_start: seconds("responseStartTimeoutSeconds")?
            .filter(|&seconds| seconds > 0)
            .map(Duration::from_secs),
        idle: seconds("idleTimeoutSeconds")?
            .filter(|&seconds| seconds > 0)
            .map(Duration::from_secs),
    };
    // Upstream: h2c iff the first container's first port is named `h2c`.
    let protocol = match spec["containers"][0]["ports"][0]["name"].as_str() {
        Some("h2c") => Protocol::H2c,
        _ => Protocol::Http1,
    };
    let lb_policy = match chosen_lb_policy(object) {
        None => LbPolicy::default_for(container_concurrency),
        Some(name) => LbPolicy::parse(name).ok_or_else(|| {
            format!(
                "unknown load-balancing policy {} (random-choice-2, first-available, \
                 round-robin, least-connections)",
                quoted(&Value::from(name))
            )
        })?,
    };
    Ok(RevisionSpec {
        labels: RevisionLabels {
            namespace: namespace.to_string(),
            revision: name.to_string(),
            service: label(SERVICE_LABEL),
            configuration: label(CONFIGURATION_LABEL),
        },
        key,
        container_concurrency,
        protocol,
        timeouts,
        lb_policy,
        queue_depth: DEFAULT_QUEUE_DEPTH,
        priority: match object["metadata"]["annotations"][PRIORITY_ANNOTATION].as_str() {
            None => None,
            Some(value) => priority_policy(value)
                .map_err(|error| format!("annotation {PRIORITY_ANNOTATION}: {error}"))?
                .map(Box::new),
        },
        serving_port: match protocol {
            Protocol::Http1 => DEFAULT_SERVING_PORT,
            Protocol::H2c => DEFAULT_H2C_SERVING_PORT,
        },
        cluster_ip: None,
    })
}

/// The [`PRIORITY_ANNOTATION`]'s value as a policy (`None`: off).
pub fn priority_policy(value: &str) -> Result<Option<PriorityPolicy>, String> {
    let value = value.trim();
    match value {
        "" | "on" => return Ok(Some(PriorityPolicy::default())),
        "off" => return Ok(None),
        _ => {}
    }
    let mut policy = PriorityPolicy::default();
    let mut default_band = None;
    for pair in value
        .split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
    {
        let Some((key, setting)) = pair.split_once('=') else {
            return Err(format!("{} is not key=value", quoted(&Value::from(pair))));
        };
        let (key, setting) = (key.trim(), setting.trim());
        let number = || {
            setting.parse::<u8>().map_err(|_| {
                format!(
                    "{key} is not a small count: {}",
                    quoted(&Value::from(setting))
                )
            })
        };
        match key {
            "bands" => policy.bands = number()?,
            "default_band" => default_band = Some(number()?),
            "priority_header" => policy.priority_header = setting.to_string(),
            "tenant_header" => policy.tenant_header = setting.to_string(),
            "priority_header_trusted" => {
                policy.trusted = match setting {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(format!(
                            "priority_header_trusted is not true or false: {}",
                            quoted(&Value::from(setting))
                        ))
                    }
                }
            }
            _ => match key.strip_prefix("tenant_band.") {
                Some(tenant) => policy.tenant_bands.push((tenant.to_string(), number()?)),
                None => {
                    return Err(format!(
                        "unknown key {} (bands, default_band, priority_header, tenant_header, \
                         priority_header_trusted, tenant_band.<key>)",
                        quoted(&Value::from(key))
                    ))
                }
            },
        }
    }
    policy.default_band = default_band.unwrap_or(default_band_of(policy.bands));
    policy
        .check()
        .map_err(|error| format!("{} {}", error.field, error.reason))?;
    Ok(Some(policy))
}

/// Whether a passing probe may promote a pod Kubernetes does not list as ready yet
/// (upstream's probe optimisation, `revision_backends.go`): not when the user container's
/// readiness is an exec probe, nor when any container has a startup probe, since then only the
/// kubelet knows when the pod is really ready. The user container is the only container, or
/// the first one with ports.
pub fn probe_optimisation(object: &Value) -> bool {
    let containers = object["spec"]["containers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let user = match containers {
        [only] => Some(only),
        _ => containers.iter().find(|container| {
            container["ports"]
                .as_array()
                .is_some_and(|ports| !ports.is_empty())
        }),
    };
    let exec_readiness = user.is_some_and(|user| !user["readinessProbe"]["exec"].is_null());
    let startup = containers
        .iter()
        .any(|container| !container["startupProbe"].is_null());
    !exec_readiness && !startup
}

/// The load-balancing policy a Revision names, if any: the fork's `spec.loadBalancingPolicy`,
/// else the [`LB_POLICY_ANNOTATION`].
pub fn chosen_lb_policy(object: &Value) -> Option<&str> {
    object["spec"]["loadBalancingPolicy"]
        .as_str()
        .or_else(|| object["metadata"]["annotations"][LB_POLICY_ANNOTATION].as_str())
}

/// A revision's endpoints: the ready ones and those listed as not ready.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Addresses {
    pub ready: BTreeSet<SocketAddr>,
    pub not_ready: BTreeSet<SocketAddr>,
}

impl Addresses {
    /// Adds another part's addresses (one of a Service's several EndpointSlices).
    pub fn merge(&mut self, other: &Addresses) {
        self.ready.extend(&other.ready);
        self.not_ready.extend(&other.not_ready);
        // An address ready in one slice is ready.
        let ready = self.ready.clone();
        self.not_ready.retain(|addr| !ready.contains(addr));
    }
}

/// Port names that carry a revision's traffic (upstream's `http`/`http2`).
fn is_serving_port(name: Option<&str>) -> bool {
    matches!(name, Some("http" | "http2"))
}

/// The activators' HTTP/1 data port in `activator-service`'s endpoints, where queue-proxy
/// registrations are relayed (the Service also lists `http2`, `http-metrics`).
fn is_http_port(name: Option<&str>) -> bool {
    name == Some("http")
}

/// What one endpoints object lists, and what in it could not be used (each problem names the
/// field; the caller adds the object's name).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub addresses: Addresses,
    pub problems: Vec<String>,
}

/// Most problems reported per object; the rest are counted in the last one.
const PROBLEMS_MAX: usize = 8;

impl Listing {
    fn problem(&mut self, problem: String) {
        match self.problems.len() {
            count if count < PROBLEMS_MAX => self.problems.push(problem),
            PROBLEMS_MAX => self.problems.push("… and more".into()),
            _ => {}
        }
    }

    /// Refuses the whole object when it lists more than [`MAX_ADDRESSES_PER_OBJECT`].
    fn bounded(mut self, listed: usize, field: &str) -> Listing {
        if listed > MAX_ADDRESSES_PER_OBJECT {
            self.addresses = Addresses::default();
            self.problems = vec![format!(
                "{field} list {listed} addresses, more than the {MAX_ADDRESSES_PER_OBJECT} \
                 kactivator takes from one object; none is used"
            )];
        }
        self
    }
}

/// A port number as the API writes it: 1–65535, else `None`.
fn port_number(port: i64) -> Option<u16> {
    u16::try_from(port).ok().filter(|&port| port != 0)
}

/// core/v1 Endpoints → addresses: from every subset with a port named `http` or `http2`, at
/// that port (upstream's `endpointsToDests`).
pub fn endpoints_addresses(endpoints: &Endpoints) -> Listing {
    endpoints_addresses_at(endpoints, is_serving_port)
}

/// `activator-service`'s Endpoints → the activators' addresses at their port named `http`.
pub fn activator_endpoints_addresses(endpoints: &Endpoints) -> Listing {
    endpoints_addresses_at(endpoints, is_http_port)
}

/// An `activator-service` EndpointSlice → the activators' addresses at their port named `http`.
pub fn activator_slice_addresses(slice: &Value) -> Listing {
    slice_addresses_at(slice, is_http_port)
}

fn endpoints_addresses_at(endpoints: &Endpoints, accept: fn(Option<&str>) -> bool) -> Listing {
    let mut listing = Listing::default();
    let mut listed = 0;
    for (index, subset) in endpoints.subsets.iter().flatten().enumerate() {
        let Some((port_index, port)) = subset
            .ports
            .iter()
            .flatten()
            .enumerate()
            .find(|(_, port)| accept(port.name.as_deref()))
        else {
            continue;
        };
        let Some(port) = port_number(i64::from(port.port)) else {
            listing.problem(format!(
                "subsets[{index}].ports[{port_index}].port {} is not a port (1-65535); the \
                 subset is not used",
                port.port
            ));
            continue;
        };
        for (field, list, ready) in [
            ("addresses", &subset.addresses, true),
            ("notReadyAddresses", &subset.not_ready_addresses, false),
        ] {
            for (at, address) in list.iter().flatten().enumerate() {
                listed += 1;
                let Ok(ip) = address.ip.parse::<IpAddr>() else {
                    listing.problem(format!(
                        "subsets[{index}].{field}[{at}].ip {} is not an IP address",
                        quoted(&Value::from(address.ip.as_str()))
                    ));
                    continue;
                };
                let into = if ready {
                    &mut listing.addresses.ready
                } else {
                    &mut listing.addresses.not_ready
                };
                into.insert(SocketAddr::new(ip, port));
            }
        }
    }
    listing.bounded(listed, "subsets")
}

/// An EndpointSlice (v1 or v1beta1, read as JSON) → addresses at its port named `http` or
/// `http2`. An endpoint is ready unless `conditions.ready` is false (nil means ready, as the
/// API documents).
pub fn slice_addresses(slice: &Value) -> Listing {
    slice_addresses_at(slice, is_serving_port)
}

fn slice_addresses_at(slice: &Value, accept: fn(Option<&str>) -> bool) -> Listing {
    let mut listing = Listing::default();
    let Some((port_index, port)) = slice["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .find(|(_, port)| accept(port["name"].as_str()))
    else {
        return listing;
    };
    let Some(port) = port["port"].as_i64().and_then(port_number) else {
        listing.problem(format!(
            "ports[{port_index}].port {} is not a port (1-65535); the slice is not used",
            quoted(&port["port"])
        ));
        return listing;
    };
    let mut listed = 0;
    for (index, endpoint) in slice["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let ready = endpoint["conditions"]["ready"].as_bool().unwrap_or(true);
        for (at, ip) in endpoint["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            listed += 1;
            let Some(ip) = ip.as_str().and_then(|ip| ip.parse::<IpAddr>().ok()) else {
                listing.problem(format!(
                    "endpoints[{index}].addresses[{at}] {} is not an IP address",
                    quoted(ip)
                ));
                continue;
            };
            let addr = SocketAddr::new(ip, port);
            if ready {
                listing.addresses.ready.insert(addr);
            } else {
                listing.addresses.not_ready.insert(addr);
            }
        }
    }
    listing.bounded(listed, "endpoints")
}

/// The activators in a revision's public endpoints, as the subsetting sees them: every ready
/// IP and this activator's (`pod_ip`). `None` when this activator is not among them (it is not
/// in the revision's path, or the revision is served directly): upstream then keeps what it had.
pub fn public_activators(addresses: &Addresses, pod_ip: Option<IpAddr>) -> Option<Activators> {
    let me = pod_ip?;
    let all: Vec<IpAddr> = addresses
        .ready
        .iter()
        .map(SocketAddr::ip)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    all.contains(&me)
        .then_some(Activators { me: Some(me), all })
}

/// A private Service's cluster address: its ClusterIP at its port named `http` or `http2`.
pub fn service_address(service: &Service) -> Option<SocketAddr> {
    let spec = service.spec.as_ref()?;
    let ip: IpAddr = spec.cluster_ip.as_deref()?.parse().ok()?;
    let port = spec
        .ports
        .iter()
        .flatten()
        .find(|port| is_serving_port(port.name.as_deref()))?;
    Some(SocketAddr::new(ip, port_number(i64::from(port.port))?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn revision(spec: Value) -> Value {
        json!({
            "apiVersion": "serving.knative.dev/v1",
            "kind": "Revision",
            "metadata": {
                "namespace": "default",
                "name": "hello-00001",
                "labels": {
                    "serving.knative.dev/service": "hello",
                    "serving.knative.dev/configuration": "hello-config",
                },
            },
            "spec": spec,
        })
    }

    #[test]
    fn a_revision_gives_its_concurrency_timeouts_protocol_policy_and_labels() {
        let spec = revision_spec(&revision(json!({
            "containerConcurrency": 4,
            "timeoutSeconds": 30,
            "responseStartTimeoutSeconds": 10,
            "containers": [{"image": "x", "ports": [{"name": "h2c", "containerPort": 8080}]}],
        })))
        .unwrap();
        assert_eq!(spec.key.as_str(), "default/hello-00001");
        assert_eq!(spec.labels.service, "hello");
        assert_eq!(spec.labels.configuration, "hello-config");
        assert_eq!(spec.container_concurrency, 4);
        assert_eq!(spec.timeouts.total, Duration::from_secs(30));
        assert_eq!(spec.timeouts.response_start, Some(Duration::from_secs(10)));
        assert_eq!(spec.timeouts.idle, None);
        assert_eq!(spec.protocol, Protocol::H2c);
        assert_eq!(spec.serving_port, 8013);
        assert_eq!(
            spec.lb_policy,
            LbPolicy::RoundRobin,
            "CC 4: upstream's default"
        );
    }

    #[test]
    fn the_priority_annotation_sets_the_policy_and_a_bad_one_refuses_the_revision() {
        let with = |value: Option<&str>| {
            let mut object = revision(json!({}));
            if let Some(value) = value {
                object["metadata"]["annotations"] = json!({PRIORITY_ANNOTATION: value});
            }
            revision_spec(&object).map(|spec| spec.priority.map(|policy| *policy))
        };
        assert_eq!(with(None), Ok(None), "off without the annotation");
        assert_eq!(with(Some("off")), Ok(None));
        assert_eq!(with(Some("on")), Ok(Some(PriorityPolicy::default())));
        assert_eq!(with(Some("")), Ok(Some(PriorityPolicy::default())));
        assert_eq!(
            with(Some("bands=5, tenant_header=X-Org")),
            Ok(Some(PriorityPolicy {
                bands: 5,
                default_band: 2,
                tenant_header: "X-Org".into(),
                ..PriorityPolicy::default()
            }))
        );
        assert_eq!(
            with(Some(
                "priority_header_trusted=true, tenant_band.premium=2, tenant_band.batch=0"
            )),
            Ok(Some(PriorityPolicy {
                trusted: true,
                tenant_bands: vec![("premium".into(), 2), ("batch".into(), 0)],
                ..PriorityPolicy::default()
            }))
        );
        assert_eq!(
            with(Some("bands=2,default_band=0,priority_header=X-P")),
            Ok(Some(PriorityPolicy {
                bands: 2,
                default_band: 0,
                priority_header: "X-P".into(),
                ..PriorityPolicy::default()
            }))
        );
        // (value, words the refusal must have)
        for (value, words) in [
            ("bands=0", "bands is 0"),
            ("bands=17", "bands is 17"),
            ("bands=300", "bands is not a small count"),
            ("bands=3,default_band=3", "default_band is 3"),
            ("priority_header=a b", "priority_header"),
            ("tenant=X", "unknown key"),
            ("priority_header_trusted=yes", "not true or false"),
            (
                "tenant_band.premium=3",
                "tenant_bands gives \"premium\" band 3",
            ),
            ("bands", "not key=value"),
            ("yes", "not key=value"),
        ] {
            let refused = with(Some(value)).unwrap_err();
            assert!(refused.contains(PRIORITY_ANNOTATION), "{value}: {refused}");
            assert!(refused.contains(words), "{value}: {refused}");
        }
    }

    #[test]
    fn missing_fields_take_upstreams_defaults_and_bad_ones_say_which() {
        let spec = revision_spec(&revision(json!({}))).unwrap();
        assert_eq!(spec.container_concurrency, 0);
        assert_eq!(spec.timeouts, Timeouts::default());
        assert_eq!(spec.protocol, Protocol::Http1);
        assert_eq!(spec.lb_policy, LbPolicy::RandomChoice2);
        let by_annotation = {
            let mut object = revision(json!({"containerConcurrency": 1}));
            object["metadata"]["annotations"] = json!({LB_POLICY_ANNOTATION: "least-connections"});
            revision_spec(&object).unwrap()
        };
        assert_eq!(by_annotation.lb_policy, LbPolicy::LeastConnections);
        let error = revision_spec(&revision(json!({"containerConcurrency": "lots"}))).unwrap_err();
        assert!(error.contains("spec.containerConcurrency"), "{error}");
        let error = revision_spec(&revision(json!({"loadBalancingPolicy": "random"}))).unwrap_err();
        assert!(error.contains("random"), "{error}");
        assert!(revision_spec(&json!({"metadata": {"name": "x"}})).is_err());
    }

    /// Values at the edge of their type: each row is one field's value and what comes of it.
    #[test]
    fn revision_values_out_of_bounds_refuse_the_revision_naming_the_field() {
        let huge = "x".repeat(1 << 20);
        for (field, value, refused_naming) in [
            (
                "timeoutSeconds",
                json!(u64::MAX),
                Some("spec.timeoutSeconds"),
            ),
            (
                "timeoutSeconds",
                json!(MAX_TIMEOUT_SECONDS + 1),
                Some("spec.timeoutSeconds"),
            ),
            ("timeoutSeconds", json!(MAX_TIMEOUT_SECONDS), None),
            ("timeoutSeconds", json!(-1), Some("spec.timeoutSeconds")),
            (
                "timeoutSeconds",
                json!(i64::MIN),
                Some("spec.timeoutSeconds"),
            ),
            ("timeoutSeconds", json!(1.5), Some("spec.timeoutSeconds")),
            ("timeoutSeconds", json!(0), None),
            ("timeoutSeconds", json!(huge), Some("spec.timeoutSeconds")),
            (
                "responseStartTimeoutSeconds",
                json!(u64::MAX),
                Some("spec.responseStartTimeoutSeconds"),
            ),
            (
                "responseStartTimeoutSeconds",
                json!(MAX_TIMEOUT_SECONDS),
                None,
            ),
            (
                "idleTimeoutSeconds",
                json!(u64::MAX),
                Some("spec.idleTimeoutSeconds"),
            ),
            (
                "idleTimeoutSeconds",
                json!(-5),
                Some("spec.idleTimeoutSeconds"),
            ),
            ("idleTimeoutSeconds", json!(MAX_TIMEOUT_SECONDS), None),
            (
                "containerConcurrency",
                json!(u64::MAX),
                Some("spec.containerConcurrency"),
            ),
            (
                "containerConcurrency",
                json!(u64::from(u32::MAX) + 1),
                Some("spec.containerConcurrency"),
            ),
            ("containerConcurrency", json!(u32::MAX), None),
            (
                "containerConcurrency",
                json!(-1),
                Some("spec.containerConcurrency"),
            ),
            (
                "loadBalancingPolicy",
                json!(huge),
                Some("load-balancing policy"),
            ),
        ] {
            let result = revision_spec(&revision(json!({ field: value })));
            match refused_naming {
                None => assert!(result.is_ok(), "{field} = {value:.40}: {result:?}"),
                Some(naming) => {
                    let error = result.expect_err(field);
                    assert!(error.contains(naming), "{field}: {error}");
                    assert!(error.len() < 300, "the error quotes a cut value: {error}");
                }
            }
        }
        // The largest accepted timeouts are what the spec carries.
        let spec = revision_spec(&revision(json!({
            "timeoutSeconds": MAX_TIMEOUT_SECONDS,
            "idleTimeoutSeconds": MAX_TIMEOUT_SECONDS,
        })))
        .unwrap();
        assert_eq!(
            spec.timeouts.total,
            Duration::from_secs(MAX_TIMEOUT_SECONDS)
        );
        assert_eq!(
            spec.timeouts.idle,
            Some(Duration::from_secs(MAX_TIMEOUT_SECONDS))
        );
    }

    #[test]
    fn an_endpoints_port_out_of_range_leaves_its_subset_unused_and_says_which_field() {
        for (port, used) in [
            (0, false),
            (-1, false),
            (i32::MIN, false),
            (65_536, false),
            (i32::MAX, false),
            (1, true),
            (65_535, true),
        ] {
            let endpoints: Endpoints = serde_json::from_value(json!({
                "metadata": {"name": "x-private", "namespace": "default"},
                "subsets": [
                    {"addresses": [{"ip": "10.0.0.1"}], "ports": [{"name": "http", "port": port}]},
                    {"addresses": [{"ip": "10.0.0.2"}], "ports": [{"name": "http", "port": 8012}]},
                ],
            }))
            .unwrap();
            let listing = endpoints_addresses(&endpoints);
            let ready: Vec<String> = listing
                .addresses
                .ready
                .iter()
                .map(ToString::to_string)
                .collect();
            if used {
                assert_eq!(
                    ready,
                    [format!("10.0.0.1:{port}"), "10.0.0.2:8012".to_string()]
                );
                assert!(listing.problems.is_empty(), "{:?}", listing.problems);
            } else {
                assert_eq!(
                    ready,
                    ["10.0.0.2:8012"],
                    "port {port}: the other subset still counts"
                );
                assert_eq!(listing.problems.len(), 1, "{:?}", listing.problems);
                assert!(
                    listing.problems[0].contains("subsets[0].ports[0].port"),
                    "{:?}",
                    listing.problems
                );
            }
        }
    }

    #[test]
    fn a_slice_port_out_of_range_or_an_address_that_is_no_ip_is_reported() {
        for port in [
            json!(0),
            json!(-1),
            json!(65_536),
            json!(u64::MAX),
            json!(null),
            json!("http"),
        ] {
            let listing = slice_addresses(&json!({
                "ports": [{"name": "http", "port": port}],
                "endpoints": [{"addresses": ["10.0.0.1"]}],
            }));
            assert_eq!(listing.addresses, Addresses::default(), "{port}");
            assert!(
                listing.problems[0].contains("ports[0].port"),
                "{:?}",
                listing.problems
            );
        }
        let huge = "1".repeat(1 << 20);
        let listing = slice_addresses(&json!({
            "ports": [{"name": "http", "port": 8012}],
            "endpoints": [{"addresses": ["10.0.0.1", huge, 7]}],
        }));
        assert_eq!(listing.addresses.ready.len(), 1);
        assert_eq!(listing.problems.len(), 2, "{:?}", listing.problems);
        assert!(listing.problems[0].contains("endpoints[0].addresses[1]"));
        assert!(
            listing.problems[0].len() < 300,
            "cut: {}",
            listing.problems[0]
        );
        // Many bad addresses: a few problems are listed, not one per address.
        let many: Vec<Value> = (0..10_000).map(|n| json!(format!("bad-{n}"))).collect();
        let listing = slice_addresses(&json!({
            "ports": [{"name": "http", "port": 8012}],
            "endpoints": [{"addresses": many}],
        }));
        assert_eq!(listing.problems.len(), PROBLEMS_MAX + 1);
    }

    #[test]
    fn an_object_listing_more_addresses_than_the_bound_is_not_used() {
        let ips = |count: usize| -> Vec<Value> {
            (0..count)
                .map(|n| json!(format!("10.{}.{}.{}", n >> 16, (n >> 8) & 255, n & 255)))
                .collect()
        };
        let slice = |count: usize| {
            json!({
                "ports": [{"name": "http", "port": 8012}],
                "endpoints": [{"addresses": ips(count)}],
            })
        };
        let at_bound = slice_addresses(&slice(MAX_ADDRESSES_PER_OBJECT));
        assert_eq!(at_bound.addresses.ready.len(), MAX_ADDRESSES_PER_OBJECT);
        assert!(at_bound.problems.is_empty());
        let over = slice_addresses(&slice(MAX_ADDRESSES_PER_OBJECT + 1));
        assert_eq!(over.addresses, Addresses::default());
        assert!(
            over.problems[0].contains("65537 addresses"),
            "{:?}",
            over.problems
        );
        let endpoints: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "x-private", "namespace": "default"},
            "subsets": [{
                "addresses": ips(MAX_ADDRESSES_PER_OBJECT).into_iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
                "notReadyAddresses": [{"ip": "10.255.0.1"}],
                "ports": [{"name": "http", "port": 8012}],
            }],
        }))
        .unwrap();
        let over = endpoints_addresses(&endpoints);
        assert_eq!(over.addresses, Addresses::default());
        assert!(over.problems[0].contains("subsets"), "{:?}", over.problems);
    }

    #[test]
    fn endpoints_take_the_port_named_http_or_http2_and_split_ready_from_not_ready() {
        let endpoints: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "hello-00001-private", "namespace": "default"},
            "subsets": [
                {
                    "addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}],
                    "notReadyAddresses": [{"ip": "10.0.0.3"}],
                    "ports": [{"name": "http-autometric", "port": 9090}, {"name": "http", "port": 8012}],
                },
                {"addresses": [{"ip": "10.0.0.9"}], "ports": [{"name": "https", "port": 8112}]},
            ],
        }))
        .unwrap();
        let listing = endpoints_addresses(&endpoints);
        assert_eq!(listing.problems, Vec::<String>::new());
        let addresses = listing.addresses;
        let ready: Vec<String> = addresses.ready.iter().map(ToString::to_string).collect();
        assert_eq!(ready, ["10.0.0.1:8012", "10.0.0.2:8012"]);
        let not_ready: Vec<String> = addresses
            .not_ready
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(not_ready, ["10.0.0.3:8012"]);
    }

    #[test]
    fn endpoint_slices_of_either_version_read_alike() {
        let v1 = json!({
            "apiVersion": "discovery.k8s.io/v1",
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "nodeName": "n"},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false}},
                {"addresses": ["10.0.0.3"]},
            ],
            "ports": [{"name": "http2", "port": 8013}],
        });
        let mut v1beta1 = v1.clone();
        v1beta1["apiVersion"] = json!("discovery.k8s.io/v1beta1");
        v1beta1["endpoints"][0]["topology"] = json!({"kubernetes.io/hostname": "n"});
        for slice in [v1, v1beta1] {
            let addresses = slice_addresses(&slice).addresses;
            let ready: Vec<String> = addresses.ready.iter().map(ToString::to_string).collect();
            assert_eq!(
                ready,
                ["10.0.0.1:8013", "10.0.0.3:8013"],
                "nil ready means ready"
            );
            assert_eq!(addresses.not_ready.len(), 1);
        }
        assert_eq!(
            slice_addresses(&json!({"ports": [{"name": "https", "port": 1}]})),
            Listing::default()
        );
        assert_eq!(slice_addresses(&json!(null)), Listing::default());
    }

    #[test]
    fn this_activator_subsets_only_when_it_is_in_the_public_endpoints() {
        let mut addresses = Addresses::default();
        for ip in ["10.1.0.2", "10.1.0.1"] {
            addresses
                .ready
                .insert(SocketAddr::new(ip.parse().unwrap(), 8012));
        }
        let me: IpAddr = "10.1.0.2".parse().unwrap();
        let activators = public_activators(&addresses, Some(me)).unwrap();
        assert_eq!(activators.me, Some(me));
        assert_eq!(activators.all.len(), 2);
        assert_eq!(
            public_activators(&addresses, Some("10.9.9.9".parse().unwrap())),
            None
        );
        assert_eq!(public_activators(&addresses, None), None);
    }

    #[test]
    fn exec_readiness_or_a_startup_probe_turns_the_probe_optimisation_off() {
        let with =
            |containers: Value| probe_optimisation(&json!({"spec": {"containers": containers}}));
        assert!(with(json!([{"ports": [{"containerPort": 8080}]}])));
        assert!(
            probe_optimisation(&json!({})),
            "no containers: nothing says otherwise"
        );
        assert!(!with(
            json!([{"readinessProbe": {"exec": {"command": ["true"]}}}])
        ));
        assert!(with(
            json!([{"readinessProbe": {"httpGet": {"port": 8080}}}])
        ));
        // With a sidecar, the user container is the one with ports; any startup probe counts.
        assert!(!with(json!([
            {"name": "sidecar", "readinessProbe": {"exec": {"command": ["true"]}}, "startupProbe": {}},
            {"name": "user", "ports": [{"containerPort": 8080}]},
        ])));
        assert!(with(json!([
            {"name": "sidecar", "readinessProbe": {"exec": {"command": ["true"]}}},
            {"name": "user", "ports": [{"containerPort": 8080}]},
        ])));
        assert!(!with(json!([
            {"name": "user", "ports": [{"containerPort": 8080}], "readinessProbe": {"exec": {}}},
            {"name": "sidecar"},
        ])));
    }

    #[test]
    fn owners_come_from_the_labels() {
        let meta: ObjectMeta = serde_json::from_value(json!({
            "namespace": "default",
            "name": "hello-00001-private",
            "labels": {SERVICE_TYPE_LABEL: "Private", REVISION_LABEL: "hello-00001"},
        }))
        .unwrap();
        let (key, kind) = owner(&meta).unwrap();
        assert_eq!(
            (key.as_str(), kind),
            ("default/hello-00001", ServiceType::Private)
        );
        let unlabelled: ObjectMeta =
            serde_json::from_value(json!({"namespace": "default", "name": "x"})).unwrap();
        assert_eq!(owner(&unlabelled), None);
    }

    #[test]
    fn a_private_service_gives_its_cluster_ip_at_the_http_port() {
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": "hello-00001-private", "namespace": "default"},
            "spec": {"clusterIP": "10.96.3.4", "ports": [
                {"name": "https", "port": 443}, {"name": "http", "port": 80, "targetPort": 8012}
            ]},
        }))
        .unwrap();
        assert_eq!(
            service_address(&service),
            Some("10.96.3.4:80".parse().unwrap())
        );
        let headless: Service = serde_json::from_value(json!({
            "metadata": {"name": "x"}, "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80}]},
        }))
        .unwrap();
        assert_eq!(service_address(&headless), None);
    }
}
