//! What KEDA's HTTP add-on role sees of the cluster, as state-worker ops (issue 40): each
//! HTTPScaledObject or InterceptorRoute a revision of its own, named by the object's namespace
//! and name (an InterceptorRoute's over an HTTPScaledObject's, as the add-on's routing table
//! has it), routed by its rules; its pods the ready endpoints of its target Service's
//! EndpointSlices at the Service port it names. Sans-IO: the informers hand it objects as JSON, it answers the
//! ops that bring the state worker to its view, only for what changed. Each event marks the
//! routes built from what it changed, and only those are built again: an event costs the
//! routes it touches, not every route of the cluster.
//!
//! Requests go straight to the pods (the add-on 0.16's direct pod routing, its chart's
//! default): that is what lets a per-pod concurrency limit be kept. A Service port with
//! `appProtocol: kubernetes.io/h2c` is spoken to in h2c, as the add-on does.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kactivator_api::RevisionKey;
use kactivator_shards::routing::{
    ColdStart, LbPolicy, Protocol, RevisionLabels, RouteRules, Timeouts, DEFAULT_QUEUE_DEPTH,
    MAX_TIMEOUT_SECONDS,
};
use serde_json::Value;

use super::counts::RouteId;
use super::object::{
    ObjectError, ObjectKind, Overflow, PlaceholderSource, PlaceholderSpec, PortRef, RateWindow,
    RouteObject, ServiceRef, DEFAULT_FAILOVER_TIMEOUT, RESPONSE_BODY_LABEL,
};
use super::scaler::Scaling;
use super::tls::UpstreamSetting;
pub use crate::sources::kubernetes::objects::SLICE_SERVICE_LABEL;
use crate::sources::kubernetes::objects::{slice_addresses_where, Listing};
use crate::state::{OmissionScope, Op, RevisionSpec};
use crate::tls::PodTls;
use kactivator_shards::routing::placeholder::{
    ConfigMapData, Placeholder, PlaceholderBody, StaticRoute,
};

#[cfg(test)]
mod tests;

/// What a route's failover is named as a revision of its own: the object's name and this,
/// which no Kubernetes name can end with, so it never meets an object's.
pub const FAILOVER_SUFFIX: &str = ":failover";

/// The `appProtocol` that makes the add-on speak h2c to a Service's port.
pub const H2C_APP_PROTOCOL: &str = "kubernetes.io/h2c";

/// The add-on's process-wide timeouts (its interceptor's environment), which an object's own
/// override.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// `KEDA_HTTP_REQUEST_TIMEOUT`; `None` (the add-on's 0): no bound on the whole request.
    pub request: Option<Duration>,
    /// `KEDA_HTTP_RESPONSE_HEADER_TIMEOUT`: until the response's head.
    pub response_header: Duration,
    /// `KEDA_HTTP_READINESS_TIMEOUT`: the longest wait for a route's first ready endpoint;
    /// `None` (the add-on's 0): the request's own deadline.
    pub readiness: Option<Duration>,
    /// `KEDA_HTTP_COLD_START_MAX_PENDING_REQUESTS` (0.16): the most requests held for a route
    /// on this replica when its object sets none; `None` (the add-on's 0, unlimited): the
    /// route's queue bound, [`DEFAULT_QUEUE_DEPTH`] (★ never unbounded).
    pub max_pending: Option<u32>,
}

/// The add-on's response-header timeout when its environment sets none (0.14 and later).
pub const DEFAULT_RESPONSE_HEADER_TIMEOUT: Duration = Duration::from_secs(300);

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            request: None,
            response_header: DEFAULT_RESPONSE_HEADER_TIMEOUT,
            readiness: None,
            max_pending: None,
        }
    }
}

/// One Service port, as routing needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ServicePort {
    name: String,
    port: u16,
    app_protocol: Option<String>,
}

/// The kinds of object the model keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Object(ObjectKind),
    Service,
    Slice,
    ConfigMap,
}

/// What the external scaler answers from: what each object scales on (a trigger names one by
/// kind and name), and the routes counted, each with the rate window of the object that routes
/// it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScalerView {
    pub objects: BTreeMap<(ObjectKind, String, String), Scaling>,
    pub windows: BTreeMap<RouteId, Option<RateWindow>>,
}

/// The source's view, and what it last sent the state worker.
#[derive(Default)]
pub struct Model {
    defaults: Defaults,
    /// Every HTTPScaledObject and InterceptorRoute by kind, namespace and name: read, or why it
    /// could not be.
    objects: BTreeMap<(ObjectKind, String, String), Result<RouteObject, ObjectError>>,
    /// Services by namespace and name: their ports.
    services: BTreeMap<(String, String), Vec<ServicePort>>,
    /// EndpointSlices by namespace and the Service each names, then by the slice's name: what
    /// routing reads of each ([`trimmed_slice`]).
    slices: BTreeMap<(String, String), BTreeMap<String, Value>>,
    /// The Service each EndpointSlice names, by the slice's namespace and name.
    slice_services: BTreeMap<(String, String), String>,
    /// ConfigMaps labelled [`RESPONSE_BODY_LABEL`] `"true"` by namespace and name: their data,
    /// shared by every placeholder and static response that names it.
    config_maps: BTreeMap<(String, String), ConfigMapData>,
    /// Per revision, the spec and the ready pods last sent.
    sent: BTreeMap<RevisionKey, Sent>,
    /// The routes (by namespace and name) that something they are built from changed since
    /// the last [`Model::ops`]: only those are built again.
    dirty: BTreeSet<(String, String)>,
    /// Per route, why it routes nothing or less than it should, as last built.
    refusals: BTreeMap<(String, String), Vec<Refusal>>,
    /// An object changed since the last [`Model::changed_scaler_view`].
    scaling_changed: bool,
    /// How requests that came in over TLS reach pods; `None`: no TLS port.
    tls: Option<Arc<UpstreamSetting>>,
}

/// A revision's spec and ready pods, as sent to the state worker.
type Sent = (RevisionSpec, Vec<SocketAddr>);

/// What routing reads of an EndpointSlice: its ports' names and numbers and its endpoints'
/// addresses and readiness, at the same indices (a problem names them); the rest (metadata,
/// topology, hints, target references) is dropped, and a change to it changes nothing.
fn trimmed_slice(slice: &Value) -> Value {
    let each = |field: &str, keep: fn(&Value) -> Value| match slice[field].as_array() {
        Some(items) => Value::Array(items.iter().map(keep).collect()),
        None => Value::Null,
    };
    serde_json::json!({
        "ports": each("ports", |port| serde_json::json!({
            "name": port["name"],
            "port": port["port"],
        })),
        "endpoints": each("endpoints", |endpoint| serde_json::json!({
            "addresses": endpoint["addresses"],
            "conditions": {"ready": endpoint["conditions"]["ready"]},
        })),
    })
}

/// Why an object routes nothing, for the log: its name and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub object: String,
    pub reason: String,
}

impl Model {
    pub fn new(defaults: Defaults) -> Model {
        Model {
            defaults,
            ..Model::default()
        }
    }

    /// Requests that came in over the TLS port reach every route's pods as `tls` says.
    pub fn with_tls(self, tls: Option<Arc<UpstreamSetting>>) -> Model {
        Model { tls, ..self }
    }

    /// An HTTPScaledObject or InterceptorRoute added or changed (`Some`, as the API serves it)
    /// or deleted.
    pub fn object(
        &mut self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
        object: Option<&Value>,
    ) {
        let id = (kind, namespace.to_owned(), name.to_owned());
        let read = object.map(|object| RouteObject::from_json(kind, object));
        if self.objects.get(&id) == read.as_ref() {
            return;
        }
        match read {
            Some(read) => {
                self.objects.insert(id, read);
            }
            None => {
                self.objects.remove(&id);
            }
        }
        self.dirty.insert((namespace.to_owned(), name.to_owned()));
        self.scaling_changed = true;
    }

    /// Marks the routes of `namespace` that `uses` says are built from what changed.
    fn routes_using(&mut self, namespace: &str, uses: impl Fn(&RouteObject) -> bool) {
        let using = self.objects.iter().filter_map(|((_, of, name), object)| {
            let object = object.as_ref().ok()?;
            (of == namespace && uses(object)).then(|| (of.clone(), name.clone()))
        });
        self.dirty.extend(using);
    }

    /// Marks the routes to Service `namespace/service` (as their target or failover).
    fn routes_to(&mut self, namespace: &str, service: &str) {
        self.routes_using(namespace, |object| {
            object.target.service == service
                || object
                    .failover
                    .as_ref()
                    .is_some_and(|failover| failover.to.service == service)
        });
    }

    /// A Service added, changed or deleted.
    pub fn service(&mut self, namespace: &str, name: &str, service: Option<&Value>) {
        let id = (namespace.to_owned(), name.to_owned());
        match service {
            Some(service) => {
                let ports = service["spec"]["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|port| {
                        Some(ServicePort {
                            name: port["name"].as_str().unwrap_or_default().to_owned(),
                            port: u16::try_from(port["port"].as_i64()?).ok()?,
                            app_protocol: port["appProtocol"].as_str().map(str::to_owned),
                        })
                    })
                    .collect::<Vec<_>>();
                if self.services.get(&id) == Some(&ports) {
                    return;
                }
                self.services.insert(id, ports);
            }
            None => {
                if self.services.remove(&id).is_none() {
                    return;
                }
            }
        }
        self.routes_to(namespace, name);
    }

    /// An EndpointSlice added, changed or deleted. One that names no Service is not kept.
    pub fn slice(&mut self, namespace: &str, name: &str, slice: Option<&Value>) {
        let id = (namespace.to_owned(), name.to_owned());
        let read = slice.and_then(|slice| {
            let service = slice["metadata"]["labels"][SLICE_SERVICE_LABEL].as_str()?;
            Some((service.to_owned(), trimmed_slice(slice)))
        });
        let before = self.slice_services.get(&id).cloned();
        if let (Some(before), Some((service, trimmed))) = (&before, &read) {
            let kept = self
                .slices
                .get(&(namespace.to_owned(), before.clone()))
                .and_then(|slices| slices.get(name));
            if before == service && kept == Some(trimmed) {
                return;
            }
        }
        if let Some(before) = before {
            self.slice_services.remove(&id);
            let of_service = (namespace.to_owned(), before);
            if let Some(slices) = self.slices.get_mut(&of_service) {
                slices.remove(name);
                if slices.is_empty() {
                    self.slices.remove(&of_service);
                }
            }
            self.routes_to(namespace, &of_service.1);
        }
        if let Some((service, trimmed)) = read {
            self.slice_services.insert(id, service.clone());
            self.slices
                .entry((namespace.to_owned(), service.clone()))
                .or_default()
                .insert(name.to_owned(), trimmed);
            self.routes_to(namespace, &service);
        }
    }

    /// A ConfigMap added, changed or deleted: kept while it carries [`RESPONSE_BODY_LABEL`]
    /// `"true"` (the add-on reads no other).
    pub fn config_map(&mut self, namespace: &str, name: &str, config_map: Option<&Value>) {
        let id = (namespace.to_owned(), name.to_owned());
        let labelled = config_map.filter(|config_map| {
            config_map["metadata"]["labels"][RESPONSE_BODY_LABEL].as_str() == Some("true")
        });
        match labelled {
            Some(config_map) => {
                let data = config_map["data"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(key, value)| {
                        Some((key.clone(), value.as_str()?.as_bytes().to_vec()))
                    })
                    .collect::<BTreeMap<_, _>>();
                if self.config_maps.get(&id).is_some_and(|kept| **kept == data) {
                    return;
                }
                self.config_maps.insert(id, Arc::new(data));
            }
            None => {
                if self.config_maps.remove(&id).is_none() {
                    return;
                }
            }
        }
        let names = |spec: &PlaceholderSpec| matches!(&spec.body, PlaceholderSource::ConfigMap { name: of, .. } if of == name);
        self.routes_using(namespace, |object| {
            object.placeholder.as_ref().is_some_and(names)
                || object
                    .static_routes
                    .iter()
                    .any(|route| names(&route.response))
        });
    }

    /// The namespace and name of every object of `kind` the model has.
    pub fn ids(&self, kind: Kind) -> Vec<(String, String)> {
        match kind {
            Kind::Object(kind) => self
                .objects
                .keys()
                .filter(|(of, _, _)| *of == kind)
                .map(|(_, namespace, name)| (namespace.clone(), name.clone()))
                .collect(),
            Kind::Service => self.services.keys().cloned().collect(),
            Kind::Slice => self.slice_services.keys().cloned().collect(),
            Kind::ConfigMap => self.config_maps.keys().cloned().collect(),
        }
    }

    /// How many objects route, and how many are refused or shadowed.
    pub fn counts(&self) -> (usize, usize) {
        let routed = self.routing().count();
        (routed, self.objects.len() - routed)
    }

    /// The objects that route: by namespace and name, an InterceptorRoute if there is one (the
    /// add-on's precedence, even when it is refused), else the HTTPScaledObject.
    fn routing(&self) -> impl Iterator<Item = &RouteObject> {
        self.objects
            .iter()
            .filter_map(|((kind, namespace, name), object)| {
                let shadowed = *kind == ObjectKind::HttpScaledObject
                    && self.objects.contains_key(&(
                        ObjectKind::InterceptorRoute,
                        namespace.clone(),
                        name.clone(),
                    ));
                object.as_ref().ok().filter(|_| !shadowed)
            })
    }

    /// What the external scaler answers from.
    pub fn scaler_view(&self) -> ScalerView {
        ScalerView {
            objects: self
                .objects
                .iter()
                .filter_map(|(id, object)| Some((id.clone(), object.as_ref().ok()?.scaling)))
                .collect(),
            windows: self
                .routing()
                .map(|object| ((object.namespace.clone(), object.name.clone()), object.rate))
                .collect(),
        }
    }

    /// [`Model::scaler_view`] when an object changed since it was last asked.
    pub fn changed_scaler_view(&mut self) -> Option<ScalerView> {
        std::mem::take(&mut self.scaling_changed).then(|| self.scaler_view())
    }

    /// The ops that bring the state worker from what it was last sent to the current view, and
    /// what is newly wrong: the objects that route nothing, or less than they should, and why,
    /// each said once while it stays so ([`Model::refusals`] has them all). Only the routes
    /// that something they are built from changed since the last call are built again.
    pub fn ops(&mut self) -> (Vec<Op>, Vec<Refusal>) {
        let mut removed = Vec::new();
        let mut changed = Vec::new();
        let mut said = Vec::new();
        for route in std::mem::take(&mut self.dirty) {
            let (wanted, refusals) = self.build(&route.0, &route.1);
            let before = [route.1.clone(), format!("{}{FAILOVER_SUFFIX}", route.1)]
                .into_iter()
                .filter_map(|name| RevisionKey::new(&route.0, &name).ok());
            for key in before {
                if !wanted.iter().any(|(wanted, _)| *wanted == key)
                    && self.sent.remove(&key).is_some()
                {
                    removed.push(Op::RemoveRevision { revision: key });
                }
            }
            for (key, (spec, ready)) in wanted {
                let before = self.sent.get(&key);
                if before.is_none_or(|(sent, _)| *sent != spec) {
                    changed.push(Op::UpsertRevision(spec.clone()));
                }
                if before.is_none_or(|(_, sent)| *sent != ready) {
                    changed.push(Op::SetEndpoints {
                        revision: key.clone(),
                        ready: ready.clone(),
                        scope: OmissionScope::AllPods,
                    });
                }
                self.sent.insert(key, (spec, ready));
            }
            let known = self.refusals.remove(&route).unwrap_or_default();
            said.extend(
                refusals
                    .iter()
                    .filter(|refusal| !known.contains(refusal))
                    .cloned(),
            );
            if !refusals.is_empty() {
                self.refusals.insert(route, refusals);
            }
        }
        removed.extend(changed);
        (removed, said)
    }

    /// Every object that routes nothing, or less than it should, and why.
    pub fn refusals(&self) -> impl Iterator<Item = &Refusal> {
        self.refusals.values().flatten()
    }

    /// The revisions of the route `namespace/name` (its own, and its failover's) with their
    /// ready pods, from whichever object routes it (an InterceptorRoute over an
    /// HTTPScaledObject), and what keeps it from routing as declared.
    fn build(&self, namespace: &str, name: &str) -> (Vec<(RevisionKey, Sent)>, Vec<Refusal>) {
        let mut wanted = Vec::new();
        let mut refusals = Vec::new();
        let of = |kind: ObjectKind| {
            self.objects
                .get(&(kind, namespace.to_owned(), name.to_owned()))
                .map(|object| (kind, object))
        };
        let route = of(ObjectKind::InterceptorRoute);
        let shadowed = route
            .is_some()
            .then(|| of(ObjectKind::HttpScaledObject))
            .flatten();
        let Some((kind, object)) = route.or_else(|| of(ObjectKind::HttpScaledObject)) else {
            return (wanted, refusals);
        };
        let refuse = |kind: ObjectKind, reason: String| Refusal {
            object: format!("{} {namespace}/{name}", kind.describe()),
            reason,
        };
        if shadowed.is_some() {
            refusals.push(refuse(
                ObjectKind::HttpScaledObject,
                "the InterceptorRoute of the same name routes instead (the add-on's \
                 precedence)"
                    .into(),
            ));
        }
        let object = match object {
            Ok(object) => object,
            Err(error) => {
                refusals.push(refuse(kind, error.to_string()));
                return (wanted, refusals);
            }
        };
        let Ok(key) = RevisionKey::new(namespace, name) else {
            refusals.push(refuse(kind, "not a valid name".into()));
            return (wanted, refusals);
        };
        let (mut spec, ready, problems) = self.route(key.clone(), object);
        refusals.extend(problems.into_iter().map(|problem| refuse(kind, problem)));
        // A failover with no readiness timeout waits 30 s (`endpoint_resolver.go` L16).
        let mut wait = object.readiness.or(self.defaults.readiness);
        if object.failover.is_some() && wait.is_none() {
            wait = Some(DEFAULT_FAILOVER_TIMEOUT);
        }
        let placeholder = object.placeholder.as_ref().map(|spec| {
            let (placeholder, missing) =
                self.placeholder(namespace, spec, "spec.coldStart.placeholder");
            if let Some(missing) = missing {
                refusals.push(refuse(kind, missing));
            }
            Arc::new(placeholder)
        });
        // The add-on 0.16's cold-start cap (#1733) is the route's queue bound; with an
        // explicit one and `overflow: Placeholder`, requests wait up to it and only those
        // turned away get the placeholder.
        spec.queue_depth = object
            .max_pending
            .or(self.defaults.max_pending)
            .unwrap_or(DEFAULT_QUEUE_DEPTH);
        let hold_before_placeholder = placeholder.is_some()
            && object.max_pending.is_some()
            && object.overflow == Overflow::Placeholder;
        let mut cold_start = ColdStart {
            wait,
            failover: None,
            placeholder,
            hold_before_placeholder,
        };
        if let Some(failover) = &object.failover {
            let failover_key = RevisionKey::new(namespace, &format!("{name}{FAILOVER_SUFFIX}"));
            if let Ok(failover_key) = failover_key {
                let (failover_spec, failover_ready, problems) =
                    self.service_route(failover_key.clone(), object, &failover.to);
                refusals.extend(
                    problems
                        .into_iter()
                        .map(|problem| refuse(kind, format!("failover: {problem}"))),
                );
                cold_start.failover = Some(failover_key.clone());
                wanted.push((failover_key, (failover_spec, failover_ready)));
            }
        }
        if cold_start != ColdStart::default() {
            spec.cold_start = Some(Box::new(cold_start));
        }
        wanted.push((key, (spec, ready)));
        wanted.sort_by(|(one, _), (other, _)| one.cmp(other));
        (wanted, refusals)
    }

    /// The shards' placeholder of a route in `namespace` (or one of its static routes'
    /// responses; `field` names which), its body the ConfigMap's data now; and, when that
    /// ConfigMap is missing, what the log says.
    fn placeholder(
        &self,
        namespace: &str,
        spec: &PlaceholderSpec,
        field: &str,
    ) -> (Placeholder, Option<String>) {
        let mut missing = None;
        let body = match &spec.body {
            PlaceholderSource::Inline(body) => PlaceholderBody::Inline(body.clone().into_bytes()),
            PlaceholderSource::ConfigMap { name, key } => {
                let data = self
                    .config_maps
                    .get(&(namespace.to_owned(), name.clone()))
                    .cloned();
                if data.is_none() {
                    missing = Some(format!(
                        "{field}: ConfigMap {namespace}/{name} with the label \
                         {RESPONSE_BODY_LABEL}=true not found: it answers 500"
                    ));
                }
                PlaceholderBody::ConfigMap {
                    name: format!("{namespace}/{name}"),
                    data,
                    key: key.clone(),
                }
            }
        };
        let placeholder = Placeholder {
            status: spec.status,
            fields: spec.fields.clone(),
            body,
        };
        (placeholder, missing)
    }

    /// One object's spec and ready pods, and what keeps it from having pods (for the log).
    fn route(
        &self,
        key: RevisionKey,
        object: &RouteObject,
    ) -> (RevisionSpec, Vec<SocketAddr>, Vec<String>) {
        let namespace = key.namespace().to_owned();
        let (mut spec, ready, mut problems) = self.service_route(key, object, &object.target);
        spec.container_concurrency = object.container_concurrency.unwrap_or(0);
        spec.priority = object.priority.clone();
        spec.lb_policy = LbPolicy::default_for(spec.container_concurrency);
        let statics = object
            .static_routes
            .iter()
            .enumerate()
            .map(|(index, route)| {
                let field = format!("spec.staticRoutes[{index}].response");
                let (response, missing) = self.placeholder(&namespace, &route.response, &field);
                problems.extend(missing);
                StaticRoute {
                    rules: route.rules.clone(),
                    response: Arc::new(response),
                    always: route.always,
                }
            })
            .collect();
        spec.rules = Some(Arc::new(RouteRules {
            order: object.order.clone(),
            rules: object.rules.clone(),
            statics,
        }));
        (spec, ready, problems)
    }

    /// A route to Service `to`'s pods, with the object's timeouts and no rules or limit: an
    /// object's failover as it is, its own route once [`Model::route`] adds those.
    fn service_route(
        &self,
        key: RevisionKey,
        object: &RouteObject,
        to: &ServiceRef,
    ) -> (RevisionSpec, Vec<SocketAddr>, Vec<String>) {
        let mut problems = Vec::new();
        let namespace = key.namespace().to_owned();
        let port = self.service_port(&namespace, &to.service, &to.port);
        let (protocol, ready, serving_port) = match port {
            Err(problem) => {
                problems.push(problem);
                (Protocol::Http1, Vec::new(), 0)
            }
            Ok(port) => {
                // The add-on's: every request goes to such a port in h2c, an HTTP/1.1
                // client's too (the role's `http1_in_h2c`), but an upgrade.
                let protocol = if port.app_protocol.as_deref() == Some(H2C_APP_PROTOCOL) {
                    Protocol::H2c
                } else {
                    Protocol::Http1
                };
                let listing = self.ready_endpoints(&namespace, &to.service, &port);
                for problem in listing.problems {
                    problems.push(format!(
                        "EndpointSlice of Service {}: {problem}",
                        to.service
                    ));
                }
                let ready: Vec<SocketAddr> = listing.addresses.ready.into_iter().collect();
                (protocol, ready, port.port)
            }
        };
        let tls = self.upstream_tls(&key, &namespace, &to.service, &mut problems);
        let response_header = object
            .response_header
            .or(Some(self.defaults.response_header));
        let spec = RevisionSpec {
            labels: RevisionLabels {
                namespace: namespace.clone(),
                revision: key.name().to_owned(),
                ..RevisionLabels::default()
            },
            key,
            container_concurrency: 0,
            protocol,
            timeouts: Timeouts {
                total: object
                    .request
                    .or(self.defaults.request)
                    .unwrap_or(Duration::from_secs(MAX_TIMEOUT_SECONDS)),
                response_start: response_header,
                idle: None,
            },
            lb_policy: LbPolicy::default_for(0),
            queue_depth: DEFAULT_QUEUE_DEPTH,
            priority: None,
            serving_port,
            cluster_ip: None,
            tls,
            rules: None,
            cold_start: None,
        };
        (spec, ready, problems)
    }

    /// The TLS a route to Service `service` reaches its pods with for requests that came in
    /// over TLS: `<service>.<namespace>` as the server name (the add-on's upstream URL's host).
    /// The one sent before is kept when nothing it is built from
    /// changed, so that an event does not build a client configuration per route.
    fn upstream_tls(
        &self,
        key: &RevisionKey,
        namespace: &str,
        service: &str,
        problems: &mut Vec<String>,
    ) -> Option<Box<PodTls>> {
        let setting = self.tls.as_ref()?;
        let server_name = format!("{service}.{namespace}");
        let profile = setting.profile();
        let sent = self
            .sent
            .get(key)
            .and_then(|(spec, _)| spec.tls.as_ref())
            .filter(|tls| tls.server_name == server_name && tls.profile == profile);
        if let Some(sent) = sent {
            return Some(sent.clone());
        }
        match PodTls::with_profile(&setting.trust, &server_name, profile) {
            Ok(tls) => Some(Box::new(tls)),
            Err(error) => {
                // Not reached with a Service's name (a DNS label) and settings checked at start.
                problems.push(format!(
                    "TLS to Service {service}: {error}; requests that came in over TLS go \
                     to its pods in plain TCP"
                ));
                None
            }
        }
    }

    /// The Service's port the object names, by number or name.
    fn service_port(
        &self,
        namespace: &str,
        service: &str,
        port: &PortRef,
    ) -> Result<ServicePort, String> {
        let ports = self
            .services
            .get(&(namespace.to_owned(), service.to_owned()))
            .ok_or_else(|| format!("Service {namespace}/{service} not found"))?;
        let found = ports.iter().find(|candidate| match port {
            PortRef::Number(number) => candidate.port == *number,
            PortRef::Name(name) => candidate.name == *name,
        });
        found.cloned().ok_or_else(|| match port {
            PortRef::Number(number) => {
                format!("Service {namespace}/{service} has no port {number}")
            }
            PortRef::Name(name) => {
                format!("Service {namespace}/{service} has no port named {name:?}")
            }
        })
    }

    /// The endpoints of `service`'s slices at the pods' side of `port` (the slice port of the
    /// same name), ready or not.
    fn ready_endpoints(&self, namespace: &str, service: &str, port: &ServicePort) -> Listing {
        let mut listing = Listing::default();
        let slices = self
            .slices
            .get(&(namespace.to_owned(), service.to_owned()))
            .into_iter()
            .flatten();
        for (_, slice) in slices {
            let part =
                slice_addresses_where(slice, |name| name.unwrap_or_default() == port.name.as_str());
            listing.addresses.merge(&part.addresses);
            listing.problems.extend(part.problems);
        }
        listing
    }

    /// The spec of every revision last sent.
    pub fn specs(&self) -> Vec<RevisionSpec> {
        self.sent.values().map(|(spec, _)| spec.clone()).collect()
    }

    /// Every revision this source declares, for a test's or a log's eyes.
    pub fn revisions(&self) -> BTreeSet<RevisionKey> {
        self.sent.keys().cloned().collect()
    }
}
