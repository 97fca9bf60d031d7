//! KEDA's side of the KEDA HTTP add-on role, for the tests: an external-scaler client generated
//! from KEDA's `externalscaler.proto` (plaintext HTTP/2, as KEDA dials a `scalerAddress` without
//! `enableTLS`), the HTTPScaledObject and InterceptorRoute CRDs of the add-on's repository, and
//! the objects a user and the cluster write (HTTPScaledObjects, Services, EndpointSlices).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use tonic::transport::{Channel, Endpoint};

/// The generated messages and client.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/externalscaler.rs"));
}

/// The standard gRPC health check's messages and client (`api/proto/health.proto`).
#[allow(clippy::all, missing_docs)]
pub mod health {
    include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
}

use pb::external_scaler_client::ExternalScalerClient;

/// The health status a scaler gives for `service` (`liveness`, `readiness`), as the chart's
/// gRPC probes ask; the gRPC error when it refuses.
pub async fn health(addr: SocketAddr, service: &str) -> Result<i32, BoxError> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = health::health_client::HealthClient::new(channel);
    let answer = client
        .check(health::HealthCheckRequest {
            service: service.to_owned(),
        })
        .await?;
    Ok(answer.into_inner().status)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The add-on's HTTPScaledObject CRD, `http.keda.sh/v1alpha1` (from its repository at v0.15.0,
/// `config/crd/bases/http.keda.sh_httpscaledobjects.yaml`; see the file's first lines).
pub const HTTP_SCALED_OBJECT_CRD: &str =
    include_str!("../k8s/keda-http-add-on/http.keda.sh_httpscaledobjects.yaml");

/// The add-on's InterceptorRoute CRD, `http.keda.sh/v1beta1` (0.14 and later; from its
/// repository at v0.15.0, `config/crd/bases/http.keda.sh_interceptorroutes.yaml`).
pub const INTERCEPTOR_ROUTE_CRD: &str =
    include_str!("../k8s/keda-http-add-on/http.keda.sh_interceptorroutes.yaml");

/// The add-on's InterceptorRoute CRD from its `main` branch after v0.15.0 (59b2f6a1,
/// 2026-06-28), the first with 0.16's `staticRoutes` (#1689).
pub const INTERCEPTOR_ROUTE_CRD_MAIN: &str =
    include_str!("../k8s/keda-http-add-on/main/http.keda.sh_interceptorroutes.yaml");

/// The InterceptorRoute CRD as 0.16 declares what kactivator reads of it:
/// [`INTERCEPTOR_ROUTE_CRD_MAIN`] (`staticRoutes`) with the two `coldStart` fields of #1733
/// added, `maxPendingRequests`, an int32 of at least 1, and `overflow`, `Reject` or
/// `Placeholder`, as the 0.16 chart's CRD declares them (kedacore/charts#908). 0.16's own CRD
/// is in none of the add-on's sources this repository has (its `main` stops before #1733), and
/// the API server prunes fields a CRD does not declare.
pub fn interceptor_route_crd_0_16() -> String {
    const AT: &str = "              coldStart:\n                description: Cold start behavior when scaling from zero.\n                properties:\n";
    const ADDED: &str = "                  maxPendingRequests:\n                    format: int32\n                    minimum: 1\n                    type: integer\n                  overflow:\n                    enum:\n                    - Reject\n                    - Placeholder\n                    type: string\n";
    assert!(
        INTERCEPTOR_ROUTE_CRD_MAIN.contains(AT),
        "the CRD's coldStart properties"
    );
    INTERCEPTOR_ROUTE_CRD_MAIN.replacen(AT, &format!("{AT}{ADDED}"), 1)
}

/// A client of the scaler at `addr`, connected.
pub async fn connect(addr: SocketAddr) -> Result<ExternalScalerClient<Channel>, BoxError> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok(ExternalScalerClient::new(channel))
}

/// The reference KEDA sends for the ScaledObject the add-on's operator makes of
/// HTTPScaledObject `namespace/name`: the same name, its one trigger's metadata.
pub fn scaled_object_ref(namespace: &str, name: &str, scaler: &str) -> pb::ScaledObjectRef {
    pb::ScaledObjectRef {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        scaler_metadata: HashMap::from([
            ("httpScaledObject".to_owned(), name.to_owned()),
            ("scalerAddress".to_owned(), scaler.to_owned()),
        ]),
    }
}

/// The reference KEDA sends for a ScaledObject `name` the user writes for InterceptorRoute
/// `route` (the add-on's operator makes none for one): its `external-push` trigger names the
/// route.
pub fn interceptor_route_ref(
    namespace: &str,
    name: &str,
    route: &str,
    scaler: &str,
) -> pb::ScaledObjectRef {
    pb::ScaledObjectRef {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        scaler_metadata: HashMap::from([
            ("interceptorRoute".to_owned(), route.to_owned()),
            ("scalerAddress".to_owned(), scaler.to_owned()),
        ]),
    }
}

/// An HTTPScaledObject as a user writes it, in namespace `default`: `hosts`, `paths` (its
/// `pathPrefixes`), to Service `service` at `port`; `annotations`, lines under
/// `metadata.annotations` (indented four spaces), and `extra`, more YAML under `spec`
/// (indented two).
#[derive(Clone, Debug)]
pub struct HttpScaledObject<'a> {
    pub name: &'a str,
    pub hosts: &'a [&'a str],
    pub paths: &'a [&'a str],
    pub service: &'a str,
    pub port: u16,
    pub annotations: &'a str,
    pub extra: &'a str,
}

impl HttpScaledObject<'_> {
    /// The object's YAML.
    pub fn yaml(&self) -> String {
        let list = |items: &[&str]| {
            items
                .iter()
                .map(|item| format!("\"{item}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let annotations = if self.annotations.is_empty() {
            String::new()
        } else {
            format!("  annotations:\n{}\n", self.annotations)
        };
        format!(
            "apiVersion: http.keda.sh/v1alpha1\nkind: HTTPScaledObject\nmetadata:\n  \
             namespace: default\n  name: {name}\n{annotations}spec:\n  hosts: [{hosts}]\n  \
             pathPrefixes: [{paths}]\n  scaleTargetRef:\n    name: {name}\n    kind: Deployment\n    \
             apiVersion: apps/v1\n    service: {service}\n    port: {port}\n  replicas:\n    \
             min: 0\n    max: 10\n{extra}\n---\n",
            name = self.name,
            hosts = list(self.hosts),
            paths = list(self.paths),
            service = self.service,
            port = self.port,
            extra = self.extra,
        )
    }
}

/// A Service with one port `http` (`port` → `target_port`); `app_protocol` for h2c.
pub fn service(
    namespace: &str,
    name: &str,
    port: u16,
    target_port: u16,
    app_protocol: Option<&str>,
) -> String {
    let app_protocol = app_protocol
        .map(|protocol| format!("\n    appProtocol: {protocol}"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  namespace: {namespace}\n  name: {name}\n\
         spec:\n  ports:\n  - name: http\n    port: {port}\n    targetPort: {target_port}{app_protocol}\n---\n"
    )
}

/// The EndpointSlice the endpoint controller writes for Service `service`: its pods at
/// `port` (named `http`), `ready` ones and `not_ready` ones. `version`: `v1beta1` on a 1.20
/// server.
pub fn endpoint_slice(
    version: &str,
    namespace: &str,
    service: &str,
    ready: &[IpAddr],
    not_ready: &[IpAddr],
    port: u16,
) -> String {
    let mut endpoints = String::new();
    for (ips, ready) in [(ready, true), (not_ready, false)] {
        for ip in ips {
            endpoints.push_str(&format!(
                "- addresses: [\"{ip}\"]\n  conditions:\n    ready: {ready}\n"
            ));
        }
    }
    let endpoints = if endpoints.is_empty() {
        "endpoints: []\n".to_owned()
    } else {
        format!("endpoints:\n{endpoints}")
    };
    let family = if ready.iter().chain(not_ready).any(IpAddr::is_ipv6) {
        "IPv6"
    } else {
        "IPv4"
    };
    format!(
        "apiVersion: discovery.k8s.io/{version}\nkind: EndpointSlice\nmetadata:\n  \
         namespace: {namespace}\n  name: {service}-slice\n  labels:\n    \
         kubernetes.io/service-name: {service}\naddressType: {family}\nports:\n- name: http\n  \
         port: {port}\n  protocol: TCP\n{endpoints}---\n"
    )
}
