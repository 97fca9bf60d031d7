//! Kubernetes mode end to end: the real binary watching a real kube-apiserver (v1.20.2, built by
//! `scripts/kube-apiserver.sh`), as the ServiceAccount `deploy/rbac.yaml` creates, in front of
//! real backends. core/v1 Endpoints refuse loopback addresses, so every pod listens on an
//! address of the test's own [`PodNet`] (10.213.N.k, see testkit's `podnet`), inside that
//! PodNet's network namespace: nothing is bound on the host's addresses.
//!
//! Every object is what Knative's reconcilers would write: a Revision (our own minimal CRD), its
//! private Service and endpoints labelled `networking.internal.knative.dev/serviceType=Private`
//! and `serving.knative.dev/revision`, and for subsetting its public endpoints listing the
//! activators.

mod support;

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kactivator_testkit::apiserver::ApiServer;
use kactivator_testkit::backend::{self, BackendConfig, BackendHandle};
use kactivator_testkit::certs;
use kactivator_testkit::knative::{self, ServiceType};
use kactivator_testkit::podnet::PodNet;
use support::ipv6::Ipv6Net;
use support::{eventually, exchange, get, read_response, Activator};

/// The port every pod serves on (a queue-proxy's, Knative's `networking.BackendHTTPPort`).
const POD_PORT: u16 = 8012;

/// Which API lists the pods.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Listing {
    Endpoints,
    /// `discovery.k8s.io/v1beta1` on this 1.20 server (v1 came in 1.21): also the fallback path.
    Slices,
}

/// An API server with the Knative CRD and deploy/'s RBAC, and a pod network.
struct Cluster {
    api: ApiServer,
    net: PodNet,
    /// The `activator` ServiceAccount's kubeconfig: what kactivator runs as.
    kubeconfig: PathBuf,
    listing: Listing,
}

impl Cluster {
    fn start(listing: Listing) -> Cluster {
        let api = ApiServer::start();
        api.install_knative_crds();
        let rbac =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rbac.yaml"))
                .expect("deploy/rbac.yaml");
        api.apply_yaml(&rbac);
        let token = api.service_account_token("knative-serving", "activator");
        let kubeconfig = api.kubeconfig_with_token(&token);
        Cluster {
            api,
            net: PodNet::new(),
            kubeconfig,
            listing,
        }
    }

    /// A kactivator watching this cluster. `pod_ip`: its `POD_IP`.
    fn spawn_activator(&self, pod_ip: Option<IpAddr>, extra: &str) -> Activator {
        self.spawn_activator_listening(pod_ip, false, extra)
    }

    /// [`Cluster::spawn_activator`]; `on_pod_ip`: its data port listens on `POD_IP`, where
    /// `activator-service`'s endpoints say it is.
    fn spawn_activator_listening(
        &self,
        pod_ip: Option<IpAddr>,
        on_pod_ip: bool,
        extra: &str,
    ) -> Activator {
        let endpoints = match self.listing {
            Listing::Endpoints => "endpoints",
            Listing::Slices => "auto",
        };
        let settings = format!(
            "[kubernetes]\nendpoints = \"{endpoints}\"\nprobe_interval_ms = 50\n\n\
             [health]\nprobe_interval_ms = 100\nsettled_probe_interval_ms = 100\n\n{extra}"
        );
        let kubeconfig = self.kubeconfig.display().to_string();
        let prepared = match pod_ip {
            Some(ip) if on_pod_ip => Activator::prepare_on(ip, &settings, ""),
            _ => Activator::prepare(&settings, ""),
        };
        let pod_ip = pod_ip.map(|ip| ip.to_string()).unwrap_or_default();
        let mut env = vec![
            ("KUBECONFIG", kubeconfig.as_str()),
            ("SYSTEM_NAMESPACE", "knative-serving"),
        ];
        if !pod_ip.is_empty() {
            env.push(("POD_IP", pod_ip.as_str()));
        }
        prepared.spawn_args(
            &[
                "--shards",
                "2",
                "--source",
                "kubernetes",
                "--autoscaler-url",
                "",
            ],
            &env,
        )
    }

    fn activator(&self) -> Activator {
        self.spawn_activator(None, "").until_ready()
    }

    /// A pod of revision `default/<revision>` on a new address of the pod network, served
    /// from inside its namespace.
    fn pod(&self, revision: &str) -> BackendHandle {
        let ip = self.net.add_address();
        let name = format!("{revision}@{ip}");
        self.net
            .inside(|| {
                backend::spawn_on(
                    SocketAddr::new(ip, POD_PORT),
                    BackendConfig::named(name).with_revision(revision, "default"),
                )
            })
            .expect("pod backend")
    }

    /// The Revision and its private Service; `containerConcurrency` = `cc`.
    fn revision(&self, name: &str, cc: u32) {
        self.api.apply_yaml(&format!(
            "{}{}",
            knative::revision("default", name, cc),
            knative::private_service("default", name, POD_PORT)
        ));
    }

    /// The revision's private endpoints list `ready` and `not_ready` (either may be empty).
    fn endpoints(&self, name: &str, ready: &[IpAddr], not_ready: &[IpAddr]) {
        self.list(name, ServiceType::Private, ready, not_ready, POD_PORT);
    }

    /// The revision's public endpoints list these activators.
    fn public_endpoints(&self, name: &str, activators: &[IpAddr]) {
        self.list(name, ServiceType::Public, activators, &[], 8012);
    }

    fn list(
        &self,
        revision: &str,
        kind: ServiceType,
        ready: &[IpAddr],
        not_ready: &[IpAddr],
        port: u16,
    ) {
        let yaml = match self.listing {
            Listing::Endpoints => {
                knative::endpoints("default", revision, kind, ready, not_ready, port)
            }
            Listing::Slices => knative::endpoint_slice(
                "v1beta1", "default", revision, kind, ready, not_ready, port,
            ),
        };
        self.api.apply_yaml(&yaml);
    }

    /// How long after `since` the API server first answered a list as kactivator's service
    /// account (polled, for at most 30 s).
    fn answers_the_activator_from(&self, since: Instant) -> Duration {
        let answered = eventually(Duration::from_secs(30), || {
            self.api
                .try_kubectl_as(
                    &self.kubeconfig,
                    ["get", "endpoints", "-A", "-o", "name"],
                    None,
                )
                .status
                .success()
        });
        assert!(
            answered,
            "the API server never answered the activator's account"
        );
        since.elapsed()
    }

    fn features(&self, data: &[(&str, &str)]) {
        self.api.apply_yaml(&config_map("config-features", data));
    }
}

/// A ConfigMap of `knative-serving` holding `data`.
fn config_map(name: &str, data: &[(&str, &str)]) -> String {
    let data: String = data
        .iter()
        .map(|(key, value)| format!("  {key}: \"{value}\"\n"))
        .collect();
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: knative-serving\ndata:\n{data}"
    )
}

fn ip(pod: &BackendHandle) -> IpAddr {
    pod.addr().ip()
}

fn status(activator: &Activator, revision: &str, path: &str) -> u16 {
    exchange(activator.http, get(revision, path).as_bytes()).status
}

/// Keep-alive clients sending `path` to a revision until stopped; counts answers by class.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    fn start(activator: &Activator, revision: &str, path: &str, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
        let request = get(revision, path);
        let threads = (0..clients)
            .map(|_| {
                let (stop, ok, failed, failures) =
                    (stop.clone(), ok.clone(), failed.clone(), failures.clone());
                let request = request.clone();
                let addr = activator.http;
                std::thread::spawn(move || {
                    let mut connection: Option<(TcpStream, Vec<u8>)> = None;
                    while !stop.load(Ordering::Relaxed) {
                        let (stream, buffered) = connection.get_or_insert_with(|| {
                            let stream = TcpStream::connect(addr).expect("connect");
                            stream
                                .set_read_timeout(Some(Duration::from_secs(30)))
                                .unwrap();
                            (stream, Vec::new())
                        });
                        let answer = stream
                            .write_all(request.as_bytes())
                            .ok()
                            .and_then(|_| read_response(stream, buffered).ok());
                        match answer {
                            Some(response) if response.status == 200 => {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Some(response) => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                failures.lock().unwrap().push(format!(
                                    "{} {}",
                                    response.status,
                                    response.text()
                                ));
                                connection = None;
                            }
                            None => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                failures.lock().unwrap().push("no response".into());
                                connection = None;
                            }
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            ok,
            failed,
            failures,
            threads,
        }
    }

    fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    /// Waits for `more` further successes (the load is flowing).
    fn flows(&self, more: u64) -> bool {
        let from = self.ok();
        eventually(Duration::from_secs(10), || self.ok() >= from + more)
    }

    /// Stops the clients; returns (succeeded, failures).
    fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            let _ = thread.join();
        }
        let failures = self.failures.lock().unwrap().clone();
        assert_eq!(failures.len() as u64, self.failed.load(Ordering::Relaxed));
        (self.ok.load(Ordering::Relaxed), failures)
    }
}

fn serves_what_the_cluster_lists(listing: Listing) {
    let cluster = Cluster::start(listing);
    let pods = [cluster.pod("hello"), cluster.pod("hello")];
    // CC 0: random choice of two, so sequential requests reach both pods.
    cluster.revision("hello", 0);
    cluster.endpoints("hello", &[ip(&pods[0]), ip(&pods[1])], &[]);
    let activator = cluster.activator();
    assert!(
        activator
            .stderr()
            .contains("every watch has listed; the first view is published"),
        "{}",
        activator.stderr()
    );
    for _ in 0..20 {
        assert_eq!(
            status(&activator, "hello", "/"),
            200,
            "{}",
            activator.stderr()
        );
    }
    for pod in &pods {
        assert!(pod.stats().requests > 0, "both pods serve");
        assert!(pod.probes() > 0, "each was probed before it was used");
    }
    // The gauges are refreshed every second.
    assert!(
        eventually(Duration::from_secs(3), || activator.metric_sum(
            "kactivator_kubernetes_objects",
            &["kind=\"revisions\""]
        ) == 1.0),
        "{}",
        activator.metrics()
    );
    // A revision the cluster does not have is not served.
    assert_eq!(status(&activator, "nope", "/"), 404);
}

#[test]
fn core_endpoints_pods_serve_as_the_service_account() {
    serves_what_the_cluster_lists(Listing::Endpoints);
}

#[test]
fn endpoint_slices_pods_serve_with_auto_falling_back_to_v1beta1() {
    serves_what_the_cluster_lists(Listing::Slices);
}

/// `kubernetes.endpoints = "auto"` on a server that serves EndpointSlices (1.20's v1beta1) but
/// has none for Knative's Endpoints (nothing here mirrors them, as on a cluster without the
/// mirroring controller): the revision has no pod, and the log says why and names the setting
/// that fixes it, once.
#[test]
fn auto_endpoints_warn_once_naming_the_fix_when_nothing_mirrors_endpoints_into_slices() {
    let cluster = Cluster::start(Listing::Slices);
    let pod = cluster.pod("unmirrored");
    cluster.revision("unmirrored", 1);
    cluster.api.apply_yaml(&knative::endpoints(
        "default",
        "unmirrored",
        ServiceType::Private,
        &[ip(&pod)],
        &[],
        POD_PORT,
    ));
    let activator = cluster.activator();
    let warning = "nothing mirrors Knative's Endpoints into EndpointSlices";
    assert!(
        eventually(Duration::from_secs(10), || activator
            .stderr()
            .contains(warning)),
        "{}",
        activator.stderr()
    );
    let log = activator.stderr();
    assert!(
        log.contains("Set endpoints = \"endpoints\" in the [kubernetes] table"),
        "{log}"
    );
    assert_eq!(
        activator.metric_sum(
            "kactivator_revision_routable_pods",
            &["revision=\"unmirrored\""]
        ),
        0.0
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(activator.stderr().matches(warning).count(), 1, "said once");
}

#[test]
fn readiness_waits_for_every_watch_and_says_which_is_missing() {
    // Without the Revision CRD, the revisions watch cannot list: never ready, and the log
    // says which watch and why.
    let api = ApiServer::start();
    api.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: knative-serving\n");
    let rbac =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rbac.yaml")).unwrap();
    api.apply_yaml(&rbac);
    let token = api.service_account_token("knative-serving", "activator");
    let cluster = Cluster {
        kubeconfig: api.kubeconfig_with_token(&token),
        api,
        net: PodNet::new(),
        listing: Listing::Endpoints,
    };
    let activator = cluster.spawn_activator(None, "");
    assert!(
        eventually(Duration::from_secs(15), || activator
            .stderr()
            .contains("informer=\"revisions\"")
            && activator.stderr().contains("still listing")),
        "{}",
        activator.stderr()
    );
    let (code, body) = support::admin_get(activator.admin, "/readyz").expect("admin answers");
    assert_eq!(code, 503, "{body}");
    // The CRD arrives: the watch lists and the activator becomes ready.
    cluster.api.install_knative_crds();
    let _activator = activator.until_ready();
}

#[test]
fn scale_from_zero_a_waiting_request_flows_when_an_endpoint_appears() {
    let cluster = Cluster::start(Listing::Endpoints);
    cluster.revision("cold", 1);
    cluster.endpoints("cold", &[], &[]);
    let activator = cluster.activator();
    let addr = activator.http;
    let waiting = std::thread::spawn(move || exchange(addr, get("cold", "/").as_bytes()).status);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !waiting.is_finished(),
        "waits while the revision has no pod"
    );
    let pod = cluster.pod("cold");
    // Kubernetes lists it not ready first: the probe promotes it (probe optimisation).
    cluster.endpoints("cold", &[], &[ip(&pod)]);
    assert_eq!(waiting.join().unwrap(), 200);
    assert_eq!(pod.stats().requests, 1);
}

/// IPv6-only and dual-stack clusters list pods at IPv6 addresses, in Endpoints and in
/// EndpointSlices of `addressType: IPv6`: the pod is probed and served there.
#[test]
fn pods_at_ipv6_addresses_serve_from_endpoints_and_ipv6_endpoint_slices() {
    for listing in [Listing::Endpoints, Listing::Slices] {
        let cluster = Cluster::start(listing);
        let net = Ipv6Net::new();
        cluster.revision("six", 1);
        let pod = backend::spawn_on(
            SocketAddr::new(net.host, POD_PORT),
            BackendConfig::named("pod-6").with_revision("six", "default"),
        )
        .expect("a pod at an IPv6 address");
        cluster.endpoints("six", &[net.host], &[]);
        let activator = cluster.activator();
        assert!(
            eventually(Duration::from_secs(10), || status(&activator, "six", "/")
                == 200),
            "{:?}: {}",
            cluster.listing,
            activator.stderr()
        );
        assert!(pod.stats().requests >= 1);
    }
}

#[test]
fn a_listed_pod_answering_for_another_revision_is_never_used() {
    let cluster = Cluster::start(Listing::Endpoints);
    cluster.revision("mine", 1);
    let good = cluster.pod("mine");
    let reused = cluster.pod("mine");
    reused.set_revision("default", "theirs").unwrap();
    cluster.endpoints("mine", &[ip(&good), ip(&reused)], &[]);
    let activator = cluster.activator();
    for _ in 0..20 {
        assert_eq!(status(&activator, "mine", "/"), 200);
    }
    assert_eq!(reused.stats().requests, 0);
    assert!(reused.probes() > 0);
    assert!(
        activator.metric_sum(
            "kactivator_kubernetes_backend_probes_total",
            &["result=\"ip_reused\""]
        ) >= 1.0
    );
}

/// `mesh-compatibility-mode` is `auto` (no `config-network`): pods a sidecar guards refuse the
/// activator's direct probes, and the revision is reached through its private Service instead,
/// as upstream's activator does, with the ready pods still counted for its capacity.
#[test]
fn in_auto_mesh_mode_pods_behind_a_mesh_are_reached_through_their_private_service() {
    let cluster = Cluster::start(Listing::Endpoints);
    let service_ip = cluster.net.add_service_address();
    // What a sidecar answers a plain probe to its pod: 503.
    let pods = [cluster.pod("meshed"), cluster.pod("meshed")];
    for pod in &pods {
        pod.set_probe_healthy(false);
    }
    // The Service (kube-proxy, and the mesh behind it) reaches a queue-proxy that answers.
    let service = cluster
        .net
        .inside(|| {
            backend::spawn_on(
                SocketAddr::new(service_ip, 80),
                BackendConfig::named("meshed-service").with_revision("meshed", "default"),
            )
        })
        .expect("service backend");
    cluster.api.apply_yaml(&format!(
        "{}{}",
        knative::revision("default", "meshed", 2),
        knative::private_service_at("default", "meshed", POD_PORT, Some(service_ip))
    ));
    cluster.endpoints("meshed", &[ip(&pods[0]), ip(&pods[1])], &[]);
    let activator = cluster.activator();
    for _ in 0..10 {
        assert_eq!(
            status(&activator, "meshed", "/"),
            200,
            "{}",
            activator.stderr()
        );
    }
    assert!(service.stats().requests >= 10);
    for pod in &pods {
        assert!(pod.probes() > 0, "each pod was tried directly first");
        assert_eq!(pod.stats().requests, 0, "no request went to a pod directly");
    }
    assert!(
        activator
            .stderr()
            .contains("the revision goes through the Service"),
        "{}",
        activator.stderr()
    );
    // containerConcurrency 2 × 2 ready pods, one activator.
    assert_eq!(
        activator.metric_sum("kactivator_revision_capacity", &["revision=\"meshed\""]),
        4.0,
        "{}",
        activator.metrics()
    );
}

/// `knative-serving/activator-service`'s Endpoints, one subset per activator (each at its own
/// data port, named `http`, beside an `http2` port that must not be used).
fn activator_service(activators: &[&Activator]) -> String {
    let mut yaml = String::from(
        "apiVersion: v1\nkind: Endpoints\nmetadata:\n  name: activator-service\n  \
         namespace: knative-serving\nsubsets:\n",
    );
    for activator in activators {
        let http = activator.http;
        yaml.push_str(&format!(
            "- addresses:\n  - ip: {}\n  ports:\n  - name: http2\n    port: 8013\n  \
             - name: http\n    port: {}\n",
            http.ip(),
            http.port()
        ));
    }
    if activators.is_empty() {
        yaml.push_str("  []\n");
    }
    yaml.push_str("---\n");
    yaml
}

/// A queue-proxy registration is relayed to the other activators `activator-service` lists,
/// as they are when it arrives, and never to the activator itself.
#[test]
fn registrations_are_relayed_to_the_other_activators_of_activator_service() {
    let cluster = Cluster::start(Listing::Endpoints);
    let pod = cluster.pod("relayed");
    cluster.revision("relayed", 1);
    cluster.endpoints("relayed", &[ip(&pod)], &[]);
    // Activators run in the host's namespace, at host-side addresses of the pod network.
    let (first_ip, second_ip) = (
        cluster.net.add_host_address(),
        cluster.net.add_host_address(),
    );
    let first = cluster
        .spawn_activator_listening(Some(first_ip), true, "")
        .until_ready();
    let second = cluster
        .spawn_activator_listening(Some(second_ip), true, "")
        .until_ready();
    cluster
        .api
        .apply_yaml(&activator_service(&[&first, &second]));
    assert!(
        eventually(Duration::from_secs(5), || first.stderr().contains(
            &format!("registration relay peers peers=[{}]", second.http)
        )),
        "{}",
        first.stderr()
    );
    let register = |activator: &Activator| {
        let client = kactivator_testkit::queue_proxy::QueueProxyClient::new(
            activator.http,
            "default",
            "relayed",
            "relayed-pod",
            ip(&pod),
        );
        let (status, body) = client.send_blocking("ready");
        assert_eq!(status, 200, "{body}");
    };
    let relays = |activator: &Activator, result: &str| {
        activator.metric_sum(
            "activator_pod_registration_relays_total",
            &[&format!("result=\"{result}\"")],
        )
    };
    let heard = |activator: &Activator| {
        activator.metric_sum(
            "activator_pod_registrations_total",
            &["result=\"accepted\""],
        )
    };
    register(&first);
    assert!(
        eventually(Duration::from_secs(5), || relays(&first, "accepted") == 1.0),
        "{}",
        first.metrics()
    );
    assert_eq!(heard(&second), 1.0, "the peer applied it");
    assert_eq!(relays(&first, "failed") + relays(&first, "refused"), 0.0);
    assert_eq!(
        relays(&second, "accepted"),
        0.0,
        "a relayed event is not relayed back"
    );
    // The second activator leaves the Service: no longer a peer.
    cluster.api.apply_yaml(&activator_service(&[&first]));
    assert!(eventually(Duration::from_secs(5), || first
        .stderr()
        .contains("registration relay peers peers=[]")));
    register(&first);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(relays(&first, "accepted"), 1.0);
    assert_eq!(heard(&second), 1.0);
}

#[test]
fn a_removed_pod_finishes_its_requests_and_gets_no_new_ones() {
    let cluster = Cluster::start(Listing::Endpoints);
    let pods = [cluster.pod("busy"), cluster.pod("busy")];
    cluster.revision("busy", 1);
    cluster.endpoints("busy", &[ip(&pods[0]), ip(&pods[1])], &[]);
    let activator = cluster.activator();
    let load = Load::start(&activator, "busy", "/delay/50", 4);
    assert!(load.flows(20));
    assert!(pods[1].stats().requests > 0);
    cluster.endpoints("busy", &[ip(&pods[0])], &[]);
    assert!(
        eventually(Duration::from_secs(5), || pods[1].stats().in_flight == 0),
        "its requests finished"
    );
    let after = pods[1].stats().requests;
    assert!(load.flows(40));
    assert_eq!(pods[1].stats().requests, after, "nothing new reached it");
    let (ok, failures) = load.finish();
    assert!(failures.is_empty(), "{failures:?} of {ok}");
}

#[test]
fn config_features_flip_under_load_without_a_failure() {
    let cluster = Cluster::start(Listing::Endpoints);
    let pods = [cluster.pod("flip"), cluster.pod("flip")];
    cluster.revision("flip", 2);
    cluster.endpoints("flip", &[ip(&pods[0]), ip(&pods[1])], &[]);
    let activator = cluster.activator();
    let load = Load::start(&activator, "flip", "/", 4);
    assert!(load.flows(50));
    // Quarantine on (the default): routable pods are health-checked every 100 ms.
    let probes = |pods: &[BackendHandle]| pods.iter().map(BackendHandle::probes).sum::<u64>();
    let before = probes(&pods);
    assert!(eventually(Duration::from_secs(5), || probes(&pods) > before + 4));
    cluster.features(&[
        ("activator.pod-quarantine", "disabled"),
        ("queueproxy.pod-authority", "disabled"),
    ]);
    assert!(
        eventually(Duration::from_secs(5), || {
            let now = probes(&pods);
            std::thread::sleep(Duration::from_millis(400));
            probes(&pods) == now
        }),
        "quarantine off: health checks stop"
    );
    assert!(load.flows(50));
    // A bad value is logged and keeps the previous one.
    cluster.features(&[
        ("activator.pod-quarantine", "sometimes"),
        ("activator.queue-depth", "lots"),
    ]);
    assert!(eventually(Duration::from_secs(5), || {
        let log = activator.stderr();
        log.contains("activator.pod-quarantine") && log.contains("activator.queue-depth")
    }));
    let now = probes(&pods);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(probes(&pods), now, "still off");
    cluster.features(&[("activator.pod-quarantine", "enabled")]);
    assert!(eventually(Duration::from_secs(5), || probes(&pods) > now));
    assert!(load.flows(50));
    let (ok, failures) = load.finish();
    assert!(failures.is_empty(), "{failures:?} of {ok}");
}

/// Tracing as a 1.18 cluster and then a 1.19+ one configure it: config-tracing decides until
/// config-observability names a `tracing-*` key, a change applies live, a value upstream would
/// refuse keeps the tracing in force (one line naming the map and the key), and a deleted
/// config-observability hands the decision back. Each `tracing:` line is written when, and
/// only when, the tracing channel's value changed (`informers.rs`, `tracing_map`).
#[test]
fn tracing_follows_config_observability_over_config_tracing_and_a_bad_value_keeps_it() {
    let cluster = Cluster::start(Listing::Endpoints);
    let zipkin = "http://zipkin.istio-system.svc.cluster.local:9411/api/v2/spans";
    cluster.api.apply_yaml(&config_map(
        "config-tracing",
        &[
            ("backend", "zipkin"),
            ("zipkin-endpoint", zipkin),
            ("sample-rate", "0.5"),
        ],
    ));
    let observability_1_18 = config_map(
        "config-observability",
        &[("metrics.backend-destination", "prometheus")],
    );
    cluster.api.apply_yaml(&observability_1_18);
    let activator = cluster.activator();
    let said = |line: &str, times: usize| {
        eventually(Duration::from_secs(10), || {
            activator.stderr().matches(line).count() == times
        })
    };
    let from_zipkin = format!(
        "tracing: zipkin to {zipkin}, sampling 0.5, from knative-serving/config-tracing \
         (config-observability names no tracing-* key)"
    );
    assert!(said(&from_zipkin, 1), "{}", activator.stderr());

    let otlp = |rate: &str| {
        config_map(
            "config-observability",
            &[
                ("tracing-protocol", "grpc"),
                (
                    "tracing-endpoint",
                    "http://otel-collector.observability:4317",
                ),
                ("tracing-sampling-rate", rate),
            ],
        )
    };
    cluster.api.apply_yaml(&otlp("0.25"));
    let from_otlp = |rate: &str| {
        format!(
            "tracing: grpc to http://otel-collector.observability:4317, sampling {rate}, from \
             knative-serving/config-observability's tracing-* keys"
        )
    };
    assert!(said(&from_otlp("0.25"), 1), "{}", activator.stderr());

    cluster.api.apply_yaml(&otlp("lots"));
    assert!(
        said(
            "tracing settings not applied: knative-serving/config-observability: \
             tracing-sampling-rate: \"lots\" is not a number; keeping the tracing in force \
             (grpc to http://otel-collector.observability:4317, sampling 0.25)",
            1
        ),
        "{}",
        activator.stderr()
    );
    assert!(eventually(Duration::from_secs(3), || activator.metric_sum(
        "kactivator_kubernetes_invalid_objects_total",
        &["informer=\"config-observability\""]
    ) == 1.0));

    cluster.api.apply_yaml(&otlp("1"));
    assert!(said(&from_otlp("1"), 1), "{}", activator.stderr());

    // Back to what 1.18 has: config-tracing decides again.
    cluster.api.apply_yaml(&observability_1_18);
    assert!(said(&from_zipkin, 2), "{}", activator.stderr());
    assert!(
        !activator
            .stderr()
            .contains("tracing settings not applied: knative-serving/config-tracing"),
        "{}",
        activator.stderr()
    );
}

/// `activator.max-queued-requests` caps the requests waiting over every revision, from the
/// first view on, and a new value applies while the activator runs.
#[test]
fn config_features_caps_the_requests_waiting_over_all_revisions() {
    let cluster = Cluster::start(Listing::Endpoints);
    cluster.features(&[("activator.max-queued-requests", "2")]);
    for name in ["cold-a", "cold-b"] {
        cluster.revision(name, 1);
        cluster.endpoints(name, &[], &[]);
    }
    let activator = cluster.activator();
    let send = |name: &'static str| {
        let http = activator.http;
        std::thread::spawn(move || exchange(http, get(name, "/").as_bytes()))
    };
    let queued = || activator.metric_sum("kactivator_revision_queued", &[]);
    let mut waiting = vec![send("cold-a"), send("cold-b")];
    assert!(eventually(Duration::from_secs(5), || queued() == 2.0));
    // Each revision is far below its own queue depth; the process is full.
    let refused = exchange(activator.http, get("cold-a", "/").as_bytes());
    assert_eq!(
        (refused.status, refused.text().as_str()),
        (503, "pending request queue full\n")
    );
    // Raised while running: the state worker's shell says so once it set the new cap.
    cluster.features(&[("activator.max-queued-requests", "3")]);
    assert!(
        eventually(Duration::from_secs(10), || activator
            .stderr()
            .contains("process queue cap set max_queued_requests=3")),
        "{}",
        activator.stderr()
    );
    waiting.push(send("cold-b"));
    assert!(eventually(Duration::from_secs(5), || queued() == 3.0));
    // A pod for each revision: every waiter is served.
    let pods = [cluster.pod("cold-a"), cluster.pod("cold-b")];
    cluster.endpoints("cold-a", &[ip(&pods[0])], &[]);
    cluster.endpoints("cold-b", &[ip(&pods[1])], &[]);
    for waiter in waiting {
        assert_eq!(waiter.join().unwrap().status, 200);
    }
}

#[test]
fn two_activators_in_the_public_endpoints_split_the_pods() {
    let cluster = Cluster::start(Listing::Endpoints);
    let pods = [
        cluster.pod("split"),
        cluster.pod("split"),
        cluster.pod("split"),
        cluster.pod("split"),
    ];
    cluster.revision("split", 1);
    let ips: Vec<IpAddr> = pods.iter().map(ip).collect();
    cluster.endpoints("split", &ips, &[]);
    // Activators run in the host's namespace, at host-side addresses of the pod network.
    let (first_ip, second_ip) = (
        cluster.net.add_host_address(),
        cluster.net.add_host_address(),
    );
    cluster.public_endpoints("split", &[first_ip, second_ip]);
    let first = cluster.spawn_activator(Some(first_ip), "").until_ready();
    let second = cluster.spawn_activator(Some(second_ip), "").until_ready();
    let labels = ["revision=\"split\""];
    let routable =
        |activator: &Activator| activator.metric_sum("kactivator_revision_routable_pods", &labels);
    assert!(
        eventually(Duration::from_secs(5), || routable(&first)
            + routable(&second)
            == 4.0
            && routable(&first) >= 1.0
            && routable(&second) >= 1.0),
        "4 pods split, each activator gets some: {} + {}",
        routable(&first),
        routable(&second)
    );
    // Each serves only through its own share.
    let served_by = |activator: &Activator| -> Vec<bool> {
        pods.iter().for_each(BackendHandle::reset_stats);
        for _ in 0..40 {
            assert_eq!(status(activator, "split", "/"), 200);
        }
        pods.iter().map(|pod| pod.stats().requests > 0).collect()
    };
    let (by_first, by_second) = (served_by(&first), served_by(&second));
    for (a, b) in by_first.iter().zip(&by_second) {
        assert!(!(a & b), "a pod served by both: {by_first:?} {by_second:?}");
    }
}

/// After an API server outage the watches are back within [`WATCHES_BACK_WITHIN`] of the
/// server answering kactivator again: the watch backoff is capped at 1 s (kube-rs's default,
/// client-go's, grew to 30 s over the restarting server's refusals, so a change made right
/// after the restart was followed 19-49 s later).
const WATCHES_BACK_WITHIN: Duration = Duration::from_secs(2);

#[test]
fn an_api_server_outage_loses_no_request_and_changes_made_meanwhile_apply_after() {
    let mut cluster = Cluster::start(Listing::Endpoints);
    let pods = [
        cluster.pod("steady"),
        cluster.pod("steady"),
        cluster.pod("steady"),
    ];
    cluster.revision("steady", 1);
    cluster.endpoints("steady", &[ip(&pods[0])], &[]);
    let activator = cluster.activator();
    let load = Load::start(&activator, "steady", "/", 4);
    assert!(load.flows(50));
    cluster.api.kill_apiserver();
    assert!(load.flows(200), "serving on the last snapshot");
    // A change made while this activator's API server is away: through a second API server on
    // the same etcd, which then goes away too.
    {
        let spare = cluster.api.spare_apiserver();
        spare.apply_yaml(&knative::endpoints(
            "default",
            "steady",
            ServiceType::Private,
            &[ip(&pods[0]), ip(&pods[1])],
            &[],
            POD_PORT,
        ));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(pods[1].stats().requests, 0, "not seen yet");
    cluster.api.restart_apiserver();
    let restarted = Instant::now();
    let (changed, answering, followed) = std::thread::scope(|scope| {
        // When the server answers kactivator's service account again (a restarted server may
        // refuse it for a moment while its RBAC cache fills): no watch can be back before.
        let answering = scope.spawn(|| cluster.answers_the_activator_from(restarted));
        // When each change is followed: the pod it added gets requests.
        let followed = scope.spawn(|| {
            let mut followed: [Option<Duration>; 2] = [None, None];
            eventually(Duration::from_secs(30), || {
                for (pod, at) in [&pods[1], &pods[2]].into_iter().zip(&mut followed) {
                    if at.is_none() && pod.stats().requests > 0 {
                        *at = Some(restarted.elapsed());
                    }
                }
                followed.iter().all(Option::is_some)
            });
            followed
        });
        // A change made right after the restart.
        cluster.endpoints("steady", &[ip(&pods[0]), ip(&pods[1]), ip(&pods[2])], &[]);
        let changed = restarted.elapsed();
        let answering = answering.join().expect("polling thread");
        (changed, answering, followed.join().expect("polling thread"))
    });
    eprintln!(
        "after the restart: the change applied at {changed:?}, the activator's service \
         account answered at {answering:?}, the change made meanwhile followed at {:?}, the \
         change made after at {:?}",
        followed[0], followed[1]
    );
    let [Some(meanwhile), Some(after)] = followed else {
        panic!(
            "changes not followed within 30 s ({followed:?}): {}",
            activator.stderr()
        );
    };
    // Each change is followed within the bound of the moment the watches could first see it.
    for (what, followed, since) in [
        ("made meanwhile", meanwhile, answering),
        ("made after", after, answering.max(changed)),
    ] {
        assert!(
            followed < since + WATCHES_BACK_WITHIN,
            "the change {what} was followed {:?} after the server could first tell it: {}",
            followed - since,
            activator.stderr()
        );
    }
    assert!(load.flows(50));
    let (ok, failures) = load.finish();
    assert!(failures.is_empty(), "{failures:?} of {ok}");
    assert!(
        activator.metric_sum("kactivator_kubernetes_watch_restarts_total", &[]) >= 1.0,
        "{}",
        activator.metrics()
    );
}

/// An h2c Revision whose pod speaks only HTTP/2 (a plain grpcio server, no queue-proxy in
/// front): the backend prober checks the listed pod over h2c with the gRPC health check, so it
/// becomes routable and a gRPC call through the activator is served. Probed over HTTP/1.1, the
/// pod never passed and the call waited for a pod until its deadline.
#[test]
fn an_h2c_revisions_http2_only_pod_is_probed_over_h2c_and_serves() {
    use kactivator_testkit::grpc::{connect, pb::EchoRequest};
    use kactivator_testkit::grpcio::{GrpcioPod, Health};

    let cluster = Cluster::start(Listing::Endpoints);
    let pod_ip = cluster.net.add_address();
    // Started from inside the pods' network namespace, where its address is.
    let pod = cluster
        .net
        .inside(|| {
            GrpcioPod::spawn(
                SocketAddr::new(pod_ip, POD_PORT),
                "grpc-pod",
                Health::Absent,
            )
        })
        .expect("grpcio pod");
    cluster.api.apply_yaml(&format!(
        "{}{}",
        knative::h2c_revision("default", "grpc", 0),
        knative::private_service("default", "grpc", POD_PORT)
    ));
    cluster.endpoints("grpc", &[pod_ip], &[]);
    let activator = cluster.activator();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the gRPC client");
    let reply = runtime.block_on(async {
        let mut client = connect(activator.http2, "grpc.default.svc.cluster.local")
            .await
            .expect("connect");
        let mut request = tonic::Request::new(EchoRequest {
            payload: "ping".into(),
            delay_ms: 0,
            reply_bytes: 0,
        });
        request.set_timeout(Duration::from_secs(10));
        client.unary(request).await
    });
    let reply = reply
        .unwrap_or_else(|status| panic!("{status:?}\n{}", activator.stderr()))
        .into_inner();
    assert_eq!(
        (reply.payload.as_ref(), reply.backend.as_str()),
        (&b"ping"[..], "grpc-pod")
    );
    assert!(pod.health_checks() >= 1, "{:?}", pod.lines());
    assert!(
        activator.metric_sum(
            "kactivator_kubernetes_backend_probes_total",
            &["result=\"healthy\""]
        ) >= 1.0,
        "{}",
        activator.metrics()
    );
}

/// A Revision's `kactivator.knative.dev/priority` annotation turns its priority policy on (here
/// with the priority header trusted, as behind a hop that sets it): a high-band request that
/// arrives behind waiting low-band ones is served first, and the per-band counters show for
/// that revision only.
#[test]
fn the_priority_annotation_orders_the_revisions_waiting_requests() {
    let cluster = Cluster::start(Listing::Endpoints);
    cluster.revision("ranked", 1);
    let annotated = cluster.api.kubectl([
        "annotate",
        "revision",
        "ranked",
        "-n",
        "default",
        "kactivator.knative.dev/priority=bands=3,priority_header_trusted=true",
    ]);
    assert!(
        annotated.status.success(),
        "{}",
        String::from_utf8_lossy(&annotated.stderr)
    );
    let pod = cluster.pod("ranked");
    cluster.endpoints("ranked", &[ip(&pod)], &[]);
    let activator = cluster.activator();
    let send = |label: &'static str, path: &'static str, priority: &'static str| {
        let addr = activator.http;
        std::thread::spawn(move || {
            let raw = format!(
                "GET {path} HTTP/1.1\r\nHost: example.com\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: ranked\r\n{priority}\r\n"
            );
            let status = exchange(addr, raw.as_bytes()).status;
            (label, status, Instant::now())
        })
    };
    let queued = |count: f64| {
        eventually(Duration::from_secs(10), || {
            activator.metric_sum("kactivator_revision_queued", &["revision_name=\"ranked\""])
                == count
        })
    };
    // The pod's one slot is held; two low requests wait, then a high one.
    let holder = send("holder", "/delay/600", "");
    assert!(
        eventually(Duration::from_secs(10), || pod.stats().in_flight == 1),
        "the holder is at the pod"
    );
    let mut waiting = vec![send("low-0", "/delay/50", "K-Priority: 0\r\n")];
    assert!(queued(1.0));
    waiting.push(send("low-1", "/delay/50", "K-Priority: 0\r\n"));
    assert!(queued(2.0));
    waiting.push(send("high", "/delay/50", "K-Priority: 2\r\n"));
    assert!(queued(3.0), "{}", activator.metrics());
    assert_eq!(holder.join().unwrap().1, 200);
    let mut answers: Vec<_> = waiting
        .into_iter()
        .map(|thread| thread.join().unwrap())
        .collect();
    answers.sort_by_key(|&(_, _, at)| at);
    let order: Vec<(&str, u16)> = answers
        .iter()
        .map(|&(label, status, _)| (label, status))
        .collect();
    assert_eq!(order, [("high", 200), ("low-0", 200), ("low-1", 200)]);
    assert_eq!(
        activator.metric_sum(
            "kactivator_priority_requests_total",
            &["revision_name=\"ranked\"", "band=\"2\""]
        ),
        1.0
    );
    assert_eq!(pod.stats().max_in_flight, 1);
}

// === system-internal-tls (issue 38, `reference/tls.md` §2, §5) ===

/// The names Knative's certificates carry: the activator's (`kn-routing`, checked by
/// ingresses) and the one both sides share.
const ROUTING_NAME: &str = "kn-routing";
const DATA_PLANE_NAME: &str = "data-plane.knative.dev";

/// A pod under system-internal-tls: kactivator's queue-proxy of revision `default/<revision>`
/// at a new address of `net`, plain on 8012 (where the activator probes it) and TLS on 8112
/// with `serving` as Knative mounts `serving-certs`, in front of an app inside the namespace.
struct TlsPod {
    ip: IpAddr,
    proxy: support::queue_proxy::QueueProxy,
    _app: kactivator_testkit::grpc::GrpcHandle,
    net_name: String,
}

fn tls_pod(net: &PodNet, revision: &str, serving: &certs::Issued) -> TlsPod {
    tls_pod_at(
        net,
        net.add_address(),
        kactivator_control::tls::KNATIVE_POD_TLS_PORT,
        revision,
        serving,
    )
}

/// [`tls_pod`] at `ip`, with TLS on `tls_port`.
fn tls_pod_at(
    net: &PodNet,
    ip: IpAddr,
    tls_port: u16,
    revision: &str,
    serving: &certs::Issued,
) -> TlsPod {
    let certs = support::scratch_dir();
    serving.write(&certs, "tls");
    let user_port = kactivator_testkit::ports::free_port();
    let mut env = support::queue_proxy::knative_env(user_port, POD_PORT, 0);
    env.insert("SERVING_REVISION".into(), revision.into());
    env.insert("SERVING_POD_IP".into(), ip.to_string());
    env.insert("QUEUE_SERVING_TLS_PORT".into(), tls_port.to_string());
    let (app, proxy) = net.inside(|| {
        // HTTP/1.1 and h2c on one port: the queue-proxy passes HTTP/2 on as h2c.
        let app = kactivator_testkit::grpc::spawn_grpc_on(
            SocketAddr::from(([127, 0, 0, 1], user_port)),
            BackendConfig::named(format!("{revision}-app")),
        )
        .expect("the app");
        let args = ["--drain-grace-seconds", "1", "--certs-dir"];
        let mut args: Vec<&str> = args.to_vec();
        args.push(certs.to_str().expect("UTF-8"));
        (
            app,
            support::queue_proxy::QueueProxy::start_with(env, &args),
        )
    });
    TlsPod {
        ip,
        proxy,
        _app: app,
        net_name: net.namespace().to_string(),
    }
}

impl TlsPod {
    /// TLS handshakes the queue-proxy completed on its TLS port.
    fn handshakes(&self, net: &PodNet) -> f64 {
        assert_eq!(net.namespace(), self.net_name);
        net.inside(|| {
            self.proxy
                .metric("kactivator_shard_tls_handshakes_total", &[])
        })
    }
}

/// An ingress request over TLS to the activator's TLS port as Kourier sends it for an HTTP/1
/// revision (verifying `kn-routing` against `ca`, HTTP/1.1), for `default/<revision>`:
/// `(curl ok, stdout with headers, stderr)`.
fn ingress(https: SocketAddr, ca: &std::path::Path, revision: &str) -> (bool, String, String) {
    ingress_with(https, ca, revision, "--http1.1")
}

fn ingress_with(
    https: SocketAddr,
    ca: &std::path::Path,
    revision: &str,
    version: &str,
) -> (bool, String, String) {
    let port = https.port();
    let output = std::process::Command::new("curl")
        .args(["-sS", "-i", "--max-time", "20", version, "--cacert"])
        .arg(ca)
        .args([
            "--resolve",
            &format!("{ROUTING_NAME}:{port}:{}", https.ip()),
        ])
        .args(["-H", "Knative-Serving-Namespace: default"])
        .args(["-H", &format!("Knative-Serving-Revision: {revision}")])
        .arg(format!("https://{ROUTING_NAME}:{port}/"))
        .output()
        .expect("curl is installed");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The CA Knative's certificates come from (`knative-selfsigned-ca`), and its certificate
/// written to a scratch file for clients to trust.
fn knative_ca() -> (certs::TestCa, std::path::PathBuf) {
    let ca = certs::TestCa::new("knative-selfsigned-ca");
    let file = ca.write(&support::scratch_dir(), "ca.pem");
    (ca, file)
}

impl Cluster {
    /// `routing-serving-certs` as cert-manager writes it: the activator's certificate (SANs
    /// `kn-routing`, `data-plane.knative.dev`) issued by `ca`, and `ca` as `ca.crt`.
    fn routing_serving_certs(&self, ca: &certs::TestCa) {
        let pair = ca.issue(&[ROUTING_NAME, DATA_PLANE_NAME]);
        self.api.apply_yaml(&knative::routing_serving_certs(
            &pair.chain,
            &pair.key,
            ca.pem(),
        ));
    }

    /// An activator with its TLS data port on a free loopback port (Knative's is 8112).
    fn spawn_tls_activator(&self) -> (Activator, SocketAddr) {
        self.spawn_tls_activator_with(&[])
    }

    /// [`Cluster::spawn_tls_activator`] with more environment.
    fn spawn_tls_activator_with(&self, env: &[(&str, &str)]) -> (Activator, SocketAddr) {
        let https = SocketAddr::from(([127, 0, 0, 1], kactivator_testkit::ports::free_port()));
        let endpoints = match self.listing {
            Listing::Endpoints => "endpoints",
            Listing::Slices => "auto",
        };
        let settings = format!(
            "[kubernetes]\nendpoints = \"{endpoints}\"\nprobe_interval_ms = 50\n\n\
             [health]\nprobe_interval_ms = 100\nsettled_probe_interval_ms = 100\n"
        );
        let kubeconfig = self.kubeconfig.display().to_string();
        let activator = Activator::prepare_listen(&settings, "", &format!("https = \"{https}\""))
            .spawn_args(
                &[
                    "--shards",
                    "2",
                    "--source",
                    "kubernetes",
                    "--autoscaler-url",
                    "",
                ],
                &[
                    &[
                        ("KUBECONFIG", kubeconfig.as_str()),
                        ("SYSTEM_NAMESPACE", "knative-serving"),
                    ],
                    env,
                ]
                .concat(),
            );
        (activator, https)
    }
}

/// Done-when of issue 38: a cluster set up as Knative's system-internal TLS routes ingress →
/// kactivator's activator (TLS port) → kactivator's queue-proxy (8112) → app. Until
/// `routing-serving-certs` exists the activator runs, not ready, saying why (upstream crash
/// loops); the plain ports keep serving; a rotated certificate serves new handshakes with no
/// request failing meanwhile.
#[test]
fn system_internal_tls_routes_ingress_to_activator_to_queue_proxy_over_tls() {
    let cluster = Cluster::start(Listing::Endpoints);
    cluster.api.apply_yaml(&knative::config_network(&[(
        "system-internal-tls",
        "Enabled",
    )]));
    let (ca, ca_file) = knative_ca();
    let dir = ca_file.parent().expect("a scratch directory").to_path_buf();
    let pod = tls_pod(
        &cluster.net,
        "secure",
        &ca.issue(&["kn-user-default", DATA_PLANE_NAME]),
    );
    cluster.revision("secure", 0);
    cluster.endpoints("secure", &[pod.ip], &[]);

    let (activator, https) = cluster.spawn_tls_activator();
    // No Secret yet: up, not ready, and saying why.
    let said = eventually(Duration::from_secs(15), || {
        support::admin_get(activator.admin, "/readyz")
            .is_some_and(|(status, body)| status != 200 && body.contains("no certificate"))
    });
    assert!(
        said,
        "readiness: {:?}\n{}",
        support::admin_get(activator.admin, "/readyz"),
        activator.stderr()
    );
    assert!(
        activator
            .stderr()
            .contains("routing-serving-certs not found"),
        "{}",
        activator.stderr()
    );

    cluster.routing_serving_certs(&ca);
    let activator = activator.until_ready();
    let (ok, out, err) = ingress(https, &ca_file, "secure");
    assert!(ok, "{err}\n{}", activator.stderr());
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("x-backend: secure-app"), "{out}");
    // HTTP/2 by ALPN too (an ingress in front of an h2c revision).
    let (ok, out, err) = ingress_with(https, &ca_file, "secure", "--http2");
    assert!(ok && out.starts_with("HTTP/2 200"), "{out}\n{err}");
    assert!(out.contains("x-backend: secure-app"), "{out}");
    // The queue-proxy's leg was TLS: its TLS port completed the activator's handshake.
    assert!(
        pod.handshakes(&cluster.net) >= 1.0,
        "{}",
        pod.proxy.stderr()
    );
    // The plain ports stay (upstream cannot turn them off).
    assert_eq!(status(&activator, "secure", "/"), 200);

    // Rotation to a certificate of a new CA (cert-manager renews with a new key): while an
    // ingress trusting both opens a new connection per request, none fails, and the new
    // certificate is served.
    let next_ca = certs::TestCa::new("knative-selfsigned-ca-2");
    let both = dir.join("both.pem");
    std::fs::write(&both, format!("{}{}", ca.pem(), next_ca.pem())).unwrap();
    let next_file = next_ca.write(&dir, "next.pem");
    assert!(
        !ingress(https, &next_file, "secure").0,
        "the new CA is not served yet"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stop, both) = (stop.clone(), both.clone());
        std::thread::spawn(move || {
            let mut results = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                results.push(ingress(https, &both, "secure"));
            }
            results
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let rotated = next_ca.issue(&[ROUTING_NAME, DATA_PLANE_NAME]);
    cluster.api.apply_yaml(&knative::routing_serving_certs(
        &rotated.chain,
        &rotated.key,
        ca.pem(),
    ));
    let served = eventually(Duration::from_secs(10), || {
        ingress(https, &next_file, "secure").0
    });
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let results = load.join().unwrap();
    assert!(
        served,
        "the rotated certificate was never served: {}",
        activator.stderr()
    );
    assert!(results.len() >= 3, "{} requests", results.len());
    for (ok, out, err) in &results {
        assert!(*ok && out.starts_with("HTTP/1.1 200"), "{out}\n{err}");
    }
    assert!(activator
        .stderr()
        .contains("the certificate changed; new TLS handshakes use it"));
}

/// The activator dials queue-proxies as upstream's does: the certificate must chain to the
/// Secret's `ca.crt` or a `networking.knative.dev/trust-bundle` ConfigMap and carry
/// `kn-user-<namespace>`; a pod that fails is never reached in plain instead, and the log says
/// why in upstream's words. A bundle added later is trusted for new connections.
#[test]
fn queue_proxies_are_verified_by_namespace_and_trust_bundle() {
    let cluster = Cluster::start(Listing::Endpoints);
    cluster.api.apply_yaml(&knative::config_network(&[(
        "system-internal-tls",
        "enabled",
    )]));
    let (ca, ca_file) = knative_ca();
    cluster.routing_serving_certs(&ca);
    // A pod whose certificate names another namespace.
    let wrong_name = tls_pod(
        &cluster.net,
        "elsewhere",
        &ca.issue(&["kn-user-other", DATA_PLANE_NAME]),
    );
    // A pod whose certificate comes from a CA nobody trusts yet.
    let other_net = PodNet::new();
    let other_ca = certs::TestCa::new("team-ca");
    let untrusted = tls_pod(
        &other_net,
        "bundled",
        &other_ca.issue(&["kn-user-default", DATA_PLANE_NAME]),
    );
    for (revision, pod) in [("elsewhere", &wrong_name), ("bundled", &untrusted)] {
        cluster.revision(revision, 0);
        cluster.endpoints(revision, &[pod.ip], &[]);
    }
    let (activator, https) = cluster.spawn_tls_activator();
    let activator = activator.until_ready();

    let asked = std::time::Instant::now();
    let (_, out, _) = ingress(https, &ca_file, "elsewhere");
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
    assert!(out.contains("TLS handshake failed"), "{out}");
    // As upstream, at once: the pod would refuse a second handshake alike (no retries).
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "the 502 took {:?}",
        asked.elapsed()
    );
    let log = activator.stderr();
    assert!(
        log.contains(
            "san \"kn-user-default\" does not have a matching name in [\"kn-user-other\", \"data-plane.knative.dev\"]"
        ),
        "{log}"
    );
    assert!(
        log.contains(&format!("dialled={}:8112", wrong_name.ip)),
        "{log}"
    );
    let (_, out, _) = ingress(https, &ca_file, "bundled");
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
    assert_eq!(wrong_name.handshakes(&cluster.net), 0.0);
    assert_eq!(untrusted.handshakes(&other_net), 0.0);

    cluster.api.apply_yaml(&knative::trust_bundle(
        "knative-bundle",
        &[("team.pem", other_ca.pem())],
    ));
    let trusted = eventually(Duration::from_secs(10), || {
        let (ok, out, _) = ingress(https, &ca_file, "bundled");
        ok && out.starts_with("HTTP/1.1 200")
    });
    assert!(trusted, "{}", activator.stderr());
    assert!(untrusted.handshakes(&other_net) >= 1.0);
}

/// `system-internal-tls` and its legacy `internal-encryption` are read as upstream reads them
/// (a value it cannot read stops start-up in its words); the `ACTIVATOR_TLS_*` settings apply
/// to the TLS data port, and one upstream refuses stops start-up too, naming it; with TLS off,
/// a TLS port asked for is refused rather than left without certificates.
#[test]
fn system_internal_tls_settings_are_read_as_upstream_reads_them() {
    let cluster = Cluster::start(Listing::Endpoints);
    let exits = |network: &[(&str, &str)], env: &[(&str, &str)], said: &str| {
        cluster.api.apply_yaml(&knative::config_network(network));
        let (mut activator, _) = cluster.spawn_tls_activator_with(env);
        assert!(
            activator
                .wait_exit(Duration::from_secs(15))
                .is_some_and(|code| code != 0),
            "{network:?} {env:?}: it started"
        );
        assert!(
            activator.stderr().contains(said),
            "{said}: {}",
            activator.stderr()
        );
    };
    exits(
        &[("system-internal-tls", "sometimes")],
        &[],
        "system-internal-tls with value: \"sometimes\" in config-network ConfigMap is not supported",
    );
    exits(
        &[("system-internal-tls", "Enabled")],
        &[("ACTIVATOR_TLS_MIN_VERSION", "1.1")],
        "ACTIVATOR_TLS_MIN_VERSION: \"1.1\" is not a TLS version",
    );
    exits(
        &[("system-internal-tls", "disabled")],
        &[],
        "listen.https: is served with config-network's system-internal-tls on",
    );

    // The legacy key turns it on; TLS 1.2 allowed by ACTIVATOR_TLS_MIN_VERSION is served.
    let (ca, ca_file) = knative_ca();
    cluster.routing_serving_certs(&ca);
    cluster.api.apply_yaml(&knative::config_network(&[
        ("system-internal-tls", ""),
        ("internal-encryption", "true"),
    ]));
    let tls12 = |https: SocketAddr| {
        let port = https.port();
        std::process::Command::new("curl")
            .args([
                "-sS",
                "-o",
                "/dev/null",
                "--max-time",
                "10",
                "--tlsv1.2",
                "--tls-max",
                "1.2",
            ])
            .arg("--cacert")
            .arg(&ca_file)
            .args(["--resolve", &format!("{ROUTING_NAME}:{port}:127.0.0.1")])
            .arg(format!("https://{ROUTING_NAME}:{port}/"))
            .output()
            .expect("curl is installed")
    };
    let (activator, https) = cluster.spawn_tls_activator();
    let activator = activator.until_ready();
    let refused = tls12(https);
    assert!(!refused.status.success(), "TLS 1.2 served by default");
    drop(activator);
    let (activator, https) =
        cluster.spawn_tls_activator_with(&[("ACTIVATOR_TLS_MIN_VERSION", "1.2")]);
    let _activator = activator.until_ready();
    let served = tls12(https);
    assert!(
        served.status.success(),
        "{}",
        String::from_utf8_lossy(&served.stderr)
    );
}

/// In cluster-IP mode (`mesh-compatibility-mode: enabled`) the activator dials the revision's
/// private Service over TLS on 443, as upstream does (`pkg/http/proxy.go`); here the Service's
/// address leads straight to a queue-proxy taking TLS on 443 (kube-proxy's 443 → 8112).
#[test]
fn in_mesh_mode_the_private_service_is_dialled_over_tls_on_443() {
    let cluster = Cluster::start(Listing::Endpoints);
    cluster.api.apply_yaml(&knative::config_network(&[
        ("system-internal-tls", "Enabled"),
        ("mesh-compatibility-mode", "enabled"),
    ]));
    let (ca, ca_file) = knative_ca();
    cluster.routing_serving_certs(&ca);
    let service_ip = cluster.net.add_service_address();
    let service = tls_pod_at(
        &cluster.net,
        service_ip,
        kactivator_control::tls::KNATIVE_SERVICE_TLS_PORT,
        "meshed",
        &ca.issue(&["kn-user-default", DATA_PLANE_NAME]),
    );
    let pod_ip = cluster.net.add_address();
    cluster.api.apply_yaml(&format!(
        "{}{}",
        knative::revision("default", "meshed", 0),
        knative::private_service_at("default", "meshed", POD_PORT, Some(service_ip))
    ));
    cluster.endpoints("meshed", &[pod_ip], &[]);
    let (activator, https) = cluster.spawn_tls_activator();
    let activator = activator.until_ready();
    let (ok, out, err) = ingress(https, &ca_file, "meshed");
    assert!(
        ok && out.starts_with("HTTP/1.1 200"),
        "{out}\n{err}\n{}",
        activator.stderr()
    );
    assert!(out.contains("x-backend: meshed-app"), "{out}");
    assert!(service.handshakes(&cluster.net) >= 1.0);
}
