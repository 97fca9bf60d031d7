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
        tls: None,
        rules: None,
        cold_start: Default::default(),
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
    slice_addresses_where(slice, is_http_port)
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
    slice_addresses_where(slice, is_serving_port)
}

/// An EndpointSlice's addresses at its first port whose name `accept`s (an unnamed port's name
/// is `None`).
pub fn slice_addresses_where(slice: &Value, accept: impl Fn(Option<&str>) -> bool) -> Listing {
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
mod tests;
