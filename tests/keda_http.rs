//! KEDA's HTTP add-on role end to end (issue 40): the real binary (`kactivator keda-http`)
//! watching a real kube-apiserver (v1.20.2) that serves the add-on's own CRDs (HTTPScaledObjects,
//! and InterceptorRoutes but in the first test, which plays an add-on before 0.14),
//! as the ServiceAccount `deploy/keda-http/rbac.yaml` makes, in front of real backends on a pod
//! network (testkit's `podnet`: EndpointSlices refuse loopback addresses). The test plays
//! every other part: the user (HTTPScaledObjects and Services as users write them), the
//! endpoint controller (EndpointSlices, v1beta1 on this server, as it would publish them when
//! KEDA scales the Deployment), and KEDA (a client generated from KEDA's `externalscaler.proto`:
//! `StreamIsActive` held open, `GetMetricSpec` and `GetMetrics` polled).

mod support;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kactivator_testkit::apiserver::ApiServer;
use kactivator_testkit::backend::{self, BackendConfig, BackendHandle};
use kactivator_testkit::keda::{self, pb, HttpScaledObject};
use kactivator_testkit::podnet::PodNet;
use kactivator_testkit::ports::free_port;
use support::{eventually, exchange, Activator};

/// The port the pods serve on (the Service's target port).
const POD_PORT: u16 = 8080;
/// The Service's own port, which the HTTPScaledObjects name.
const SERVICE_PORT: u16 = 80;
/// The add-on's namespace, where deploy/keda-http/ installs the role.
const KEDA_NAMESPACE: &str = "keda";

/// Which of the add-on's CRDs a test's API server has.
enum Crds {
    /// v0.15.0's HTTPScaledObject and InterceptorRoute.
    Current,
    /// The HTTPScaledObject alone, as before 0.14.
    Before0_14,
    /// The InterceptorRoute as 0.16 declares `staticRoutes` and the cold-start cap (the add-on's
    /// `main` after v0.15.0, with #1733's two fields).
    V0_16,
}

/// An API server with the add-on's CRDs and the role's RBAC, and a pod network.
struct Cluster {
    api: ApiServer,
    net: PodNet,
    /// The role's ServiceAccount's kubeconfig: what kactivator runs as.
    kubeconfig: PathBuf,
}

impl Cluster {
    fn start() -> Cluster {
        Cluster::start_with(Crds::Current)
    }

    /// [`Cluster::start`] with the add-on's CRDs of `crds`.
    fn start_with(crds: Crds) -> Cluster {
        let api = ApiServer::start();
        match crds {
            Crds::Current => api.install_keda_http_crds(),
            Crds::Before0_14 => api.install_http_scaled_object_crd(),
            Crds::V0_16 => api.install_keda_http_crds_0_16(),
        }
        api.apply_yaml(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {KEDA_NAMESPACE}\n"
        ));
        let rbac = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/keda-http/rbac.yaml"
        ))
        .expect("deploy/keda-http/rbac.yaml");
        // What kustomize's `namespace: keda` does for the namespaced objects.
        api.kubectl_with_input(["apply", "-n", KEDA_NAMESPACE, "-f", "-"], &rbac);
        let token = api.service_account_token(KEDA_NAMESPACE, "keda-add-ons-http-interceptor");
        let kubeconfig = api.kubeconfig_with_token(&token);
        Cluster {
            api,
            net: PodNet::new(),
            kubeconfig,
        }
    }

    /// `kactivator keda-http` watching this cluster, ready; its scaler's address.
    fn interceptor(&self, env: &[(&str, &str)]) -> (Activator, SocketAddr) {
        self.interceptor_prepared(Activator::prepare("", ""), env)
    }

    /// [`Cluster::interceptor`] with its data and admin ports on `ip` (a host address of the
    /// pod network, where the admin Service's EndpointSlice lists it), the admin port `admin`.
    fn interceptor_at(
        &self,
        ip: IpAddr,
        admin: u16,
        env: &[(&str, &str)],
    ) -> (Activator, SocketAddr) {
        let mut prepared = Activator::prepare_on(ip, "", "");
        prepared.admin = SocketAddr::new(ip, admin);
        self.interceptor_prepared(prepared, env)
    }

    fn interceptor_prepared(
        &self,
        prepared: Activator,
        env: &[(&str, &str)],
    ) -> (Activator, SocketAddr) {
        let scaler = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let http = prepared.http.to_string();
        let admin = prepared.admin.to_string();
        let kubeconfig = self.kubeconfig.display().to_string();
        let scaler_port = scaler.port().to_string();
        // The add-on's metrics port (2223) on a port of its own, unless the test chose one.
        let metrics_port = free_port().to_string();
        let mut all_env = vec![
            ("KUBECONFIG", kubeconfig.as_str()),
            ("KEDA_HTTP_SCALER_PORT", scaler_port.as_str()),
        ];
        if !env.iter().any(|(key, _)| *key == "OTEL_PROM_EXPORTER_PORT") {
            all_env.push(("OTEL_PROM_EXPORTER_PORT", metrics_port.as_str()));
        }
        all_env.extend_from_slice(env);
        let activator = prepared
            .spawn_args(
                &[
                    "keda-http",
                    "--shards",
                    "2",
                    "--http",
                    &http,
                    "--admin",
                    &admin,
                ],
                &all_env,
            )
            .until_ready();
        (activator, scaler)
    }

    /// A pod on a new address of the pod network, served from inside its namespace.
    fn pod(&self, name: &str) -> (IpAddr, BackendHandle) {
        let ip = self.net.add_address();
        let pod = self
            .net
            .inside(|| backend::spawn_on(SocketAddr::new(ip, POD_PORT), BackendConfig::named(name)))
            .expect("pod backend");
        (ip, pod)
    }

    /// Service `name` in `default`, port [`SERVICE_PORT`] to the pods' [`POD_PORT`].
    fn service(&self, name: &str) {
        self.api.apply_yaml(&keda::service(
            "default",
            name,
            SERVICE_PORT,
            POD_PORT,
            None,
        ));
    }

    /// Service `app`, one ready pod `app-1` listed in its EndpointSlice, and
    /// HTTPScaledObject `app` ([`app_object`], no paths, no annotation) routing to it.
    /// Its address and its backend.
    fn app_with_a_ready_pod(&self) -> (IpAddr, BackendHandle) {
        self.service("app");
        let (ip, pod) = self.pod("app-1");
        self.endpoints("app", &[ip], &[]);
        self.api.apply_yaml(&app_object(&[], "", ""));
        (ip, pod)
    }

    /// [`Cluster::app_with_a_ready_pod`] with its pod listed not ready: the route at zero.
    fn app_with_a_pod_not_ready(&self) -> (IpAddr, BackendHandle) {
        self.service("app");
        let (ip, pod) = self.pod("app-1");
        self.endpoints("app", &[], &[ip]);
        self.api.apply_yaml(&app_object(&[], "", ""));
        (ip, pod)
    }

    /// Service `app` whose port is `appProtocol: kubernetes.io/h2c`, and one ready pod behind
    /// it, the gRPC test backend configured by `config`.
    fn h2c_app(&self, config: BackendConfig) -> kactivator_testkit::grpc::GrpcHandle {
        self.api.apply_yaml(&keda::service(
            "default",
            "app",
            SERVICE_PORT,
            POD_PORT,
            Some("kubernetes.io/h2c"),
        ));
        let ip = self.net.add_address();
        let app = self
            .net
            .inside(|| {
                kactivator_testkit::grpc::spawn_grpc_on(SocketAddr::new(ip, POD_PORT), config)
            })
            .expect("the h2c pod");
        self.endpoints("app", &[ip], &[]);
        app
    }

    /// The endpoint controller's EndpointSlice of Service `name`.
    fn endpoints(&self, name: &str, ready: &[IpAddr], not_ready: &[IpAddr]) {
        self.api.apply_yaml(&keda::endpoint_slice(
            "v1beta1", "default", name, ready, not_ready, POD_PORT,
        ));
    }
}

/// HTTPScaledObject `app` for `app.example.com` to Service `app`, with `paths`, `annotations` and
/// `extra` as [`HttpScaledObject`] takes them.
fn app_object(paths: &[&str], annotations: &str, extra: &str) -> String {
    HttpScaledObject {
        name: "app",
        hosts: &["app.example.com"],
        paths,
        service: "app",
        port: SERVICE_PORT,
        annotations,
        extra,
    }
    .yaml()
}

/// A WebSocket to `/ws` of `app.example.com` through the interceptor at `http`.
async fn websocket(
    http: SocketAddr,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = format!("ws://{http}/ws").into_client_request().unwrap();
    request
        .headers_mut()
        .insert("Host", "app.example.com".parse().unwrap());
    let (socket, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("a websocket handshake through the interceptor");
    assert_eq!(response.status(), 101);
    socket
}

fn request(host: &str, path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").into_bytes()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The one value KEDA reads for HTTPScaledObject `default/app`.
async fn metric(
    client: &mut pb::external_scaler_client::ExternalScalerClient<tonic::transport::Channel>,
    scaler: SocketAddr,
) -> i64 {
    let reference = keda::scaled_object_ref("default", "app", &scaler.to_string());
    let values = client
        .get_metrics(pb::GetMetricsRequest {
            scaled_object_ref: Some(reference),
            metric_name: "s0-http-default_002Fapp".into(),
        })
        .await
        .expect("GetMetrics")
        .into_inner()
        .metric_values;
    assert_eq!(values.len(), 1, "{values:?}");
    assert_eq!(values[0].metric_name, "http-default_002Fapp");
    values[0].metric_value
}

#[test]
fn an_http_scaled_object_routes_holds_scales_from_zero_and_reports_to_keda() {
    // An add-on before 0.14: no InterceptorRoutes served, and the role runs on without them.
    let cluster = Cluster::start_with(Crds::Before0_14);
    cluster.service("app");
    cluster.endpoints("app", &[], &[]);
    cluster.api.apply_yaml(&app_object(&[], "", ""));
    let (interceptor, scaler) = cluster.interceptor(&[]);
    let rt = runtime();
    let mut client = rt
        .block_on(keda::connect(scaler))
        .expect("the scaler answers");
    let reference = keda::scaled_object_ref("default", "app", &scaler.to_string());

    // The chart's gRPC probes: both services serving once ready; an unknown one refused.
    let serving = keda::health::health_check_response::ServingStatus::Serving as i32;
    for service in ["liveness", "readiness"] {
        let status = rt.block_on(keda::health(scaler, service));
        assert_eq!(status.expect("a health answer"), serving, "{service}");
    }
    assert!(rt
        .block_on(keda::health(scaler, "no-such-service"))
        .is_err());

    // What KEDA asks first: the metric's name, byte for byte, and its target (the add-on's
    // default of 100 when the object sets none).
    let spec = rt
        .block_on(client.get_metric_spec(reference.clone()))
        .expect("GetMetricSpec")
        .into_inner();
    assert_eq!(spec.metric_specs.len(), 1);
    assert_eq!(spec.metric_specs[0].metric_name, "http-default_002Fapp");
    assert_eq!(spec.metric_specs[0].target_size, 100);
    assert_eq!(rt.block_on(metric(&mut client, scaler)), 0);
    let active = rt
        .block_on(client.is_active(reference.clone()))
        .expect("IsActive")
        .into_inner();
    assert!(!active.result);

    // The add-on's admin probes, as its chart asks them.
    for path in ["/livez", "/readyz"] {
        let answer = support::admin_get(interceptor.admin, path);
        assert_eq!(answer.map(|(status, _)| status), Some(200), "{path}");
    }

    // A host no object routes: the add-on's 404.
    let unrouted = exchange(interceptor.http, &request("other.example.com", "/"));
    assert_eq!(unrouted.status, 404);
    assert_eq!(unrouted.text(), "Not Found\n");

    // KEDA holds the stream open; a request arrives at zero pods and is held.
    let mut stream = rt
        .block_on(client.stream_is_active(reference.clone()))
        .expect("StreamIsActive")
        .into_inner();
    let first = rt
        .block_on(stream.message())
        .expect("a message")
        .expect("the stream goes on");
    assert!(!first.result, "nothing yet");
    let http = interceptor.http;
    let sent = Instant::now();
    let held = std::thread::spawn(move || exchange(http, &request("app.example.com", "/")));
    let activated = rt.block_on(async {
        loop {
            let message = stream.message().await.expect("a message").expect("more");
            if message.result {
                return sent.elapsed();
            }
        }
    });
    eprintln!("StreamIsActive said true {activated:?} after the request was sent");
    // The add-on's contract is one stream tick (200 ms); generous here for two shared cores.
    assert!(
        activated < Duration::from_secs(2),
        "activity told only after {activated:?}"
    );
    assert_eq!(
        rt.block_on(metric(&mut client, scaler)),
        1,
        "the held request counts"
    );
    assert!(!held.is_finished(), "held while no endpoint is ready");

    // KEDA scales the Deployment; the endpoint controller publishes the ready pod.
    let (ip, pod) = cluster.pod("app-1");
    cluster.endpoints("app", &[ip], &[]);
    let response = held.join().expect("the held request");
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("X-KEDA-HTTP-Cold-Start"), Some("true"));
    let warm = exchange(interceptor.http, &request("app.example.com", "/"));
    assert_eq!(warm.status, 200);
    assert_eq!(warm.header("X-KEDA-HTTP-Cold-Start"), Some("false"));
    // What the app sees of the request: the add-on's forwarding edits, and the fields the
    // activator's and queue-proxy's roles would have read (`K-Original-Host`, Knative's revision
    // headers) passed on as any other field, never acted on.
    let seen = exchange(
        interceptor.http,
        b"GET /headers HTTP/1.1\r\nHost: app.example.com\r\nK-Original-Host: elsewhere.example\r\n\
          Knative-Serving-Revision: hello-00001\r\nForwarded: for=6.6.6.6\r\n\
          X-Forwarded-For: 1.2.3.4\r\nX-Forwarded-Proto: https\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(seen.status, 200, "{}", seen.text());
    let seen: serde_json::Value = serde_json::from_slice(&seen.body).expect("the app's JSON");
    let field = |name: &str| -> Vec<String> {
        seen["headers"]
            .as_array()
            .expect("headers")
            .iter()
            .filter(|pair| pair[0].as_str().unwrap().eq_ignore_ascii_case(name))
            .map(|pair| pair[1].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(field("host"), ["app.example.com"]);
    assert_eq!(field("k-original-host"), ["elsewhere.example"]);
    assert_eq!(field("knative-serving-revision"), ["hello-00001"]);
    assert!(
        field("forwarded").is_empty(),
        "Go's Rewrite drops Forwarded"
    );
    assert_eq!(field("x-forwarded-for"), ["1.2.3.4, 127.0.0.1"]);
    assert_eq!(field("x-forwarded-host"), ["app.example.com"]);
    assert_eq!(field("x-forwarded-proto"), ["https"], "the client's kept");
    assert_eq!(pod.stats().requests, 3);
    assert!(
        eventually(Duration::from_secs(5), || rt
            .block_on(metric(&mut client, scaler))
            == 0),
        "nothing in flight once both are answered"
    );

    // The object goes: so does its route.
    cluster.api.kubectl([
        "delete",
        "httpscaledobject.http.keda.sh",
        "-n",
        "default",
        "app",
    ]);
    assert!(eventually(Duration::from_secs(10), || {
        exchange(interceptor.http, &request("app.example.com", "/")).status == 404
    }));
    let gone = rt.block_on(client.get_metric_spec(reference));
    assert_eq!(
        gone.expect_err("no such object").code(),
        tonic::Code::NotFound
    );

    // The add-on upgraded under a running role: its InterceptorRoute CRD is installed, and an
    // InterceptorRoute routes without a restart.
    cluster.api.install_keda_http_crds();
    cluster.api.apply_yaml(
        "apiVersion: http.keda.sh/v1beta1
kind: InterceptorRoute
metadata:
  namespace: default
  name: later
spec:
  target:
    service: app
    port: 80
  rules:
  - hosts: [app.example.com]
  scalingMetric:
    concurrency:
      targetValue: 10
",
    );
    assert!(
        eventually(Duration::from_secs(20), || {
            exchange(interceptor.http, &request("app.example.com", "/")).status == 200
        }),
        "the InterceptorRoute routes once its CRD is served"
    );
}

/// InterceptorRoute `app` (the add-on's 0.14 and later) as a user writes one: two rules (a host
/// and path; a header on any host), both metrics, a limit of one per pod.
const APP_ROUTE: &str = "apiVersion: http.keda.sh/v1beta1
kind: InterceptorRoute
metadata:
  namespace: default
  name: app
  annotations:
    kactivator.dev/container-concurrency: \"1\"
spec:
  target:
    service: app
    port: 80
  rules:
  - hosts: [chat.example.com]
    paths:
    - value: /v1
  - headers:
    - name: X-Model
      value: llama
  scalingMetric:
    concurrency:
      targetValue: 4
    requestRate:
      targetValue: 10
      window: 1m
      granularity: 1s
";

#[test]
fn an_interceptor_route_routes_by_its_rules_over_its_namesake_and_reports_both_metrics() {
    let cluster = Cluster::start();
    let (ip, pod) = cluster.app_with_a_ready_pod();
    let (interceptor, scaler) = cluster.interceptor(&[]);
    // Whether a request reaches the pod (any answer of the app's, which says so in
    // `X-Backend`), or gets the add-on's 404.
    let routed = |host: &str, path: &str, extra: &str| {
        let head =
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n");
        let response = exchange(interceptor.http, head.as_bytes());
        if response.header("X-Backend").is_some() {
            return true;
        }
        assert_eq!(
            (response.status, response.text().as_str()),
            (404, "Not Found\n")
        );
        false
    };
    assert!(routed("app.example.com", "/", ""), "the object routes");

    // The user adds an InterceptorRoute of the same name: it routes instead (the add-on's
    // precedence), by each of its rules.
    cluster.api.apply_yaml(&format!("{APP_ROUTE}---\n"));
    assert!(
        eventually(Duration::from_secs(10), || !routed(
            "app.example.com",
            "/",
            ""
        )),
        "the object no longer routes"
    );
    assert!(routed("chat.example.com", "/v1/chat", ""));
    assert!(routed("chat.example.com", "/v1", ""));
    assert!(!routed("chat.example.com", "/v2", ""), "not under /v1");
    assert!(
        !routed("chat.example.com", "/v10", ""),
        "/v1 is a whole segment"
    );
    assert!(routed("any.example.org", "/", "X-Model: llama\r\n"));
    assert!(!routed("any.example.org", "/", "X-Model: gpt\r\n"));
    let served = pod.stats().requests;

    // KEDA, for a ScaledObject whose trigger names the route: both metrics, by the route's
    // names, as floats.
    let rt = runtime();
    let mut client = rt.block_on(keda::connect(scaler)).expect("the scaler");
    let reference = keda::interceptor_route_ref("default", "app-so", "app", &scaler.to_string());
    let specs = rt
        .block_on(client.get_metric_spec(reference.clone()))
        .expect("GetMetricSpec")
        .into_inner()
        .metric_specs;
    let specs: Vec<(String, i64, f64)> = specs
        .into_iter()
        .map(|spec| (spec.metric_name, spec.target_size, spec.target_size_float))
        .collect();
    assert_eq!(
        specs,
        [
            ("http_app_concurrency".to_owned(), 0, 4.0),
            ("http_app_rate".to_owned(), 0, 10.0)
        ]
    );
    let value = |client: &mut pb::external_scaler_client::ExternalScalerClient<_>, name: &str| {
        let values = rt
            .block_on(client.get_metrics(pb::GetMetricsRequest {
                scaled_object_ref: Some(reference.clone()),
                metric_name: name.into(),
            }))
            .expect("GetMetrics")
            .into_inner()
            .metric_values;
        assert_eq!(values.len(), 1, "{name}: {values:?}");
        assert_eq!(values[0].metric_name, name);
        assert_eq!(
            values[0].metric_value, 0,
            "an InterceptorRoute's values are floats"
        );
        values[0].metric_value_float
    };
    assert!(
        eventually(Duration::from_secs(5), || value(
            &mut client,
            "http_app_rate"
        ) > 0.0),
        "{served} requests in the window"
    );
    assert_eq!(value(&mut client, "http_app_concurrency"), 0.0);
    let active = rt
        .block_on(client.is_active(reference.clone()))
        .expect("IsActive")
        .into_inner();
    assert!(active.result, "a rate above zero is activity");
    // The object it shadows still answers KEDA, from the same route's counts, as the add-on's.
    let object = keda::scaled_object_ref("default", "app", &scaler.to_string());
    let spec = rt
        .block_on(client.get_metric_spec(object))
        .expect("the shadowed object's spec")
        .into_inner();
    assert_eq!(spec.metric_specs[0].metric_name, "http-default_002Fapp");

    // Scaled to zero: a request holds, and counts.
    cluster.endpoints("app", &[], &[ip]);
    let labels = ["revision=\"app\""];
    assert!(eventually(Duration::from_secs(10), || interceptor
        .metric_sum("kactivator_revision_routable_pods", &labels)
        == 0.0));
    let http = interceptor.http;
    let held = std::thread::spawn(move || {
        exchange(
            http,
            b"GET / HTTP/1.1\r\nHost: chat.example.com\r\nX-Model: llama\r\nConnection: close\r\n\r\n",
        )
    });
    assert!(
        eventually(Duration::from_secs(5), || value(
            &mut client,
            "http_app_concurrency"
        ) == 1.0),
        "the held request counts"
    );
    cluster.endpoints("app", &[ip], &[]);
    let response = held.join().expect("the held request");
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("X-KEDA-HTTP-Cold-Start"), Some("true"));

    // The route goes: the object routes again; KEDA's trigger on the route is told so.
    cluster.api.kubectl([
        "delete",
        "interceptorroute.http.keda.sh",
        "-n",
        "default",
        "app",
    ]);
    assert!(eventually(Duration::from_secs(10), || routed(
        "app.example.com",
        "/",
        ""
    )));
    let gone = rt.block_on(client.get_metric_spec(reference));
    assert_eq!(
        gone.expect_err("no such route").code(),
        tonic::Code::NotFound
    );
}

/// InterceptorRoutes with placeholders as the add-on's documentation writes them: `page` from a
/// labelled ConfigMap's pages, `inline` with its own body and status, scaling on its rate.
const PLACEHOLDER_ROUTES: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  namespace: default
  name: pages
  labels:
    http.keda.sh/response-body: \"true\"
data:
  index.html: \"<html><p>warming up</p></html>\"
  style.css: \"p { color: gray }\"
---
apiVersion: http.keda.sh/v1beta1
kind: InterceptorRoute
metadata:
  namespace: default
  name: page
spec:
  target:
    service: app
    port: 80
  rules:
  - hosts: [page.example.com]
  scalingMetric:
    concurrency:
      targetValue: 10
  coldStart:
    placeholder:
      response:
        bodyFromConfigMap:
          name: pages
        headers:
          Retry-After: \"5\"
---
apiVersion: http.keda.sh/v1beta1
kind: InterceptorRoute
metadata:
  namespace: default
  name: inline
spec:
  target:
    service: app
    port: 80
  rules:
  - hosts: [inline.example.com]
  scalingMetric:
    requestRate:
      targetValue: 10
  coldStart:
    placeholder:
      response:
        statusCode: 202
        body: soon
---
";

#[test]
fn a_placeholder_answers_at_once_while_no_endpoint_is_ready_and_still_scales_the_route() {
    let cluster = Cluster::start();
    cluster.service("app");
    cluster.endpoints("app", &[], &[]);
    cluster.api.apply_yaml(PLACEHOLDER_ROUTES);
    let (interceptor, scaler) = cluster.interceptor(&[]);
    let get = |host: &str, path: &str| {
        let head = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let sent = Instant::now();
        let response = exchange(interceptor.http, head.as_bytes());
        assert!(
            sent.elapsed() < Duration::from_secs(2),
            "answered at once, not held: {:?}",
            sent.elapsed()
        );
        response
    };

    // The ConfigMap's page for `/`, its type from the key; the route's own field; no
    // cold-start field (the add-on sets it only on a pod's response).
    let index = get("page.example.com", "/");
    assert_eq!(index.status, 503);
    assert_eq!(index.text(), "<html><p>warming up</p></html>");
    assert_eq!(
        index.header("Content-Type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(index.header("Retry-After"), Some("5"));
    assert_eq!(index.header("X-KEDA-HTTP-Cold-Start"), None);
    let css = get("page.example.com", "/style.css");
    assert_eq!(css.text(), "p { color: gray }");
    assert_eq!(css.header("Content-Type"), Some("text/css; charset=utf-8"));
    let missing = get("page.example.com", "/favicon.ico");
    assert_eq!((missing.status, missing.body.len()), (503, 0));

    // An inline body, over HTTP/1 and HTTP/2 alike, sniffed as Go's server sniffs it.
    let inline = get("inline.example.com", "/");
    assert_eq!((inline.status, inline.text().as_str()), (202, "soon"));
    assert_eq!(
        inline.header("Content-Type"),
        Some("text/plain; charset=utf-8")
    );
    let url = format!("http://{}/", interceptor.http);
    let (ok, out) = support::curl(&[
        "--http2-prior-knowledge",
        "-D",
        "-",
        "-H",
        "Host: inline.example.com",
        &url,
    ]);
    assert!(ok);
    let out = String::from_utf8_lossy(&out).to_lowercase();
    assert!(out.starts_with("http/2 202"), "{out}");
    assert!(
        out.contains("content-type: text/plain; charset=utf-8"),
        "{out}"
    );
    assert!(out.ends_with("soon"), "{out}");

    // Answered, but counted: KEDA sees the route's rate and scales it.
    let rt = runtime();
    let mut client = rt.block_on(keda::connect(scaler)).expect("the scaler");
    let reference =
        keda::interceptor_route_ref("default", "inline-so", "inline", &scaler.to_string());
    assert!(
        eventually(Duration::from_secs(5), || rt
            .block_on(client.is_active(reference.clone()))
            .expect("IsActive")
            .into_inner()
            .result),
        "a request answered by the placeholder is activity: {:?} {:?}",
        support::admin_get(interceptor.admin, "/queue"),
        rt.block_on(client.get_metrics(pb::GetMetricsRequest {
            scaled_object_ref: Some(reference.clone()),
            metric_name: String::new(),
        }))
    );

    // Once a pod is ready, requests go to it.
    let (ip, pod) = cluster.pod("app-1");
    cluster.endpoints("app", &[ip], &[]);
    assert!(eventually(Duration::from_secs(10), || get(
        "page.example.com",
        "/"
    )
    .header("X-Backend")
        == Some("app-1")));
    assert!(pod.stats().requests >= 1);
}

#[test]
fn the_priority_annotation_serves_a_routes_waiting_requests_by_band() {
    let cluster = Cluster::start();
    cluster.service("app");
    let (ip, pod) = cluster.pod("app-1");
    cluster.endpoints("app", &[ip], &[]);
    // One request at a time per pod, three bands; clients may lower their band, not raise it.
    cluster.api.apply_yaml(&app_object(
        &[],
        "    kactivator.dev/container-concurrency: \"1\"\n    kactivator.dev/priority: \"bands=3\"",
        "",
    ));
    let (interceptor, _scaler) = cluster.interceptor(&[]);
    let http = interceptor.http;
    let send = move |path: &str, band: Option<u8>| {
        let band = band.map_or(String::new(), |band| format!("K-Priority: {band}\r\n"));
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: app.example.com\r\n{band}Connection: close\r\n\r\n"
        );
        std::thread::spawn(move || {
            let response = exchange(http, head.as_bytes());
            (response.status, Instant::now())
        })
    };
    let queued =
        || interceptor.metric_sum("kactivator_revision_queued", &["revision_name=\"app\""]);

    // The pod's one slot is taken; a lowered request waits, then one at the default band.
    let busy = send("/delay/1500", None);
    assert!(eventually(Duration::from_secs(5), || pod.stats().in_flight == 1));
    let low = send("/delay/1", Some(0));
    assert!(eventually(Duration::from_secs(5), || queued() == 1.0));
    let normal = send("/delay/1", None);
    assert!(eventually(Duration::from_secs(5), || queued() == 2.0));
    let (busy, low, normal) = (
        busy.join().unwrap(),
        low.join().unwrap(),
        normal.join().unwrap(),
    );
    assert_eq!((busy.0, low.0, normal.0), (200, 200, 200));
    assert!(
        normal.1 < low.1,
        "the default band is served before the one that arrived first but asked for less"
    );
    assert_eq!(pod.stats().max_in_flight, 1);
}

/// A Service port with `appProtocol: kubernetes.io/h2c` (the add-on's 0.15) whose pod speaks
/// gRPC only over HTTP/2, and says which protocol each request reached it over: an HTTP/2
/// client's requests, gRPC included, reach it in h2c.
#[test]
fn an_h2c_service_ports_pod_gets_http2_clients_in_h2c_grpc_included() {
    use kactivator_testkit::grpc;
    let cluster = Cluster::start();
    let app = cluster.h2c_app(BackendConfig::named("app-h2c"));
    cluster.api.apply_yaml(&app_object(&[], "", ""));
    let (interceptor, _scaler) = cluster.interceptor(&[]);

    let rt = runtime();
    let reply = rt
        .block_on(async {
            let mut client = grpc::connect(interceptor.http, "app.example.com").await?;
            let reply = client
                .unary(grpc::pb::EchoRequest {
                    payload: "ping".into(),
                    delay_ms: 0,
                    reply_bytes: 0,
                })
                .await?;
            Ok::<_, grpc::BoxError>(reply.into_inner())
        })
        .expect("a unary call through the interceptor");
    assert_eq!(reply.backend, "app-h2c");
    assert_eq!(reply.payload, b"ping".to_vec());

    // Plain HTTP/2 reaches it as HTTP/2, its `:authority` the client's. (An HTTP/1.1 client's
    // request goes on as HTTP/1.1: requests keep their protocol, README, not yet the add-on's
    // h2c for every client.)
    let plain = rt
        .block_on(grpc::h2c_request(
            interceptor.http,
            "app.example.com",
            hyper::Method::GET,
            "/",
            &[],
        ))
        .expect("an HTTP/2 request through the interceptor");
    assert_eq!(plain.status(), 200);
    assert_eq!(plain.headers()["x-http-version"], "HTTP/2.0");
    assert_eq!(plain.headers()["x-request-authority"], "app.example.com");
    assert_eq!(app.stats().requests, 2);
}

/// A pod that speaks only HTTP/2 behind an `appProtocol: kubernetes.io/h2c` port serves
/// HTTP/1.1 clients too, as behind the add-on: each request reaches it in h2c (the `Host` as
/// `:authority`), a chunked upload goes up with its trailer and the answer, which has no length,
/// comes back chunked with the pod's trailers; `Expect: 100-continue` is answered; a HEAD has
/// no body. A client that leaves while the pod works resets the pod's stream, and the pod's one
/// slot goes to the next request once the pod has heard, not before (never two at once) and
/// not only when the abandoned work would have ended.
#[test]
fn a_pod_that_speaks_only_http2_serves_http1_clients_in_h2c() {
    use kactivator_testkit::raw_http1::Connection;
    let cluster = Cluster::start();
    let app = cluster.h2c_app(BackendConfig::named("app-h2").http2_only());
    cluster.api.apply_yaml(&app_object(
        &[],
        "    kactivator.dev/container-concurrency: \"1\"",
        "",
    ));
    let (interceptor, _scaler) = cluster.interceptor(&[]);
    let http = interceptor.http;

    // curl, HTTP/1.1.
    let (ok, out) = support::curl(&[
        "--http1.1",
        "-i",
        "-H",
        "Host: app.example.com",
        &format!("http://{http}/"),
    ]);
    let out = String::from_utf8_lossy(&out).to_lowercase();
    assert!(ok && out.starts_with("http/1.1 200"), "{out}");
    assert!(out.contains("x-http-version: http/2.0"), "{out}");
    assert!(
        out.contains("x-request-authority: app.example.com"),
        "{out}"
    );
    assert!(out.ends_with("hello from app-h2\n"), "{out}");

    // A chunked upload with a trailer; the answer streams back chunked with the pod's trailers.
    let upload = "POST /echo HTTP/1.1\r\nHost: app.example.com\r\nTransfer-Encoding: chunked\r\n\
                  Trailer: x-echo-trailer\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\
                  x-echo-trailer: up\r\n\r\n";
    let mut connection = Connection::connect(http).expect("a connection");
    connection.send(upload.as_bytes()).expect("the upload");
    let echoed = connection.read_response().expect("the echo");
    assert_eq!(echoed.status, 200);
    assert!(
        echoed.chunked(),
        "no length from the pod: chunked to the client"
    );
    assert_eq!(echoed.text(), "hello world");
    assert_eq!(echoed.trailer("x-echo-bytes"), Some("11"));
    assert_eq!(echoed.trailer("x-echo-trailer"), Some("up"));
    assert_eq!(echoed.header("x-http-version"), Some("HTTP/2.0"));

    // The same connection: a body after `100 Continue`, then a HEAD.
    connection
        .send(
            b"POST /echo HTTP/1.1\r\nHost: app.example.com\r\nContent-Length: 4\r\n\
              Expect: 100-continue\r\n\r\n",
        )
        .expect("the head");
    let interim = connection
        .read_head()
        .expect("100 Continue before the body");
    assert_eq!(interim.status, 100);
    connection.send(b"ping").expect("the body");
    let echoed = connection.read_response().expect("the echo");
    assert_eq!((echoed.status, echoed.text().as_str()), (200, "ping"));
    connection
        .send(b"HEAD / HTTP/1.1\r\nHost: app.example.com\r\n\r\n")
        .expect("a HEAD");
    let head = connection
        .read_response_to("HEAD")
        .expect("the HEAD's answer");
    assert_eq!((head.status, head.body.len()), (200, 0));
    assert_eq!(
        head.header("content-length"),
        Some("18"),
        "the GET's length"
    );
    let served = app.stats().requests;
    assert_eq!(served, 4, "every request reached the pod");

    // A client that leaves while the pod works on its request.
    let mut leaving = std::net::TcpStream::connect(http).expect("a connection");
    std::io::Write::write_all(
        &mut leaving,
        b"GET /sleep?ms=8000 HTTP/1.1\r\nHost: app.example.com\r\n\r\n",
    )
    .expect("the request");
    assert!(
        eventually(Duration::from_secs(10), || app.stats().in_flight == 1),
        "the pod works on it"
    );
    drop(leaving);
    let left = Instant::now();
    let next = exchange(http, &request("app.example.com", "/"));
    assert_eq!(next.status, 200);
    assert!(
        left.elapsed() < Duration::from_secs(6),
        "the slot came back once the pod heard, not when its work would have ended"
    );
    let stats = app.stats();
    assert_eq!(stats.cancelled, 1, "the pod's stream was reset: {stats:?}");
    assert_eq!(stats.max_in_flight, 1, "never two at once: {stats:?}");
    assert_eq!(stats.requests, served + 2);
}

/// The add-on 0.16's cold-start cap from the environment
/// (`KEDA_HTTP_COLD_START_MAX_PENDING_REQUESTS`): while the route has no ready endpoint it holds
/// that many requests, turns the next away with the add-on's 503 and counts it in
/// `interceptor_cold_start_rejections_total`; the held ones reach the pod once it is ready.
#[test]
fn the_cold_start_cap_holds_that_many_and_turns_the_rest_away_with_the_add_ons_503() {
    let cluster = Cluster::start();
    let (ip, pod) = cluster.app_with_a_pod_not_ready();
    let (interceptor, _scaler) =
        cluster.interceptor(&[("KEDA_HTTP_COLD_START_MAX_PENDING_REQUESTS", "2")]);
    let http = interceptor.http;
    let held: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(move || exchange(http, &request("app.example.com", "/"))))
        .collect();
    let route = ["route_name=\"app\""];
    assert!(
        eventually(Duration::from_secs(10), || interceptor
            .metric_sum("interceptor_request_concurrency", &route)
            == 2.0),
        "two requests held"
    );
    let turned_away = exchange(http, &request("app.example.com", "/"));
    assert_eq!(turned_away.status, 503);
    assert_eq!(turned_away.text(), "too many pending requests\n");
    assert_eq!(
        interceptor.metric_sum("interceptor_cold_start_rejections_total", &route),
        1.0
    );
    assert_eq!(pod.stats().requests, 0, "nothing reached the pod yet");
    cluster.endpoints("app", &[ip], &[]);
    for client in held {
        let response = client.join().expect("a held client");
        assert_eq!(response.status, 200, "{}", response.text());
    }
    assert_eq!(pod.stats().requests, 2);
}

/// The add-on's chart gives its interceptor a 64 MiB memory limit (kedacore/charts
/// `http-add-on/values.yaml`, `interceptor.resources.limits.memory`). Review finding: the role
/// kept the activator's 64 MiB out of its budget, found no room for any connection and exited:
/// a drop-in that crash-loops under the limit it replaces. Under that limit it now starts,
/// says the budget it fitted, holds 300 requests of a route at zero and serves every one once
/// a pod is ready, resident under the limit.
#[test]
fn under_the_add_on_charts_64_mib_limit_it_starts_holds_and_serves_every_request() {
    const LIMIT: u64 = 64 << 20;
    const CLIENTS: usize = 300;
    let cluster = Cluster::start();
    let (ip, pod) = cluster.app_with_a_pod_not_ready();
    let (interceptor, _scaler) =
        cluster.interceptor_prepared(Activator::prepare("", "").with_memory_limit(LIMIT), &[]);
    let budget = support::memory_budget_line(&interceptor.stderr());
    assert!(budget.contains("limit=64 MiB"), "{budget}");
    let http = interceptor.http;
    let held: Vec<_> = (0..CLIENTS)
        .map(|_| std::thread::spawn(move || exchange(http, &request("app.example.com", "/"))))
        .collect();
    let route = ["route_name=\"app\""];
    assert!(
        eventually(Duration::from_secs(20), || interceptor
            .metric_sum("interceptor_request_concurrency", &route)
            == CLIENTS as f64),
        "{CLIENTS} requests held: {}",
        interceptor.metric_sum("interceptor_request_concurrency", &route)
    );
    let held_kib = interceptor.rss_kib();
    cluster.endpoints("app", &[ip], &[]);
    let statuses: Vec<u16> = held
        .into_iter()
        .map(|client| client.join().expect("a held client").status)
        .collect();
    assert!(
        statuses.iter().all(|status| *status == 200),
        "{:?}",
        statuses
            .iter()
            .filter(|status| **status != 200)
            .collect::<Vec<_>>()
    );
    assert_eq!(pod.stats().requests, CLIENTS as u64);
    assert!(
        held_kib * 1024 < LIMIT,
        "resident {held_kib} KiB with {CLIENTS} held"
    );
}

/// The add-on 0.16's `coldStart.maxPendingRequests` with `overflow: Placeholder` on an
/// InterceptorRoute (its CRD with 0.16's fields): while no endpoint is ready the route holds
/// that many requests, and only the next gets the placeholder; the held ones reach the pod.
#[test]
fn a_cold_start_cap_with_overflow_placeholder_holds_first_and_gives_the_rest_the_placeholder() {
    let cluster = Cluster::start_with(Crds::V0_16);
    cluster.service("app");
    let (ip, pod) = cluster.pod("app-1");
    cluster.endpoints("app", &[], &[ip]);
    cluster.api.apply_yaml(
        "apiVersion: http.keda.sh/v1beta1
kind: InterceptorRoute
metadata:
  namespace: default
  name: capped
spec:
  target:
    service: app
    port: 80
  rules:
  - hosts: [capped.example.com]
  scalingMetric:
    concurrency:
      targetValue: 10
  coldStart:
    maxPendingRequests: 1
    overflow: Placeholder
    placeholder:
      response:
        body: busy warming up
",
    );
    let stored = cluster.api.kubectl([
        "get",
        "interceptorroute",
        "capped",
        "-o",
        "jsonpath={.spec.coldStart.maxPendingRequests}",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&stored.stdout),
        "1",
        "the API server kept the 0.16 field"
    );
    let (interceptor, _scaler) = cluster.interceptor(&[]);
    let http = interceptor.http;
    let held = std::thread::spawn(move || exchange(http, &request("capped.example.com", "/")));
    let route = ["route_name=\"capped\""];
    assert!(
        eventually(Duration::from_secs(10), || interceptor
            .metric_sum("interceptor_request_concurrency", &route)
            == 1.0),
        "the first request is held, not answered by the placeholder"
    );
    let overflow = exchange(http, &request("capped.example.com", "/"));
    assert_eq!(
        (overflow.status, overflow.text().as_str()),
        (503, "busy warming up")
    );
    assert_eq!(
        interceptor.metric_sum("interceptor_cold_start_rejections_total", &route),
        1.0
    );
    cluster.endpoints("app", &[ip], &[]);
    let held = held.join().expect("the held client");
    assert_eq!(held.status, 200);
    assert_eq!(held.header("X-Backend"), Some("app-1"));
    assert_eq!(pod.stats().requests, 1);
}

/// 0.16's `staticRoutes` on an InterceptorRoute (the add-on's `main` CRD): a request one of
/// them matches is never counted, so it never scales the route, and never held: `Always`
/// answers it whatever the pods, `WhenUnavailable` (the default, by path or by a header) while
/// no endpoint is ready and sends it to a pod once one is; other requests of the route are
/// counted and proxied as ever.
#[test]
fn static_routes_answer_or_pass_without_counting_and_never_scale_the_route() {
    let cluster = Cluster::start_with(Crds::V0_16);
    cluster.service("app");
    let (ip, pod) = cluster.pod("app-1");
    cluster.endpoints("app", &[], &[ip]);
    cluster.api.apply_yaml(
        "apiVersion: http.keda.sh/v1beta1
kind: InterceptorRoute
metadata:
  namespace: default
  name: site
spec:
  target:
    service: app
    port: 80
  rules:
  - hosts: [site.example.com]
  scalingMetric:
    requestRate:
      targetValue: 10
  staticRoutes:
  - rules:
    - paths: [{value: /healthz}]
    response:
      body: ok
    responseMode: Always
  - rules:
    - paths: [{value: /favicon.ico}]
    - headers: [{name: X-Probe}]
    response:
      statusCode: 204
",
    );
    let (interceptor, scaler) = cluster.interceptor(&[]);
    let get = |path: &str, extra: &str| {
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: site.example.com\r\n{extra}Connection: close\r\n\r\n"
        );
        exchange(interceptor.http, head.as_bytes())
    };
    let rt = runtime();
    let mut client = rt.block_on(keda::connect(scaler)).expect("the scaler");
    let reference = keda::interceptor_route_ref("default", "site-so", "site", &scaler.to_string());
    let mut active = || {
        rt.block_on(client.is_active(reference.clone()))
            .expect("IsActive")
            .into_inner()
            .result
    };

    // No endpoint ready: every static route answers, at once.
    let health = get("/healthz", "");
    assert_eq!((health.status, health.text().as_str()), (200, "ok"));
    let icon = get("/favicon.ico", "");
    assert_eq!((icon.status, icon.body.len()), (204, 0));
    let probe = get("/", "X-Probe: 1\r\n");
    assert_eq!(probe.status, 204, "the second rule: a header");
    // Counted, the three would make the route's rate, and so the route, active.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!active(), "static routes never scale the route");

    // A ready endpoint: `Always` still answers; `WhenUnavailable` goes to the pod, uncounted.
    cluster.endpoints("app", &[ip], &[]);
    assert!(
        eventually(Duration::from_secs(10), || get("/favicon.ico", "")
            .header("X-Backend")
            == Some("app-1")),
        "the pod answers once it is ready"
    );
    let health = get("/healthz", "");
    assert_eq!((health.status, health.text().as_str()), (200, "ok"));
    assert_eq!(health.header("X-Backend"), None);
    let served_static = pod.stats().requests;
    assert!(served_static >= 1);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!active(), "still nothing counted");
    let route = ["route_name=\"site\""];
    assert_eq!(
        interceptor.metric_sum("interceptor_request_count_total", &route),
        0.0
    );

    // Any other request of the route is counted and proxied.
    let page = get("/", "");
    assert_eq!(page.status, 200);
    assert_eq!(page.header("X-Backend"), Some("app-1"));
    assert!(
        eventually(Duration::from_secs(5), &mut active),
        "a counted request makes the route active"
    );
    assert_eq!(
        interceptor.metric_sum("interceptor_request_count_total", &route),
        1.0
    );
    assert_eq!(pod.stats().requests, served_static + 1);
}

/// `KEDA_HTTP_MAX_IDLE_CONNS`, the add-on's cap on idle connections over every pod: a peak
/// opens more, and once they have sat idle past the surplus timeout the oldest close until the
/// process keeps no more than the cap (shared among the shards), while each pod's own cap
/// would have kept them all.
#[test]
fn the_process_wide_idle_cap_closes_the_oldest_surplus_once_idle() {
    const CAP: u64 = 2;
    let cluster = Cluster::start();
    cluster.service("app");
    let pods: Vec<(IpAddr, BackendHandle)> = (0..3)
        .map(|index| cluster.pod(&format!("app-{index}")))
        .collect();
    let ips: Vec<IpAddr> = pods.iter().map(|(ip, _)| *ip).collect();
    cluster.endpoints("app", &ips, &[]);
    cluster.api.apply_yaml(&app_object(&[], "", ""));
    let (interceptor, _scaler) = cluster.interceptor(&[
        ("KEDA_HTTP_MAX_IDLE_CONNS", &CAP.to_string()),
        ("KEDA_HTTP_MAX_IDLE_CONNS_PER_HOST", "100"),
    ]);
    let http = interceptor.http;
    let clients: Vec<_> = (0..12)
        .map(|_| {
            std::thread::spawn(move || exchange(http, &request("app.example.com", "/delay/200")))
        })
        .collect();
    for client in clients {
        assert_eq!(client.join().expect("a client").status, 200);
    }
    let open = || -> u64 {
        pods.iter()
            .map(|(_, pod)| pod.stats().connections_open)
            .sum()
    };
    let peak = open();
    assert!(peak > CAP, "the peak left {peak} connections open");
    // The surplus timeout (10 s), then a sweep (every 5 s).
    assert!(
        eventually(Duration::from_secs(25), || open() <= CAP),
        "{} idle connections left over a cap of {CAP}",
        open()
    );
    assert!(open() >= 1, "the cap keeps what it allows: {}", open());
}

/// IPv6: a pod listed at an IPv6 address (an EndpointSlice of `addressType: IPv6`) is served
/// there, and a client reaches the role over IPv6; the pod sees the client's IPv6 address in
/// `X-Forwarded-For`.
#[test]
fn a_pod_at_an_ipv6_address_serves_a_client_that_came_over_ipv6() {
    let cluster = Cluster::start();
    let net = support::ipv6::Ipv6Net::new();
    cluster.service("app");
    let pod = backend::spawn_on(
        SocketAddr::new(net.host, POD_PORT),
        BackendConfig::named("app-6"),
    )
    .expect("a pod at an IPv6 address");
    cluster.endpoints("app", &[net.host], &[]);
    cluster.api.apply_yaml(&app_object(&[], "", ""));
    let (interceptor, _scaler) =
        cluster.interceptor_at(net.host, free_port(), &[("KEDA_HTTP_LOG_REQUESTS", "true")]);
    assert!(interceptor.http.is_ipv6());
    let response = exchange(
        interceptor.http,
        b"GET /headers?x=1 HTTP/1.1\r\nHost: app.example.com\r\nUser-Agent: probe/1\r\n\
          Referer: https://from.example/\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("X-Backend"), Some("app-6"));
    let seen: serde_json::Value = serde_json::from_slice(&response.body).expect("the app's JSON");
    let forwarded_for: Vec<&str> = seen["headers"]
        .as_array()
        .expect("headers")
        .iter()
        .filter(|pair| {
            pair[0]
                .as_str()
                .unwrap()
                .eq_ignore_ascii_case("x-forwarded-for")
        })
        .map(|pair| pair[1].as_str().unwrap())
        .collect();
    assert_eq!(forwarded_for, [net.host.to_string()]);
    assert_eq!(pod.stats().requests, 1);
    // KEDA_HTTP_LOG_REQUESTS: the add-on's combined-format line, the client's IPv6 address first.
    assert!(
        eventually(Duration::from_secs(5), || interceptor
            .stdout()
            .contains("\"GET /headers HTTP/1.1\" 200 ")),
        "{}",
        interceptor.stdout()
    );
    let stdout = interceptor.stdout();
    let line = stdout.lines().next().expect("one line");
    assert!(line.starts_with(&format!("[{}]:", net.host)), "{line}");
    assert!(
        line.ends_with("\"https://from.example/\" \"probe/1\""),
        "{line}"
    );
    assert!(line.contains(" - - ["), "{line}");
}

#[test]
fn four_pods_with_a_limit_of_one_never_serve_two_requests_at_once_under_64_clients() {
    const CLIENTS: usize = 64;
    const EACH: usize = 5;
    let cluster = Cluster::start();
    cluster.service("app");
    let pods: Vec<(IpAddr, BackendHandle)> = (0..4)
        .map(|index| cluster.pod(&format!("app-{index}")))
        .collect();
    let ips: Vec<IpAddr> = pods.iter().map(|(ip, _)| *ip).collect();
    cluster.endpoints("app", &ips, &[]);
    cluster.api.apply_yaml(&app_object(
        &["/"],
        "    kactivator.dev/container-concurrency: \"1\"",
        "",
    ));
    let (interceptor, _scaler) = cluster.interceptor(&[]);
    let http = interceptor.http;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            std::thread::spawn(move || {
                (0..EACH)
                    .map(|_| exchange(http, &request("app.example.com", "/delay/20")).status)
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    let statuses: Vec<u16> = clients
        .into_iter()
        .flat_map(|client| client.join().expect("a client"))
        .collect();
    assert!(statuses.iter().all(|&status| status == 200), "{statuses:?}");
    let mut served = 0;
    for (_, pod) in &pods {
        let stats = pod.stats();
        assert_eq!(stats.max_in_flight, 1, "a pod had two requests at once");
        served += stats.requests;
    }
    assert_eq!(
        served,
        (CLIENTS * EACH) as u64,
        "every request reached one pod"
    );
}

#[test]
fn a_websocket_stays_open_past_every_timeout_and_counts_while_it_is_open() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let cluster = Cluster::start();
    let (_, _pod) = cluster.app_with_a_ready_pod();
    // Both of the add-on's request timeouts at one second; the socket lives for four.
    let (interceptor, scaler) = cluster.interceptor(&[
        ("KEDA_HTTP_REQUEST_TIMEOUT", "1s"),
        ("KEDA_HTTP_RESPONSE_HEADER_TIMEOUT", "1s"),
    ]);
    let rt = runtime();
    let mut client = rt
        .block_on(keda::connect(scaler))
        .expect("the scaler answers");
    rt.block_on(async {
        let mut socket = websocket(interceptor.http).await;
        let opened = Instant::now();
        let mut sent = 0;
        while opened.elapsed() < Duration::from_secs(4) {
            let text = format!("message {sent}");
            socket
                .send(Message::Text(text.clone().into()))
                .await
                .unwrap();
            let echoed = socket.next().await.expect("open").expect("a message");
            assert_eq!(
                echoed,
                Message::Text(text.into()),
                "after {:?}",
                opened.elapsed()
            );
            sent += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // The add-on counts a socket as one request for its whole life: KEDA keeps the
        // Deployment up while it is open.
        assert_eq!(
            metric(&mut client, scaler).await,
            1,
            "the open socket counts"
        );
        socket.close(None).await.expect("a clean close");
    });
    assert!(
        eventually(Duration::from_secs(5), || rt
            .block_on(metric(&mut client, scaler))
            == 0),
        "a closed socket no longer counts"
    );
}

#[test]
fn every_replica_answers_keda_for_the_whole_fleet() {
    let cluster = Cluster::start();
    cluster.service("app");
    cluster.endpoints("app", &[], &[]);
    cluster.api.apply_yaml(&app_object(&[], "", ""));
    // Two replicas, listed by the admin Service's EndpointSlice as the endpoint controller
    // would list the Deployment's pods.
    let admin_port = free_port();
    let (ip_a, ip_b) = (
        cluster.net.add_host_address(),
        cluster.net.add_host_address(),
    );
    cluster.api.apply_yaml(&keda::endpoint_slice(
        "v1beta1",
        KEDA_NAMESPACE,
        "keda-add-ons-http-interceptor-admin",
        &[ip_a, ip_b],
        &[],
        admin_port,
    ));
    let admin_port_text = admin_port.to_string();
    let replica = |ip: IpAddr| {
        let ip_text = ip.to_string();
        cluster.interceptor_at(
            ip,
            admin_port,
            &[
                ("POD_IP", ip_text.as_str()),
                ("KEDA_HTTP_SCALER_TARGET_ADMIN_NAMESPACE", KEDA_NAMESPACE),
                (
                    "KEDA_HTTP_SCALER_TARGET_ADMIN_PORT",
                    admin_port_text.as_str(),
                ),
            ],
        )
    };
    let (a, scaler_a) = replica(ip_a);
    let (b, scaler_b) = replica(ip_b);
    let rt = runtime();
    let mut client_a = rt.block_on(keda::connect(scaler_a)).expect("a's scaler");
    let mut client_b = rt.block_on(keda::connect(scaler_b)).expect("b's scaler");

    // One request held at a, two at b.
    let held: Vec<_> = [a.http, b.http, b.http]
        .into_iter()
        .map(|http| std::thread::spawn(move || exchange(http, &request("app.example.com", "/"))))
        .collect();
    for (name, client, scaler) in [
        ("a", &mut client_a, scaler_a),
        ("b", &mut client_b, scaler_b),
    ] {
        assert!(
            eventually(Duration::from_secs(5), || rt
                .block_on(metric(client, scaler))
                == 3),
            "replica {name} does not answer for the fleet: {}",
            rt.block_on(metric(client, scaler))
        );
    }
    let (ip, first) = cluster.pod("app-1");
    cluster.endpoints("app", &[ip], &[]);
    for request in held {
        assert_eq!(request.join().expect("a held request").status, 200);
    }
    assert!(
        eventually(Duration::from_secs(5), || rt
            .block_on(metric(&mut client_a, scaler_a))
            == 0),
        "nothing held once the pod is ready"
    );

    // ★ A per-pod limit of 1 holds across the replicas: the replicas split the pods between
    // them as activators do, so two replicas under 32 clients each never give a pod two
    // requests at once.
    let (ip_2, second) = cluster.pod("app-2");
    cluster.endpoints("app", &[ip, ip_2], &[]);
    cluster.api.apply_yaml(&app_object(
        &[],
        "    kactivator.dev/container-concurrency: \"1\"",
        "",
    ));
    // Each replica routes to its share: one pod with one slot, of the two pods.
    for (name, replica) in [("a", &a), ("b", &b)] {
        let capacity = || {
            replica.metric_sum(
                "kactivator_revision_capacity",
                &["namespace=\"default\"", "revision=\"app\""],
            )
        };
        assert!(
            eventually(Duration::from_secs(10), || capacity() == 1.0),
            "replica {name}'s capacity for the route is {}, not its one pod's one slot",
            capacity()
        );
    }
    first.reset_stats();
    second.reset_stats();
    let clients: Vec<_> = (0..64)
        .map(|index| {
            let http = if index % 2 == 0 { a.http } else { b.http };
            std::thread::spawn(move || {
                (0..4)
                    .map(|_| exchange(http, &request("app.example.com", "/delay/20")).status)
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    let statuses: Vec<u16> = clients
        .into_iter()
        .flat_map(|client| client.join().expect("a client"))
        .collect();
    assert!(statuses.iter().all(|&status| status == 200), "{statuses:?}");
    let (one, two) = (first.stats(), second.stats());
    assert_eq!(
        one.requests + two.requests,
        64 * 4,
        "every request reached a pod"
    );
    assert_eq!(
        (one.max_in_flight, two.max_in_flight),
        (1, 1),
        "each pod served one request at a time, from both replicas together"
    );
}

#[test]
fn a_wait_for_a_first_pod_ends_at_the_failover_or_in_a_504() {
    let cluster = Cluster::start();
    for service in ["app", "fallback", "lonely"] {
        cluster.service(service);
    }
    cluster.endpoints("app", &[], &[]);
    cluster.endpoints("lonely", &[], &[]);
    let (ip, fallback) = cluster.pod("fallback-1");
    cluster.endpoints("fallback", &[ip], &[]);
    cluster.api.apply_yaml(&app_object(
        &[],
        "",
        "  coldStartTimeoutFailoverRef:\n    service: fallback\n    \
                    port: 80\n    timeoutSeconds: 1",
    ));
    cluster.api.apply_yaml(
        &HttpScaledObject {
            name: "lonely",
            hosts: &["lonely.example.com"],
            paths: &[],
            service: "lonely",
            port: SERVICE_PORT,
            annotations: "",
            extra: "  timeouts:\n    conditionWait: 1s",
        }
        .yaml(),
    );
    let metrics_port = free_port();
    let (interceptor, _scaler) =
        cluster.interceptor(&[("OTEL_PROM_EXPORTER_PORT", &metrics_port.to_string())]);

    // After its second of waiting, the request goes to the failover Service's pod, and the
    // response carries no cold-start field (the add-on sets none on a failover).
    let started = Instant::now();
    let failed_over = exchange(interceptor.http, &request("app.example.com", "/"));
    let waited = started.elapsed();
    assert_eq!(failed_over.status, 200, "{}", failed_over.text());
    assert_eq!(failed_over.text(), "hello from fallback-1\n");
    assert_eq!(failed_over.header("X-KEDA-HTTP-Cold-Start"), None);
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(5),
        "failed over after {waited:?}"
    );
    assert_eq!(fallback.stats().requests, 1);

    // With no failover, the add-on's 504 once conditionWait has passed.
    let started = Instant::now();
    let timed_out = exchange(interceptor.http, &request("lonely.example.com", "/"));
    let waited = started.elapsed();
    assert_eq!(timed_out.status, 504);
    assert_eq!(timed_out.text(), "Gateway Timeout\n");
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(5),
        "answered after {waited:?}"
    );
    // The add-on's metrics, by route; the failover's request under its route's name.
    let count = |code: &str, route: &str| {
        interceptor.metric_sum(
            "interceptor_request_count_total",
            &[
                &format!("code=\"{code}\""),
                &format!("route_name=\"{route}\""),
                "route_namespace=\"default\"",
            ],
        )
    };
    assert!(
        eventually(Duration::from_secs(5), || count("200", "app") == 1.0
            && count("504", "lonely") == 1.0),
        "{}",
        interceptor
            .metrics()
            .lines()
            .filter(|line| line.starts_with("interceptor_") && !line.contains("_bucket"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let metrics: String = interceptor
        .metrics()
        .lines()
        .filter(|line| line.starts_with("interceptor_"))
        .map(|line| format!("{line}\n"))
        .collect();
    assert!(
        !metrics.contains(":failover"),
        "a failover is not a route of its own: {metrics}"
    );
    assert_eq!(
        interceptor.metric_sum(
            "interceptor_request_duration_seconds_count",
            &["route_name=\"lonely\""]
        ),
        1.0
    );
    assert!(
        interceptor.metric_sum(
            "interceptor_request_duration_seconds_sum",
            &["route_name=\"lonely\""]
        ) >= 1.0,
        "the 504 came after a second: {metrics}"
    );
    assert_eq!(
        interceptor.metric_sum("interceptor_request_concurrency", &["route_name=\"app\""]),
        0.0
    );
    // The same on the add-on's metrics port, where its chart's scraping looks.
    let (status, page) =
        support::admin_get(SocketAddr::from(([127, 0, 0, 1], metrics_port)), "/metrics")
            .expect("the metrics port answers");
    assert_eq!(status, 200);
    assert!(
        page.contains(
            "interceptor_request_count_total{code=\"504\",route_name=\"lonely\",\
             route_namespace=\"default\"} 1"
        ),
        "{page}"
    );
}

/// [`support::curl_https`] with the handshake's account (`-v`, on stderr) and the response's
/// head (`-i`).
fn curl_https(
    port: u16,
    name: &str,
    path: &str,
    ca: &std::path::Path,
    extra: &[&str],
) -> (bool, String, String) {
    support::curl_https(port, name, path, ca, &[&["-v", "-i"], extra].concat())
}

/// The add-on's TLS port (`KEDA_HTTP_PROXY_TLS_*`): a client's server name picks a pair of the
/// certificate store, any other gets the main pair; a request that came over TLS reaches its pod
/// over TLS (a Go pod, verifying it by `KEDA_HTTP_TLS_CA_DIRS` as `<service>.<namespace>`), and
/// one that came in plain reaches it in plain TCP, as the add-on's `https://` and `http://`
/// upstreams do.
#[test]
fn the_tls_port_serves_by_name_and_its_requests_reach_pods_over_tls() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    use kactivator_testkit::certs::TestCa;
    use support::go::{go_peer, Killed};

    let cluster = Cluster::start();
    let dir = support::scratch_dir();
    let ca = TestCa::new("keda-tls");
    let ca_file = ca.write(&dir, "ca.pem");
    let cas = dir.join("cas");
    std::fs::create_dir_all(&cas).unwrap();
    ca.write(&cas, "ca.crt");
    let (main_cert, main_key) = ca.issue(&["*.example.com"]).write(&dir, "main");
    let store = dir.join("store");
    std::fs::create_dir_all(&store).unwrap();
    ca.issue(&["app.example.com"]).write(&store, "app");
    let (pod_cert, pod_key) = ca.issue(&["app.default"]).write(&dir, "pod");

    // The pod: Go's net/http serving TLS only, at the pod network's address.
    let peer = go_peer(&dir);
    let ip = cluster.net.add_address();
    let mut pod = Killed(
        cluster
            .net
            .command(peer.to_str().unwrap())
            .args([
                "server",
                pod_cert.to_str().unwrap(),
                pod_key.to_str().unwrap(),
            ])
            .arg(SocketAddr::new(ip, POD_PORT).to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the Go pod"),
    );
    let mut line = String::new();
    BufReader::new(pod.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("listening on"), "{line}");
    cluster.service("app");
    cluster.endpoints("app", &[ip], &[]);
    cluster.api.apply_yaml(&app_object(&[], "", ""));

    let tls_port = free_port();
    let tls_port_text = tls_port.to_string();
    let (interceptor, _scaler) = cluster.interceptor(&[
        ("KEDA_HTTP_PROXY_TLS_ENABLED", "true"),
        ("KEDA_HTTP_PROXY_TLS_PORT", &tls_port_text),
        ("KEDA_HTTP_PROXY_TLS_CERT_PATH", main_cert.to_str().unwrap()),
        ("KEDA_HTTP_PROXY_TLS_KEY_PATH", main_key.to_str().unwrap()),
        (
            "KEDA_HTTP_PROXY_TLS_CERT_STORE_PATHS",
            store.to_str().unwrap(),
        ),
        ("KEDA_HTTP_TLS_CA_DIRS", cas.to_str().unwrap()),
    ]);

    // The Go pod answers no Knative probe: it must not be probed into quarantine (every new pod
    // would be probed once within a second, and fail).
    std::thread::sleep(Duration::from_millis(1_500));

    // Each protocol goes on in its own, named by ALPN to the pod (Go speaks HTTP/2 in TLS only
    // then).
    for (flag, status_line, inside) in [
        ("--http2", "http/2 200", "x-http-version: http/2.0"),
        ("--http1.1", "http/1.1 200", "x-http-version: http/1.1"),
    ] {
        let (ok, out, err) = curl_https(tls_port, "app.example.com", "/", &ca_file, &[flag]);
        assert!(ok, "{err}\n{}", interceptor.stderr());
        let out = out.to_ascii_lowercase();
        assert!(out.starts_with(status_line), "{out}");
        assert!(out.contains("hello from go"), "{out}");
        assert!(out.contains(inside), "{out}");
        assert!(out.contains("x-tls-server-name: app.default"), "{out}");
        assert!(out.contains("x-seen-forwarded-proto: https"), "{out}");
        assert!(
            err.contains("matched cert's \"app.example.com\""),
            "the store's pair for its name: {err}"
        );
    }

    // Another name under the main pair's wildcard: the main pair (and no route: the add-on's 404).
    let (ok, out, err) = curl_https(tls_port, "other.example.com", "/", &ca_file, &[]);
    assert!(ok, "{err}");
    assert!(err.contains("matched cert's \"*.example.com\""), "{err}");
    assert!(out.to_ascii_lowercase().starts_with("http/"), "{out}");
    assert!(out.contains(" 404"), "{out}");

    // Over the plain port the request goes to the pod in plain TCP, which a TLS-only pod does
    // not take (Go answers a plain request 400), as the add-on's `http://` upstream finds it.
    let response = exchange(interceptor.http, &request("app.example.com", "/"));
    assert_ne!(response.status, 200, "{}", response.text());
    assert!(
        !response.text().contains("hello from go"),
        "{}",
        response.text()
    );
    assert!(
        !interceptor.stderr().contains("health check failed"),
        "no health check in this role: {}",
        interceptor.stderr()
    );
}

/// `KEDA_HTTP_SCALER_STREAM_INTERVAL_MS` sets how often `StreamIsActive` sends, and
/// `KEDA_HTTP_DRAIN_TIMEOUT` bounds what is still in flight when the listeners close: past it a
/// WebSocket is cut and the process exits, as the add-on's `Shutdown` gives up.
#[test]
fn the_stream_interval_is_kept_and_the_drain_timeout_cuts_what_is_left_in_flight() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let cluster = Cluster::start();
    let (_, _pod) = cluster.app_with_a_ready_pod();
    let (mut interceptor, scaler) = cluster.interceptor(&[
        ("KEDA_HTTP_SCALER_STREAM_INTERVAL_MS", "50"),
        ("KEDA_HTTP_SHUTDOWN_DELAY", "0s"),
        ("KEDA_HTTP_DRAIN_TIMEOUT", "1s"),
    ]);
    let rt = runtime();
    let mut client = rt
        .block_on(keda::connect(scaler))
        .expect("the scaler answers");
    let mut stream = rt
        .block_on(client.stream_is_active(keda::scaled_object_ref(
            "default",
            "app",
            &scaler.to_string(),
        )))
        .expect("StreamIsActive")
        .into_inner();
    let started = Instant::now();
    for _ in 0..20 {
        rt.block_on(stream.message())
            .expect("a message")
            .expect("the stream goes on");
    }
    let took = started.elapsed();
    // Twenty ticks of 50 ms; at the default 200 ms they would take four seconds.
    assert!(took < Duration::from_millis(2_000), "{took:?}");

    let mut socket = rt.block_on(async {
        let mut socket = websocket(interceptor.http).await;
        socket.send(Message::Text("before".into())).await.unwrap();
        let echoed = socket.next().await.expect("open").expect("a message");
        assert_eq!(echoed, Message::Text("before".into()));
        socket
    });
    let signalled = Instant::now();
    interceptor.send_signal("TERM");
    let code = interceptor.wait_exit(Duration::from_secs(10));
    let exited = signalled.elapsed();
    assert_eq!(code, Some(0), "{}", interceptor.stderr());
    assert!(
        exited >= Duration::from_millis(900) && exited < Duration::from_secs(5),
        "the drain timeout, not at once nor later: {exited:?}"
    );
    assert!(
        interceptor.stderr().contains("drain timeout"),
        "{}",
        interceptor.stderr()
    );
    let after = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), socket.next())
            .await
            .expect("the socket ends with the process")
    });
    assert!(!matches!(after, Some(Ok(Message::Text(_)))), "{after:?}");
}
