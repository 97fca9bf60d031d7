//! The KEDA HTTP add-on role's source (issue 40): watches on the control thread of the
//! HTTPScaledObjects (`http.keda.sh/v1alpha1`), the InterceptorRoutes (`http.keda.sh/v1beta1`,
//! when the server serves them: the add-on's 0.14 and later), the Services, the EndpointSlices
//! and the ConfigMaps labelled for placeholder bodies (in every namespace, or the one `KEDA_HTTP_WATCH_NAMESPACE` names, as the
//! add-on's interceptor), their objects through the [`Model`] into state-worker ops, as the
//! Knative source does. Whether InterceptorRoutes are served is asked at start and, while they
//! are not, again every [`ROUTES_CRD_CHECK_EVERY`]: a CRD installed later is watched from then
//! on, without a restart.
//!
//! Start-up: once every watch has listed, the first view goes to the worker as one batch, and
//! readiness is told once every shard serves it (the add-on's `/readyz` waits for its first
//! sync too). Until then a line every few seconds says which watches are still listing and why.
//! A watch that fails is retried with a short backoff while the shards keep serving the last
//! snapshot; a relist replaces what that watch had listed, each object going into the model as
//! it is listed (a large cluster's list is never held whole).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures_util::stream::{self, BoxStream, StreamExt};
use kactivator_shards::metrics::AllShardStats;
use kactivator_shards::runtime::readiness::Readiness;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use serde_json::Value;
use tokio::sync::watch;

use super::model::{Defaults, Model, ScalerView, SLICE_SERVICE_LABEL};
use super::object::{ObjectKind, RESPONSE_BODY_LABEL};
use super::tls::UpstreamSetting;
use crate::config::EndpointsKind;
use crate::publisher::{until_served, Publisher};
use crate::sources::kubernetes::backoff::WatchBackoff;
use crate::sources::kubernetes::informers::{
    resolve_endpoints, EndpointsApi, PROGRESS_EVERY, SERVED_WITHIN,
};
use crate::state::Op;
use crate::worker::WorkerHandle;

/// What the external scaler answers from, as the model last saw it.
pub type ScaledRoutes = Arc<ScalerView>;

/// The API group and version of InterceptorRoutes.
const INTERCEPTOR_ROUTES_VERSION: &str = "http.keda.sh/v1beta1";

/// How often a server that serves no InterceptorRoutes is asked again (one discovery GET each
/// time, only while they are not served).
pub const ROUTES_CRD_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether the server serves InterceptorRoutes (the add-on's CRD, 0.14 and later).
async fn serves_interceptor_routes(client: &Client) -> Result<bool, String> {
    match client
        .list_api_group_resources(INTERCEPTOR_ROUTES_VERSION)
        .await
    {
        Ok(list) => Ok(list
            .resources
            .iter()
            .any(|resource| resource.name == "interceptorroutes")),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(format!(
            "cannot ask the API server for {INTERCEPTOR_ROUTES_VERSION}: {error}"
        )),
    }
}

/// The watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Watch {
    HttpScaledObjects,
    InterceptorRoutes,
    Services,
    EndpointSlices,
    ConfigMaps,
}

impl Watch {
    fn describe(self) -> &'static str {
        match self {
            Watch::HttpScaledObjects => "http.keda.sh/v1alpha1 HTTPScaledObjects",
            Watch::InterceptorRoutes => "http.keda.sh/v1beta1 InterceptorRoutes",
            Watch::Services => "core/v1 Services",
            Watch::EndpointSlices => "discovery.k8s.io EndpointSlices",
            Watch::ConfigMaps => "core/v1 ConfigMaps labelled http.keda.sh/response-body=true",
        }
    }
}

/// Everything the source starts from.
pub struct KedaSource {
    pub client: Client,
    /// `KEDA_HTTP_WATCH_NAMESPACE`; `None`: every namespace.
    pub namespace: Option<String>,
    /// The EndpointSlices' API version the server serves (`v1` or `v1beta1`).
    slices_version: &'static str,
    /// The server serves InterceptorRoutes (the add-on's CRD, 0.14 and later).
    interceptor_routes: bool,
    pub defaults: Defaults,
    /// How requests that came in over the TLS port reach pods; `None`: no TLS port.
    pub upstream_tls: Option<Arc<UpstreamSetting>>,
}

impl KedaSource {
    /// Asks the server which EndpointSlice API it serves; an error says what to fix.
    pub async fn resolve(
        client: Client,
        namespace: Option<String>,
        defaults: Defaults,
    ) -> Result<KedaSource, String> {
        let slices_version = match resolve_endpoints(&client, EndpointsKind::Endpointslices).await?
        {
            EndpointsApi::Slices(version) => version,
            EndpointsApi::Endpoints => {
                return Err("the API server serves no discovery.k8s.io EndpointSlices".into())
            }
        };
        let interceptor_routes = serves_interceptor_routes(&client).await?;
        if !interceptor_routes {
            tracing::info!(
                "keda-http: the API server serves no {INTERCEPTOR_ROUTES_VERSION} \
                 InterceptorRoutes (the add-on's CRD before 0.14): HTTPScaledObjects only, \
                 InterceptorRoutes too once the CRD is installed (asked every {:?})",
                ROUTES_CRD_CHECK_EVERY
            );
        }
        Ok(KedaSource {
            client,
            namespace,
            slices_version,
            interceptor_routes,
            defaults,
            upstream_tls: None,
        })
    }

    /// The watches this server allows.
    fn watches(&self) -> Vec<Watch> {
        let mut watches = vec![Watch::HttpScaledObjects];
        if self.interceptor_routes {
            watches.push(Watch::InterceptorRoutes);
        }
        watches.extend([Watch::Services, Watch::EndpointSlices, Watch::ConfigMaps]);
        watches
    }

    /// Watches where the other replicas are listed, into `peers`, until the process ends.
    pub fn watch_peers(
        &self,
        service: super::peers::PeerService,
        peers: watch::Sender<Vec<std::net::SocketAddr>>,
        worker: WorkerHandle,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        super::peers::watch_peers(
            self.client.clone(),
            self.slices_version,
            service,
            peers,
            worker,
        )
    }

    /// Runs the watches until the process ends: the worker gets the ops, `routes` what the
    /// scaler answers for, `readiness` the first sync; `applied` times each event after it.
    #[allow(clippy::too_many_arguments)]
    pub async fn run(
        self,
        worker: WorkerHandle,
        readiness: Arc<Readiness>,
        publisher: Publisher,
        stats: AllShardStats,
        routes: watch::Sender<ScaledRoutes>,
        applied: prometheus::Histogram,
    ) {
        let mut watches = self.watches();
        let mut streams = stream::select_all(watches.iter().map(|&watch| self.stream(watch)));
        let mut routes_crd_check = tokio::time::interval(ROUTES_CRD_CHECK_EVERY);
        routes_crd_check.tick().await;
        let mut model = Model::new(self.defaults).with_tls(self.upstream_tls.clone());
        // Per watch while it (re)lists: the objects listed so far, by namespace and name. Each
        // goes into the model as it comes (the list of a large cluster is never held whole);
        // once listed, what it had and did not list is gone.
        let mut listing: BTreeMap<Watch, BTreeSet<(String, String)>> = BTreeMap::new();
        let mut listed: BTreeSet<Watch> = BTreeSet::new();
        let mut errors: BTreeMap<Watch, String> = BTreeMap::new();
        let mut synced = false;
        let mut progress = tokio::time::interval(PROGRESS_EVERY);
        progress.tick().await;
        loop {
            let (watch, event) = tokio::select! {
                next = streams.next() => match next {
                    Some(next) => next,
                    None => return,
                },
                _ = routes_crd_check.tick(), if !watches.contains(&Watch::InterceptorRoutes) => {
                    match serves_interceptor_routes(&self.client).await {
                        Ok(true) => {
                            tracing::info!(
                                "keda-http: the API server serves {INTERCEPTOR_ROUTES_VERSION} \
                                 InterceptorRoutes now: watching them"
                            );
                            watches.push(Watch::InterceptorRoutes);
                            streams.push(self.stream(Watch::InterceptorRoutes));
                        }
                        Ok(false) => {}
                        Err(error) => tracing::debug!("keda-http: {error}"),
                    }
                    continue;
                }
                _ = progress.tick(), if !synced => {
                    for &watch in &watches {
                        if !listed.contains(&watch) {
                            let why = errors.get(&watch).map_or("", String::as_str);
                            tracing::info!("keda-http: still listing {}{}{why}", watch.describe(),
                                if why.is_empty() { "" } else { ": " });
                        }
                    }
                    continue;
                }
            };
            let arrived = std::time::Instant::now();
            match event {
                Ok(Event::Init) => {
                    listing.insert(watch, BTreeSet::new());
                }
                Ok(Event::InitApply(object)) => {
                    let object = value(object);
                    let (namespace, name) = id(&object);
                    changed(&mut model, watch, &namespace, &name, Some(&object));
                    listing.entry(watch).or_default().insert((namespace, name));
                }
                Ok(Event::InitDone) => {
                    let seen = listing.remove(&watch).unwrap_or_default();
                    forget_unlisted(&mut model, watch, &seen);
                    listed.insert(watch);
                    errors.remove(&watch);
                }
                Ok(Event::Apply(object)) => {
                    let object = value(object);
                    let (namespace, name) = id(&object);
                    changed(&mut model, watch, &namespace, &name, Some(&object));
                }
                Ok(Event::Delete(object)) => {
                    let object = value(object);
                    let (namespace, name) = id(&object);
                    changed(&mut model, watch, &namespace, &name, None);
                }
                Err(error) => {
                    tracing::warn!("keda-http: watching {}: {error}", watch.describe());
                    errors.insert(watch, error.to_string());
                    continue;
                }
            }
            // The first view waits for every watch; a watch added later (the InterceptorRoutes
            // CRD installed) brings its objects in as it lists them.
            if !synced && listed.len() < watches.len() {
                continue;
            }
            let (ops, refusals) = model.ops();
            for refusal in &refusals {
                tracing::warn!("keda-http: {}: {}", refusal.object, refusal.reason);
            }
            if let Some(next) = model.changed_scaler_view() {
                routes.send_if_modified(|current| {
                    let changed = **current != next;
                    if changed {
                        *current = Arc::new(next);
                    }
                    changed
                });
            }
            if !ops.is_empty() {
                if let Err(error) = worker.apply(Op::Batch(ops)).await {
                    tracing::error!("keda-http: the state worker refused a change: {error}");
                }
            }
            if synced {
                applied.observe(arrived.elapsed().as_secs_f64());
            }
            if !synced {
                synced = true;
                let version = publisher.published_version();
                let dead = {
                    let readiness = readiness.clone();
                    move || readiness.dead_shards()
                };
                if !until_served(&stats, dead, version, SERVED_WITHIN).await {
                    tracing::warn!(
                        version,
                        "keda-http: the shards did not all serve the first view within \
                         {SERVED_WITHIN:?}"
                    );
                }
                readiness.set_informers_synced();
                let (routed, refused) = model.counts();
                tracing::info!(
                    routed,
                    refused,
                    "keda-http: every watch has listed; the first view is published"
                );
            }
        }
    }

    /// One watch's events.
    fn stream(
        &self,
        watch: Watch,
    ) -> BoxStream<'static, (Watch, Result<Event<DynamicObject>, watcher::Error>)> {
        let resource = |group: &str, version: &str, kind: &str, plural: &str| {
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
        };
        let (resource, config) = match watch {
            Watch::HttpScaledObjects => (
                resource(
                    "http.keda.sh",
                    "v1alpha1",
                    "HTTPScaledObject",
                    "httpscaledobjects",
                ),
                watcher::Config::default(),
            ),
            Watch::InterceptorRoutes => (
                resource(
                    "http.keda.sh",
                    "v1beta1",
                    "InterceptorRoute",
                    "interceptorroutes",
                ),
                watcher::Config::default(),
            ),
            Watch::Services => (
                resource("", "v1", "Service", "services"),
                watcher::Config::default(),
            ),
            Watch::EndpointSlices => (
                resource(
                    "discovery.k8s.io",
                    self.slices_version,
                    "EndpointSlice",
                    "endpointslices",
                ),
                watcher::Config::default().labels(SLICE_SERVICE_LABEL),
            ),
            Watch::ConfigMaps => (
                resource("", "v1", "ConfigMap", "configmaps"),
                watcher::Config::default().labels(&format!("{RESPONSE_BODY_LABEL}=true")),
            ),
        };
        let api = match &self.namespace {
            Some(namespace) => {
                Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &resource)
            }
            None => Api::<DynamicObject>::all_with(self.client.clone(), &resource),
        };
        watcher::watcher(api, config)
            .backoff(WatchBackoff::new())
            .map(move |event| (watch, event))
            .boxed()
    }
}

fn value(object: DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
}

fn id(object: &Value) -> (String, String) {
    let text = |field: &str| {
        object["metadata"][field]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    (text("namespace"), text("name"))
}

fn changed(model: &mut Model, watch: Watch, namespace: &str, name: &str, object: Option<&Value>) {
    match watch {
        Watch::HttpScaledObjects => {
            model.object(ObjectKind::HttpScaledObject, namespace, name, object)
        }
        Watch::InterceptorRoutes => {
            model.object(ObjectKind::InterceptorRoute, namespace, name, object)
        }
        Watch::Services => model.service(namespace, name, object),
        Watch::EndpointSlices => model.slice(namespace, name, object),
        Watch::ConfigMaps => model.config_map(namespace, name, object),
    }
}

/// A watch listed (again): what it had and did not list is gone.
fn forget_unlisted(model: &mut Model, watch: Watch, listed: &BTreeSet<(String, String)>) {
    let gone: Vec<(String, String)> = model
        .ids(model_kind(watch))
        .into_iter()
        .filter(|seen| !listed.contains(seen))
        .collect();
    for (namespace, name) in gone {
        changed(model, watch, &namespace, &name, None);
    }
}

fn model_kind(watch: Watch) -> super::model::Kind {
    match watch {
        Watch::HttpScaledObjects => super::model::Kind::Object(ObjectKind::HttpScaledObject),
        Watch::InterceptorRoutes => super::model::Kind::Object(ObjectKind::InterceptorRoute),
        Watch::Services => super::model::Kind::Service,
        Watch::EndpointSlices => super::model::Kind::Slice,
        Watch::ConfigMaps => super::model::Kind::ConfigMap,
    }
}
