//! The Kubernetes source's I/O: seven informers (kube-runtime watchers, each a list then a
//! Kubernetes watch) on the control thread, their events through the [`Model`] into
//! state-worker ops (the same ops the file source sends), and the backend probes the model asks
//! for.
//!
//! * **Revisions** (`serving.knative.dev/v1`, every namespace);
//! * **endpoints** of every revision's Services, private (the pods) and public (the
//!   activators): core/v1 Endpoints or `discovery.k8s.io` EndpointSlices, selected by the
//!   `networking.internal.knative.dev/serviceType` label;
//! * **private Services** (their ClusterIPs, for mesh mode);
//! * the **`config-features`** ConfigMap in `SYSTEM_NAMESPACE` (gates and tunables);
//! * the endpoints of **`activator-service`** in `SYSTEM_NAMESPACE`: the other activators,
//!   to which queue-proxy registrations are relayed (not state-worker ops: the registrations
//!   task reads them from a [`PeersReceiver`](crate::sources::PeersReceiver));
//! * the **`config-observability`** and **`config-tracing`** ConfigMaps in `SYSTEM_NAMESPACE`:
//!   the tracing settings ([`trace_config`]), not state-worker ops either: what they decide is
//!   sent on a `watch` channel the exporters read.
//!
//! Start-up: every watch's first list is buffered, and once all seven have listed, everything is
//! applied as one batch (features, revisions, Services, endpoints, in that order) and readiness
//! is told. Until then a line every few seconds says which watches are still listing and why.
//! Afterwards each event is applied as it comes. A watch that fails is retried with a short
//! backoff ([`WatchBackoff`]: 0.2 s doubling to 1 s, jittered) while the shards keep serving the
//! last snapshot; a relist applies only what changed (see [`Model`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Secret, Service};
use kactivator_api::RevisionKey;
use kactivator_shards::metrics::AllShardStats;
use kactivator_shards::runtime::readiness::Readiness;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, Resource, ResourceExt};
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry};
use serde_json::Value;
use tokio::sync::{mpsc, watch, Semaphore};

use super::backends::{MeshMode, Outcome, ProbeJob};
use super::backoff::WatchBackoff;
use super::internal_tls::{InternalTls, Served, ROUTING_SERVING_CERTS, TRUST_BUNDLE_LABEL};
use super::model::{EndpointsSeen, MissingSlices, Model, ObjectId, TlsChanged};
use super::objects::{self, ServiceType, SERVICE_TYPE_LABEL, SLICE_SERVICE_LABEL};
use super::trace_config::{self, ClusterTracing, TRACING_CONFIG_MAP};
use crate::config::trace::{self, TracingConfig};
use crate::config::EndpointsKind;
use crate::features::Tunables;
use crate::metrics;
use crate::pod_state::Gates;
use crate::publisher::{until_served, Publisher};
use crate::sources::probe::{self, ProbeResult};
use crate::sources::prober::PROBE_CONCURRENCY;
use crate::sources::PeersSender;
use crate::state::Op;
use crate::tls::TlsSettings;
use crate::worker::WorkerHandle;
use kactivator_shards::routing::ShardCommand;

/// The ConfigMap holding the feature gates and tunables.
pub const FEATURES_CONFIG_MAP: &str = "config-features";
/// The ConfigMap holding `mesh-compatibility-mode`, read once at start-up.
pub const NETWORK_CONFIG_MAP: &str = "config-network";
/// Its key.
pub const MESH_COMPATIBILITY_MODE: &str = "mesh-compatibility-mode";
/// `config-network`'s switch for TLS between the ingress, the activator and the queue-proxies.
pub const SYSTEM_INTERNAL_TLS: &str = "system-internal-tls";
/// Its legacy boolean, read when `system-internal-tls` is empty or disabled.
pub const INTERNAL_ENCRYPTION: &str = "internal-encryption";
/// The activators' Service, whose endpoints are the registration relay's peers.
pub const ACTIVATOR_SERVICE: &str = "activator-service";
/// How often the start-up says which watches are still listing.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// The API that lists pods, as resolved against the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointsApi {
    Endpoints,
    /// EndpointSlices of this `discovery.k8s.io` version (`v1` or `v1beta1`).
    Slices(&'static str),
}

impl EndpointsApi {
    fn describe(&self) -> String {
        match self {
            EndpointsApi::Endpoints => "core/v1 Endpoints".into(),
            EndpointsApi::Slices(version) => format!("discovery.k8s.io/{version} EndpointSlices"),
        }
    }
}

/// Everything the source starts from.
pub struct KubeSource {
    pub client: Client,
    /// `SYSTEM_NAMESPACE`: where `config-features` and `config-network` live.
    pub system_namespace: String,
    pub endpoints: EndpointsApi,
    pub mesh: MeshMode,
    /// `POD_IP`: this activator's place among the public endpoints.
    pub pod_ip: Option<std::net::IpAddr>,
    pub gates: Gates,
    /// The tunables' values when `config-features` does not set them.
    pub tunables: Tunables,
    /// `system-internal-tls` is on: the TLS data port's settings (`ACTIVATOR_TLS_*`).
    pub internal_tls: Option<TlsSettings>,
    /// config-observability's name: `CONFIG_OBSERVABILITY_NAME`, else
    /// [`trace_config::OBSERVABILITY_CONFIG_MAP`], as upstream names it.
    pub observability_config_map: String,
}

impl KubeSource {
    /// Asks the server what it serves and reads `config-network`: the source's settings before
    /// any watch starts. Errors say what to fix (no access, no such API).
    pub async fn resolve(
        client: Client,
        system_namespace: String,
        endpoints: EndpointsKind,
        pod_ip: Option<std::net::IpAddr>,
        tunables: Tunables,
    ) -> Result<KubeSource, String> {
        let endpoints = resolve_endpoints(&client, endpoints).await?;
        let network: Api<ConfigMap> = Api::namespaced(client.clone(), &system_namespace);
        let (mesh, internal_tls) = match network.get_opt(NETWORK_CONFIG_MAP).await {
            Ok(map) => {
                let data = map.and_then(|map| map.data).unwrap_or_default();
                // Read once, as upstream reads it: turning it on or off needs a restart. A bad
                // value stops upstream too.
                let internal_tls = match crate::tls::system_internal_tls(
                    data.get(SYSTEM_INTERNAL_TLS).map(String::as_str),
                    data.get(INTERNAL_ENCRYPTION).map(String::as_str),
                ) {
                    Ok(false) => None,
                    Ok(true) => Some(activator_tls_settings()?),
                    Err(error) => {
                        return Err(format!("{system_namespace}/{NETWORK_CONFIG_MAP}: {error}"))
                    }
                };
                let value = data
                    .get(MESH_COMPATIBILITY_MODE)
                    .cloned()
                    .unwrap_or_default();
                let mesh = MeshMode::parse(&value).unwrap_or_else(|| {
                    tracing::warn!(
                        "{system_namespace}/{NETWORK_CONFIG_MAP}: {MESH_COMPATIBILITY_MODE} \
                         {value:?} is not auto, enabled or disabled; using auto"
                    );
                    MeshMode::Auto
                });
                (mesh, internal_tls)
            }
            Err(error) => {
                return Err(format!(
                    "cannot read {system_namespace}/{NETWORK_CONFIG_MAP}: {error}"
                ))
            }
        };
        tracing::info!(
            endpoints = %endpoints.describe(),
            mesh_compatibility_mode = ?mesh,
            system_internal_tls = internal_tls.is_some(),
            %system_namespace,
            "watching the cluster"
        );
        Ok(KubeSource {
            client,
            system_namespace,
            endpoints,
            mesh,
            pod_ip,
            gates: Gates::default(),
            tunables,
            internal_tls,
            observability_config_map: std::env::var(trace_config::OBSERVABILITY_CONFIG_MAP_ENV)
                .ok()
                .filter(|name| !name.is_empty())
                .unwrap_or_else(|| trace_config::OBSERVABILITY_CONFIG_MAP.into()),
        })
    }

    /// The watches this source runs, in the order their first lists are applied.
    fn informers(&self) -> Vec<Informer> {
        let mut informers = BASE_INFORMERS.to_vec();
        if self.internal_tls.is_some() {
            informers.extend([Informer::TlsSecret, Informer::TrustBundles]);
        }
        informers
    }
}

/// The TLS data port's `ACTIVATOR_TLS_*` settings (Knative 1.21.2+), which upstream reads only
/// with `system-internal-tls` on, and where a bad one stops start-up.
fn activator_tls_settings() -> Result<TlsSettings, String> {
    let settings = crate::tls::settings::read(crate::tls::settings::ACTIVATOR, |key| {
        std::env::var(key).ok()
    });
    if let Some((key, problem)) = settings.problems.first() {
        return Err(format!("{key}: {problem}"));
    }
    Ok(settings)
}

/// A client from the kubeconfig (`KUBECONFIG`, `~/.kube/config`), else the in-cluster service
/// account.
pub async fn client() -> Result<Client, String> {
    Client::try_default()
        .await
        .map_err(|error| error.to_string())
}

/// Whether core/v1 Endpoints with Knative's `serviceType` label exist (one is asked for: any is
/// the evidence [`MissingSlices`] wants). `None` when the list fails.
async fn labelled_endpoints(client: Client) -> Option<usize> {
    let endpoints: Api<Endpoints> = Api::all(client);
    match endpoints
        .list(&ListParams::default().labels(SERVICE_TYPE_LABEL).limit(1))
        .await
    {
        Ok(list) => Some(list.items.len()),
        Err(error) => {
            tracing::debug!("listing labelled core/v1 Endpoints: {error}");
            None
        }
    }
}

/// `auto` picks EndpointSlices when the server serves them (v1, else v1beta1).
pub async fn resolve_endpoints(
    client: &Client,
    kind: EndpointsKind,
) -> Result<EndpointsApi, String> {
    if kind == EndpointsKind::Endpoints {
        return Ok(EndpointsApi::Endpoints);
    }
    for version in ["v1", "v1beta1"] {
        match client
            .list_api_group_resources(&format!("discovery.k8s.io/{version}"))
            .await
        {
            Ok(list) if list.resources.iter().any(|r| r.name == "endpointslices") => {
                return Ok(EndpointsApi::Slices(version))
            }
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => {
                return Err(format!(
                    "cannot ask the API server for discovery.k8s.io/{version}: {error}"
                ))
            }
        }
    }
    match kind {
        EndpointsKind::Endpointslices => Err(
            "kubernetes.endpoints = \"endpointslices\", but the API server serves no \
                 discovery.k8s.io EndpointSlices (v1 or v1beta1)"
                .into(),
        ),
        _ => Ok(EndpointsApi::Endpoints),
    }
}

/// The watches, in the order their first lists are applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Informer {
    Features,
    Revisions,
    Services,
    Endpoints,
    Activators,
    /// config-observability (Knative 1.19+): its `tracing-*` keys.
    ObservabilityConfig,
    /// config-tracing (Knative 1.18).
    TracingConfig,
    /// With `system-internal-tls`: the `routing-serving-certs` Secret.
    TlsSecret,
    /// With `system-internal-tls`: ConfigMaps labelled `networking.knative.dev/trust-bundle`.
    TrustBundles,
}

/// The watches every Kubernetes source runs.
const BASE_INFORMERS: [Informer; 7] = [
    Informer::Features,
    Informer::Revisions,
    Informer::Services,
    Informer::Endpoints,
    Informer::Activators,
    Informer::ObservabilityConfig,
    Informer::TracingConfig,
];

impl Informer {
    fn name(self) -> &'static str {
        match self {
            Informer::Features => "config-features",
            Informer::Revisions => "revisions",
            Informer::Services => "services",
            Informer::Endpoints => "endpoints",
            Informer::Activators => ACTIVATOR_SERVICE,
            Informer::ObservabilityConfig => trace_config::OBSERVABILITY_CONFIG_MAP,
            Informer::TracingConfig => TRACING_CONFIG_MAP,
            Informer::TlsSecret => ROUTING_SERVING_CERTS,
            Informer::TrustBundles => "trust-bundles",
        }
    }
}

/// One watched object, read.
#[derive(Debug)]
enum Item {
    Revision {
        key: Option<RevisionKey>,
        object: Value,
    },
    Endpoints {
        id: ObjectId,
        seen: Option<EndpointsSeen>,
        /// What in the object could not be used (`ns/name: field …`).
        problems: Vec<String>,
    },
    Service {
        revision: Option<RevisionKey>,
        address: Option<SocketAddr>,
    },
    Features(BTreeMap<String, String>),
    /// One of `activator-service`'s endpoints objects.
    Activators {
        id: ObjectId,
        addresses: objects::Addresses,
        problems: Vec<String>,
    },
    /// config-observability's or config-tracing's data (which: the informer).
    TracingMap(BTreeMap<String, String>),
    /// The `routing-serving-certs` Secret's data.
    TlsSecret(BTreeMap<String, Vec<u8>>),
    /// A trust-bundle ConfigMap's data; `None` once it lost the label.
    TrustBundle {
        name: String,
        data: Option<BTreeMap<String, String>>,
    },
}

impl Item {
    /// What in the object could not be used.
    fn problems(&self) -> &[String] {
        match self {
            Item::Endpoints { problems, .. } | Item::Activators { problems, .. } => problems,
            _ => &[],
        }
    }
}

/// An endpoints object's problems, each prefixed with the object's name.
fn named(id: &ObjectId, problems: Vec<String>) -> Vec<String> {
    let (namespace, name) = id;
    problems
        .into_iter()
        .map(|problem| format!("{namespace}/{name}: {problem}"))
        .collect()
}

/// A watch event with the object read.
#[derive(Debug)]
enum Change {
    Listing,
    Listed(Item),
    ListDone,
    Applied(Item),
    Deleted(Item),
}

type Incoming = (Informer, Result<Change, String>);

fn changes<K, F>(
    informer: Informer,
    stream: impl futures_util::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    read: F,
) -> BoxStream<'static, Incoming>
where
    K: Send + 'static,
    F: Fn(K) -> Item + Send + Sync + 'static,
{
    stream
        .map(move |event| {
            let change = event
                .map(|event| match event {
                    Event::Init => Change::Listing,
                    Event::InitApply(object) => Change::Listed(read(object)),
                    Event::InitDone => Change::ListDone,
                    Event::Apply(object) => Change::Applied(read(object)),
                    Event::Delete(object) => Change::Deleted(read(object)),
                })
                .map_err(|error| error.to_string());
            (informer, change)
        })
        .boxed()
}

fn object_id<K: Resource>(object: &K) -> ObjectId {
    (object.namespace().unwrap_or_default(), object.name_any())
}

fn read_revision(object: DynamicObject) -> Item {
    let key = RevisionKey::new(&object.namespace().unwrap_or_default(), &object.name_any()).ok();
    Item::Revision {
        key,
        object: serde_json::to_value(&object).unwrap_or(Value::Null),
    }
}

fn read_endpoints(object: Endpoints) -> Item {
    let listing = objects::endpoints_addresses(&object);
    endpoints_item(object_id(&object), &object.metadata, listing)
}

fn read_slice(object: DynamicObject) -> Item {
    let listing = objects::slice_addresses(&object.data);
    endpoints_item(object_id(&object), &object.metadata, listing)
}

fn endpoints_item(
    id: ObjectId,
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    listing: objects::Listing,
) -> Item {
    let seen = objects::owner(metadata).map(|(revision, kind)| EndpointsSeen {
        revision,
        kind,
        addresses: listing.addresses,
    });
    Item::Endpoints {
        problems: named(&id, listing.problems),
        id,
        seen,
    }
}

fn read_service(object: Service) -> Item {
    let revision = objects::owner(&object.metadata)
        .filter(|(_, kind)| *kind == ServiceType::Private)
        .map(|(revision, _)| revision);
    Item::Service {
        revision,
        address: objects::service_address(&object),
    }
}

fn read_activator_endpoints(object: Endpoints) -> Item {
    let id = object_id(&object);
    let listing = objects::activator_endpoints_addresses(&object);
    Item::Activators {
        problems: named(&id, listing.problems),
        id,
        addresses: listing.addresses,
    }
}

fn read_activator_slice(object: DynamicObject) -> Item {
    let id = object_id(&object);
    let listing = objects::activator_slice_addresses(&object.data);
    Item::Activators {
        problems: named(&id, listing.problems),
        id,
        addresses: listing.addresses,
    }
}

fn read_tls_secret(object: Secret) -> Item {
    Item::TlsSecret(
        object
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(key, value)| (key, value.0))
            .collect(),
    )
}

fn read_trust_bundle(object: ConfigMap) -> Item {
    let labelled = object
        .metadata
        .labels
        .as_ref()
        .is_some_and(|labels| labels.contains_key(TRUST_BUNDLE_LABEL));
    Item::TrustBundle {
        name: object.name_any(),
        // `data` only, as upstream (`binaryData` is not read).
        data: labelled.then(|| object.data.unwrap_or_default().into_iter().collect()),
    }
}

fn read_features(object: ConfigMap) -> Item {
    Item::Features(object.data.unwrap_or_default().into_iter().collect())
}

fn read_tracing_map(object: ConfigMap) -> Item {
    Item::TracingMap(object.data.unwrap_or_default().into_iter().collect())
}

/// The streams of the watches, merged.
fn watch_streams(source: &KubeSource) -> BoxStream<'static, Incoming> {
    let client = &source.client;
    let revisions = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("serving.knative.dev", "v1", "Revision"),
        "revisions",
    );
    let selected = watcher::Config::default().labels(SERVICE_TYPE_LABEL);
    let private = watcher::Config::default().labels(&format!("{SERVICE_TYPE_LABEL}=Private"));
    let features =
        watcher::Config::default().fields(&format!("metadata.name={FEATURES_CONFIG_MAP}"));
    let (endpoints, activators) = match source.endpoints {
        EndpointsApi::Endpoints => (
            changes(
                Informer::Endpoints,
                watcher::watcher(Api::<Endpoints>::all(client.clone()), selected)
                    .backoff(WatchBackoff::new()),
                read_endpoints,
            ),
            changes(
                Informer::Activators,
                watcher::watcher(
                    Api::<Endpoints>::namespaced(client.clone(), &source.system_namespace),
                    watcher::Config::default()
                        .fields(&format!("metadata.name={ACTIVATOR_SERVICE}")),
                )
                .backoff(WatchBackoff::new()),
                read_activator_endpoints,
            ),
        ),
        EndpointsApi::Slices(version) => {
            let slices = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("discovery.k8s.io", version, "EndpointSlice"),
                "endpointslices",
            );
            (
                changes(
                    Informer::Endpoints,
                    watcher::watcher(
                        Api::<DynamicObject>::all_with(client.clone(), &slices),
                        selected,
                    )
                    .backoff(WatchBackoff::new()),
                    read_slice,
                ),
                changes(
                    Informer::Activators,
                    watcher::watcher(
                        Api::<DynamicObject>::namespaced_with(
                            client.clone(),
                            &source.system_namespace,
                            &slices,
                        ),
                        watcher::Config::default()
                            .labels(&format!("{SLICE_SERVICE_LABEL}={ACTIVATOR_SERVICE}")),
                    )
                    .backoff(WatchBackoff::new()),
                    read_activator_slice,
                ),
            )
        }
    };
    let mut streams = vec![
        changes(
            Informer::Features,
            watcher::watcher(
                Api::<ConfigMap>::namespaced(client.clone(), &source.system_namespace),
                features,
            )
            .backoff(WatchBackoff::new()),
            read_features,
        ),
        changes(
            Informer::Revisions,
            watcher::watcher(
                Api::<DynamicObject>::all_with(client.clone(), &revisions),
                watcher::Config::default(),
            )
            .backoff(WatchBackoff::new()),
            read_revision,
        ),
        changes(
            Informer::Services,
            watcher::watcher(Api::<Service>::all(client.clone()), private)
                .backoff(WatchBackoff::new()),
            read_service,
        ),
        endpoints,
        activators,
    ];
    for (informer, name) in [
        (
            Informer::ObservabilityConfig,
            source.observability_config_map.as_str(),
        ),
        (Informer::TracingConfig, TRACING_CONFIG_MAP),
    ] {
        streams.push(changes(
            informer,
            watcher::watcher(
                Api::<ConfigMap>::namespaced(client.clone(), &source.system_namespace),
                watcher::Config::default().fields(&format!("metadata.name={name}")),
            )
            .backoff(WatchBackoff::new()),
            read_tracing_map,
        ));
    }
    if source.internal_tls.is_some() {
        streams.push(changes(
            Informer::TlsSecret,
            watcher::watcher(
                Api::<Secret>::namespaced(client.clone(), &source.system_namespace),
                watcher::Config::default()
                    .fields(&format!("metadata.name={ROUTING_SERVING_CERTS}")),
            )
            .backoff(WatchBackoff::new()),
            read_tls_secret,
        ));
        streams.push(changes(
            Informer::TrustBundles,
            watcher::watcher(
                Api::<ConfigMap>::namespaced(client.clone(), &source.system_namespace),
                watcher::Config::default().labels(TRUST_BUNDLE_LABEL),
            )
            .backoff(WatchBackoff::new()),
            read_trust_bundle,
        ));
    }
    stream::select_all(streams).boxed()
}

/// The source's metrics.
struct KubeMetrics {
    restarts: IntCounterVec,
    relists: IntCounterVec,
    invalid: IntCounterVec,
    last_event_age: IntGaugeVec,
    objects: IntGaugeVec,
    probes: IntCounterVec,
    applied: Histogram,
}

impl KubeMetrics {
    fn new(registry: &Registry) -> KubeMetrics {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            metrics::register(
                registry,
                IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
            )
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            metrics::register(
                registry,
                IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
            )
        };
        KubeMetrics {
            restarts: counter(
                "kactivator_kubernetes_watch_restarts_total",
                "Watches that failed and were restarted (with backoff), by informer",
                &["informer"],
            ),
            relists: counter(
                "kactivator_kubernetes_relists_total",
                "Lists after the first (a watch that could not resume), by informer",
                &["informer"],
            ),
            invalid: counter(
                "kactivator_kubernetes_invalid_objects_total",
                "Objects that could not be used (the log says why), by informer",
                &["informer"],
            ),
            last_event_age: gauge(
                "kactivator_kubernetes_last_event_age_seconds",
                "Seconds since each informer's last event or list",
                &["informer"],
            ),
            objects: gauge(
                "kactivator_kubernetes_objects",
                "Objects the Kubernetes source holds, by kind",
                &["kind"],
            ),
            probes: counter(
                "kactivator_kubernetes_backend_probes_total",
                "Probes of listed pods not confirmed yet, by result",
                &["result"],
            ),
            applied: event_apply_histogram(registry),
        }
    }
}

/// `kactivator_kubernetes_event_apply_seconds`: from a watch event's arrival to its ops applied
/// and sent to every shard. Both Kubernetes sources (Knative's objects, KEDA's HTTP add-on's)
/// observe it.
pub fn event_apply_histogram(registry: &Registry) -> Histogram {
    metrics::register(
        registry,
        Histogram::with_opts(
            HistogramOpts::new(
                "kactivator_kubernetes_event_apply_seconds",
                "From a watch event's arrival to its ops applied by the state worker \
                 and the resulting updates sent to every shard",
            )
            .buckets(vec![
                0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0,
            ]),
        )
        .expect("valid metric"),
    )
}

/// One watch's bookkeeping.
#[derive(Default)]
struct InformerState {
    /// Its first list has been applied (or buffered for the start-up batch).
    synced: bool,
    /// Objects of a list under way.
    listing: Option<Vec<Item>>,
    last_event: Option<Instant>,
    last_error: Option<String>,
}

/// What the informers' event loop owns: the model, each informer's bookkeeping, and where its
/// ops and peers go.
struct InformerLoop {
    model: Model,
    /// The watches run, in the order their first lists are applied.
    expected: Vec<Informer>,
    informers: BTreeMap<Informer, InformerState>,
    /// Until every watch has listed: the ops, by informer, for the start-up batch.
    startup: Option<BTreeMap<Informer, Vec<Op>>>,
    metrics: KubeMetrics,
    worker: WorkerHandle,
    /// Told once the start-up batch is published.
    readiness: Arc<Readiness>,
    /// Where the registration relay reads its peers.
    peers: PeersSender,
    /// To wait until the shards serve the start-up batch before saying ready.
    publisher: Publisher,
    stats: AllShardStats,
    /// `SYSTEM_NAMESPACE`, for the log.
    system_namespace: String,
    /// What config-observability and config-tracing said last.
    tracing: ClusterTracing,
    /// Where the tracing in force goes: written on each change.
    tracing_sender: watch::Sender<TracingConfig>,
}

/// Longest wait for the shards to serve the start-up batch before readiness says ready anyway
/// (with a warning): they apply it between requests, within milliseconds.
pub const SERVED_WITHIN: Duration = Duration::from_secs(5);

impl InformerLoop {
    /// One event: the model's ops, applied now or kept for the start-up batch.
    async fn on_change(&mut self, informer: Informer, change: Result<Change, String>) {
        let arrived = Instant::now();
        if let Ok(Change::Listed(item) | Change::Applied(item)) = &change {
            for problem in item.problems() {
                self.invalid(informer, "endpoints partly not used", problem);
            }
        }
        let state = self.informers.entry(informer).or_default();
        state.last_event = Some(Instant::now());
        let change = match change {
            Ok(change) => change,
            Err(error) => {
                self.metrics
                    .restarts
                    .with_label_values(&[informer.name()])
                    .inc();
                tracing::warn!(
                    informer = informer.name(),
                    "watch failed, retrying with backoff: {error}"
                );
                state.last_error = Some(error);
                return;
            }
        };
        let ops = match change {
            Change::Listing => {
                if state.synced {
                    self.metrics
                        .relists
                        .with_label_values(&[informer.name()])
                        .inc();
                }
                state.listing = Some(Vec::new());
                return;
            }
            Change::Listed(item) => {
                state.listing.get_or_insert_with(Vec::new).push(item);
                return;
            }
            Change::ListDone => {
                let items = state.listing.take().unwrap_or_default();
                state.synced = true;
                state.last_error = None;
                self.listed(informer, items)
            }
            Change::Applied(item) => self.applied(informer, item),
            Change::Deleted(item) => self.deleted(informer, item),
        };
        let timed = self.synced() && !ops.is_empty();
        self.emit(informer, ops).await;
        if timed {
            self.metrics
                .applied
                .observe(arrived.elapsed().as_secs_f64());
        }
    }

    fn invalid(&self, informer: Informer, what: &str, error: &str) {
        self.metrics
            .invalid
            .with_label_values(&[informer.name()])
            .inc();
        tracing::warn!(informer = informer.name(), "{what}: {error}");
    }

    fn listed(&mut self, informer: Informer, items: Vec<Item>) -> Vec<Op> {
        match informer {
            Informer::Revisions => {
                let objects: Vec<Value> = items
                    .into_iter()
                    .filter_map(|item| match item {
                        Item::Revision { object, .. } => Some(object),
                        _ => None,
                    })
                    .collect();
                let (ops, errors) = self.model.revisions_listed(&objects);
                for error in errors {
                    self.invalid(informer, "revision not routed", &error);
                }
                ops
            }
            Informer::Endpoints => self.model.endpoints_listed(
                items
                    .into_iter()
                    .filter_map(|item| match item {
                        Item::Endpoints { id, seen, .. } => Some((id, seen?)),
                        _ => None,
                    })
                    .collect(),
            ),
            Informer::Services => self.model.services_listed(
                items
                    .into_iter()
                    .filter_map(|item| match item {
                        Item::Service { revision, address } => Some((revision?, address?)),
                        _ => None,
                    })
                    .collect(),
            ),
            Informer::Activators => {
                let all = items
                    .into_iter()
                    .filter_map(|item| match item {
                        Item::Activators { id, addresses, .. } => Some((id, addresses)),
                        _ => None,
                    })
                    .collect();
                let peers = self.model.activators_listed(all);
                self.set_peers(peers);
                Vec::new()
            }
            Informer::Features => {
                let data = items
                    .into_iter()
                    .find_map(|item| match item {
                        Item::Features(data) => Some(data),
                        _ => None,
                    })
                    .unwrap_or_default();
                self.features(&data)
            }
            Informer::ObservabilityConfig | Informer::TracingConfig => {
                let data = items.into_iter().find_map(|item| match item {
                    Item::TracingMap(data) => Some(data),
                    _ => None,
                });
                self.tracing_map(informer, data.as_ref())
            }
            Informer::TlsSecret => {
                let data = items.into_iter().find_map(|item| match item {
                    Item::TlsSecret(data) => Some(data),
                    _ => None,
                });
                if data.is_none() {
                    tracing::warn!(
                        "{ROUTING_SERVING_CERTS} not found in the system namespace: \
                         system-internal-tls needs it with tls.crt, tls.key and ca.crt; no \
                         TLS handshake succeeds and readiness says so until it is there"
                    );
                }
                let changed = self.model.tls_secret(data.as_ref());
                self.tls(changed)
            }
            Informer::TrustBundles => {
                let all = items
                    .into_iter()
                    .filter_map(|item| match item {
                        Item::TrustBundle {
                            name,
                            data: Some(data),
                        } => Some((name, data)),
                        _ => None,
                    })
                    .collect();
                let changed = self.model.tls_bundles_listed(all);
                self.tls(changed)
            }
        }
    }

    /// A TLS object's outcome: what the TLS data port serves now, and the ops.
    fn tls(&self, changed: TlsChanged) -> Vec<Op> {
        for warning in &changed.warnings {
            tracing::warn!("system-internal-tls: {warning}");
        }
        match changed.served {
            Served::Unchanged => {}
            Served::New(config) => {
                let reloaded = self.readiness.certificate_served();
                self.publisher
                    .broadcast(ShardCommand::ServerTls(Some(config)));
                self.readiness.set_certificate_served();
                if reloaded {
                    tracing::info!(
                        "{ROUTING_SERVING_CERTS}: the certificate changed; new TLS handshakes \
                         use it"
                    );
                } else {
                    tracing::info!("{ROUTING_SERVING_CERTS}: certificate loaded; TLS is served");
                }
            }
            Served::Kept(problem) => tracing::warn!("system-internal-tls: {problem}"),
        }
        changed.ops
    }

    fn applied(&mut self, informer: Informer, item: Item) -> Vec<Op> {
        match item {
            Item::Revision { object, key } => match self.model.revision_applied(&object) {
                Ok(ops) => ops,
                Err(error) => {
                    let what = key.map_or("revision".to_string(), |key| format!("revision {key}"));
                    self.invalid(informer, &format!("{what} not routed"), &error);
                    Vec::new()
                }
            },
            Item::Endpoints {
                id,
                seen: Some(seen),
                ..
            } => self.model.endpoints_applied(id, seen),
            // Its labels no longer name a revision: as good as gone.
            Item::Endpoints { id, seen: None, .. } => self.model.endpoints_deleted(&id),
            Item::Service {
                revision: Some(revision),
                address,
            } => self.model.service_applied(revision, address),
            Item::Service { revision: None, .. } => Vec::new(),
            Item::Features(data) => self.features(&data),
            Item::TracingMap(data) => self.tracing_map(informer, Some(&data)),
            Item::Activators { id, addresses, .. } => {
                let peers = self.model.activators_applied(id, Some(addresses));
                self.set_peers(peers);
                Vec::new()
            }
            Item::TlsSecret(data) => {
                let changed = self.model.tls_secret(Some(&data));
                self.tls(changed)
            }
            Item::TrustBundle { name, data } => {
                let changed = self.model.tls_bundle(&name, data.as_ref());
                self.tls(changed)
            }
        }
    }

    /// The relay's peers changed: every later registration goes to these.
    fn set_peers(&self, peers: Option<Vec<SocketAddr>>) {
        if let Some(peers) = peers {
            tracing::info!(?peers, "{ACTIVATOR_SERVICE}: registration relay peers");
            self.peers.send_replace(peers);
        }
    }

    fn deleted(&mut self, informer: Informer, item: Item) -> Vec<Op> {
        match item {
            Item::Revision { key: Some(key), .. } => self.model.revision_deleted(&key),
            Item::Revision { key: None, .. } => Vec::new(),
            Item::Endpoints { id, .. } => self.model.endpoints_deleted(&id),
            Item::Service {
                revision: Some(revision),
                ..
            } => self.model.service_applied(revision, None),
            Item::Service { revision: None, .. } => Vec::new(),
            // Deleted: every key takes its default again.
            Item::Features(_) => self.features(&BTreeMap::new()),
            Item::TracingMap(_) => self.tracing_map(informer, None),
            Item::Activators { id, .. } => {
                let peers = self.model.activators_applied(id, None);
                self.set_peers(peers);
                Vec::new()
            }
            Item::TlsSecret(_) => {
                let changed = self.model.tls_secret(None);
                self.tls(changed)
            }
            Item::TrustBundle { name, .. } => {
                let changed = self.model.tls_bundle(&name, None);
                self.tls(changed)
            }
        }
    }

    /// config-observability or config-tracing as listed, changed (`Some`) or deleted (`None`):
    /// the tracing in force is sent when it changed; a refused value keeps it, said in one
    /// line naming the map and the key. No state-worker op.
    fn tracing_map(
        &mut self,
        informer: Informer,
        data: Option<&BTreeMap<String, String>>,
    ) -> Vec<Op> {
        let seen = match informer {
            Informer::ObservabilityConfig => self.tracing.observability_seen(data),
            _ => self.tracing.tracing_seen(data),
        };
        let (config, decider) = self.tracing.effective();
        if let Err(refused) = seen {
            self.invalid(
                informer,
                "tracing settings not applied",
                &format!(
                    "{}/{refused}; keeping the tracing in force ({})",
                    self.system_namespace,
                    trace::describe(&config)
                ),
            );
            return Vec::new();
        }
        let changed = self.tracing_sender.send_if_modified(|current| {
            let changed = *current != config;
            if changed {
                *current = config.clone();
            }
            changed
        });
        if changed {
            tracing::info!(
                "tracing: {}, from {}",
                trace::describe(&config),
                decider.describe(&self.tracing, &self.system_namespace)
            );
        }
        Vec::new()
    }

    fn features(&mut self, data: &BTreeMap<String, String>) -> Vec<Op> {
        let (ops, warnings) = self.model.features(data);
        for warning in warnings {
            tracing::warn!("{FEATURES_CONFIG_MAP}: {warning}");
        }
        ops
    }

    /// Applies `ops`, or keeps them for the start-up batch; after the last first list, sends
    /// that batch and says the source is ready.
    async fn emit(&mut self, informer: Informer, ops: Vec<Op>) {
        if let Some(startup) = &mut self.startup {
            startup.entry(informer).or_default().extend(ops);
            if !self.informers.values().all(|state| state.synced)
                || self.informers.len() < self.expected.len()
            {
                return;
            }
            let mut startup = self.startup.take().unwrap_or_default();
            // Each revision's spec as the model sees it now, where the revisions' list goes: a
            // spec made before a later list changed it (config-features' tunables, the TLS
            // trust) is not the one applied.
            for ops in startup.values_mut() {
                ops.retain(|op| !matches!(op, Op::UpsertRevision(_)));
            }
            startup
                .entry(Informer::Revisions)
                .or_default()
                .extend(self.model.specs());
            let batch: Vec<Op> = startup.into_values().flatten().collect();
            let count = batch.len();
            self.apply(batch).await;
            // Ready once every shard serves the first view, not once it is sent: a request let
            // in at once must find its revision (review finding: a 404 right after Ready).
            let version = self.publisher.published_version();
            let readiness = self.readiness.clone();
            let dead = move || readiness.dead_shards();
            if !until_served(&self.stats, dead, version, SERVED_WITHIN).await {
                tracing::warn!(
                    version,
                    "the shards did not all serve the first view within {SERVED_WITHIN:?}"
                );
            }
            self.readiness.set_informers_synced();
            tracing::info!(
                revisions = self.model.revision_count(),
                endpoints = self.model.endpoints_count(),
                services = self.model.service_count(),
                ops = count,
                tracing = %trace::describe(&self.tracing.effective().0),
                "every watch has listed; the first view is published"
            );
            return;
        }
        if !ops.is_empty() {
            self.apply(ops).await;
        }
    }

    async fn apply(&self, ops: Vec<Op>) {
        if let Err(error) = self.worker.apply(Op::Batch(ops)).await {
            tracing::error!("the state worker refused a change from Kubernetes: {error}");
        }
    }

    fn synced(&self) -> bool {
        self.startup.is_none()
    }

    fn progress(&self) {
        for &informer in &self.expected {
            let state = self.informers.get(&informer);
            if state.is_some_and(|state| state.synced) {
                continue;
            }
            let error = state.and_then(|state| state.last_error.as_deref());
            tracing::info!(
                informer = informer.name(),
                last_error = error.unwrap_or("none"),
                "still listing; not ready until every watch has listed"
            );
        }
    }

    fn gauges(&self) {
        let now = Instant::now();
        for &informer in &self.expected {
            if let Some(at) = self
                .informers
                .get(&informer)
                .and_then(|state| state.last_event)
            {
                self.metrics
                    .last_event_age
                    .with_label_values(&[informer.name()])
                    .set(now.duration_since(at).as_secs() as i64);
            }
        }
        for (kind, count) in [
            ("revisions", self.model.revision_count()),
            ("endpoints", self.model.endpoints_count()),
            ("services", self.model.service_count()),
        ] {
            self.metrics
                .objects
                .with_label_values(&[kind])
                .set(count as i64);
        }
    }
}

impl KubeSource {
    /// Runs the watches until the process ends. `tracing_sender`: where the tracing the cluster
    /// asks for goes, each time it changes.
    #[allow(clippy::too_many_arguments)]
    pub async fn run(
        self,
        worker: WorkerHandle,
        readiness: Arc<Readiness>,
        registry: Registry,
        peers: PeersSender,
        publisher: Publisher,
        stats: AllShardStats,
        tracing_sender: watch::Sender<TracingConfig>,
    ) {
        let mut events = watch_streams(&self);
        let mut model = Model::new(self.mesh, self.pod_ip, self.gates, self.tunables);
        if let Some(settings) = &self.internal_tls {
            model =
                model.with_internal_tls(InternalTls::new(&self.system_namespace, settings.clone()));
            readiness.require_certificate();
        }
        let mut informer_loop = InformerLoop {
            model,
            expected: self.informers(),
            informers: BTreeMap::new(),
            startup: Some(BTreeMap::new()),
            metrics: KubeMetrics::new(&registry),
            worker,
            readiness,
            peers,
            publisher,
            stats,
            system_namespace: self.system_namespace.clone(),
            tracing: ClusterTracing::new(&self.observability_config_map),
            tracing_sender,
        };
        let limit = Arc::new(Semaphore::new(PROBE_CONCURRENCY));
        let (probed_tx, mut probed) = mpsc::unbounded_channel::<(ProbeJob, Outcome)>();
        let mut tunables = *informer_loop.model.tunables();
        let mut probe_tick = tokio::time::interval(tunables.probe_interval);
        probe_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut progress = tokio::time::interval(PROGRESS_EVERY);
        progress.tick().await;
        let mut gauges = tokio::time::interval(Duration::from_secs(1));
        let mut missing_slices = MissingSlices::default();
        let (looked_tx, mut looked) = mpsc::unbounded_channel::<Option<usize>>();
        loop {
            let mut tick = false;
            tokio::select! {
                Some((informer, change)) = events.next() => {
                    informer_loop.on_change(informer, change).await;
                }
                Some((job, outcome)) = probed.recv() => {
                    let ops = informer_loop.model.probed(&job, outcome);
                    if !ops.is_empty() {
                        informer_loop.emit(Informer::Endpoints, ops).await;
                    }
                }
                _ = probe_tick.tick() => tick = true,
                _ = progress.tick(), if !informer_loop.synced() => {
                    informer_loop.progress();
                    continue;
                }
                _ = gauges.tick() => {
                    informer_loop.gauges();
                    let (revisions, slices) =
                        (informer_loop.model.revision_count(), informer_loop.model.endpoints_count());
                    if matches!(self.endpoints, EndpointsApi::Slices(_))
                        && informer_loop.synced()
                        && missing_slices.due(Instant::now(), revisions, slices)
                    {
                        let (client, looked) = (self.client.clone(), looked_tx.clone());
                        tokio::spawn(async move {
                            let _ = looked.send(labelled_endpoints(client).await);
                        });
                    }
                    continue;
                }
                Some(found) = looked.recv() => {
                    let (revisions, slices) =
                        (informer_loop.model.revision_count(), informer_loop.model.endpoints_count());
                    let api = self.endpoints.describe();
                    if let Some(warning) = missing_slices.looked(found, revisions, slices, &api) {
                        tracing::warn!("{warning}");
                    }
                    continue;
                }
            }
            // config-features may have changed what others read.
            let now = *informer_loop.model.tunables();
            if now != tunables {
                if now.probe_interval != tunables.probe_interval {
                    probe_tick = tokio::time::interval(now.probe_interval);
                    probe_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                }
                tracing::info!(tunables = ?now, "{FEATURES_CONFIG_MAP}: tunables changed");
                tunables = now;
            }
            for job in informer_loop.model.probes_due(tick) {
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    // Over the concurrency bound: left for the next tick.
                    informer_loop.model.probed(&job, Outcome::Skipped);
                    continue;
                };
                let done = probed_tx.clone();
                let timeout = tunables.probe_timeout;
                let counter = informer_loop.metrics.probes.clone();
                tokio::spawn(async move {
                    let result = probe::probe(job.addr, &job.revision, job.protocol, timeout).await;
                    drop(permit);
                    counter.with_label_values(&[result.label()]).inc();
                    let outcome = match &result {
                        ProbeResult::Healthy => Outcome::Passed,
                        ProbeResult::Unhealthy(_) | ProbeResult::Answered { .. } => {
                            tracing::debug!(target = ?job.target, addr = %job.addr, revision = %job.revision, "not confirmed yet: {}", result.reason());
                            Outcome::Failed {
                                mesh_like: result.mesh_like(),
                            }
                        }
                        ProbeResult::IpReused {
                            namespace,
                            revision,
                        } => {
                            tracing::warn!(target = ?job.target, addr = %job.addr, revision = %job.revision, answered_for = %format!("{namespace}/{revision}"), "a listed pod answered for another revision; not used");
                            Outcome::Failed { mesh_like: false }
                        }
                    };
                    let _ = done.send((job, outcome));
                });
            }
        }
    }
}
