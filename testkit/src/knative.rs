//! The objects Knative's reconcilers write for a revision, as YAML for [`crate::apiserver`]: the
//! Revision (the fields the activator reads, which no defaulting webhook fills in here), its
//! private Service, and its endpoints, core/v1 or EndpointSlice, labelled the way the SKS
//! reconciler labels them (`networking.internal.knative.dev/serviceType`,
//! `serving.knative.dev/revision`). One definition for the end-to-end tests and the benchmarks.

use std::fmt::Write;
use std::net::IpAddr;

/// A revision's Services and endpoints: its pods (`<rev>-private`) or its activators (`<rev>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceType {
    Private,
    Public,
}

impl ServiceType {
    fn label(self) -> &'static str {
        match self {
            ServiceType::Private => "Private",
            ServiceType::Public => "Public",
        }
    }
}

/// The labels of a revision's Service or endpoints, indented for `metadata.labels`.
fn owner_labels(revision: &str, kind: ServiceType) -> String {
    format!(
        "    networking.internal.knative.dev/serviceType: {}\n    serving.knative.dev/revision: {revision}\n",
        kind.label()
    )
}

/// Revision `namespace/name` with `containerConcurrency: cc`, a 60 s timeout and one container
/// with an unnamed port (HTTP/1).
pub fn revision(namespace: &str, name: &str, cc: u32) -> String {
    revision_with_port(namespace, name, cc, "- containerPort: 8080")
}

/// [`revision`] whose container port is named `h2c`: Knative's mark of an HTTP/2 (gRPC)
/// revision.
pub fn h2c_revision(namespace: &str, name: &str, cc: u32) -> String {
    revision_with_port(
        namespace,
        name,
        cc,
        "- name: h2c\n      containerPort: 8080",
    )
}

/// [`revision`] with `port` as the container's one port (YAML, indented for the list).
fn revision_with_port(namespace: &str, name: &str, cc: u32, port: &str) -> String {
    format!(
        "apiVersion: serving.knative.dev/v1
kind: Revision
metadata:
  name: {name}
  namespace: {namespace}
  labels:
    serving.knative.dev/service: {name}
    serving.knative.dev/configuration: {name}
spec:
  containerConcurrency: {cc}
  timeoutSeconds: 60
  containers:
  - image: example.com/app
    ports:
    {port}
---
"
    )
}

/// The revision's private Service `<name>-private`: port `http` 80 → `target_port`.
pub fn private_service(namespace: &str, name: &str, target_port: u16) -> String {
    private_service_at(namespace, name, target_port, None)
}

/// [`private_service`] with the ClusterIP `cluster_ip` instead of one the apiserver picks.
pub fn private_service_at(
    namespace: &str,
    name: &str,
    target_port: u16,
    cluster_ip: Option<std::net::IpAddr>,
) -> String {
    let cluster_ip = cluster_ip
        .map(|address| format!("  clusterIP: {address}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: {name}-private
  namespace: {namespace}
  labels:
{labels}spec:
{cluster_ip}  ports:
  - name: http
    port: 80
    targetPort: {target_port}
---
",
        labels = owner_labels(name, ServiceType::Private)
    )
}

/// The object name of a revision's endpoints of this kind.
pub fn endpoints_name(revision: &str, kind: ServiceType) -> String {
    match kind {
        ServiceType::Private => format!("{revision}-private"),
        ServiceType::Public => revision.to_string(),
    }
}

/// core/v1 Endpoints of `revision` listing `ready` and `not_ready` at `port` (named `http`), in
/// one subset; none at all when both are empty.
pub fn endpoints(
    namespace: &str,
    revision: &str,
    kind: ServiceType,
    ready: &[IpAddr],
    not_ready: &[IpAddr],
    port: u16,
) -> String {
    let mut yaml = format!(
        "apiVersion: v1\nkind: Endpoints\nmetadata:\n  name: {}\n  namespace: {namespace}\n  labels:\n{}",
        endpoints_name(revision, kind),
        owner_labels(revision, kind)
    );
    if ready.is_empty() && not_ready.is_empty() {
        yaml.push_str("subsets: []\n");
    } else {
        let _ = writeln!(yaml, "subsets:\n- ports:\n  - name: http\n    port: {port}");
        for (field, ips) in [("addresses", ready), ("notReadyAddresses", not_ready)] {
            if !ips.is_empty() {
                let _ = writeln!(yaml, "  {field}:");
                for ip in ips {
                    let _ = writeln!(yaml, "  - ip: {ip}");
                }
            }
        }
    }
    yaml.push_str("---\n");
    yaml
}

/// A `discovery.k8s.io/<version>` EndpointSlice of `revision` with the same content as
/// [`endpoints`].
pub fn endpoint_slice(
    version: &str,
    namespace: &str,
    revision: &str,
    kind: ServiceType,
    ready: &[IpAddr],
    not_ready: &[IpAddr],
    port: u16,
) -> String {
    let service = endpoints_name(revision, kind);
    // A slice holds one family: Kubernetes writes one slice per family of a dual-stack Service.
    let family = if ready.iter().chain(not_ready).any(IpAddr::is_ipv6) {
        "IPv6"
    } else {
        "IPv4"
    };
    let mut yaml = format!(
        "apiVersion: discovery.k8s.io/{version}\nkind: EndpointSlice\nmetadata:\n  name: {service}-abcde\n  namespace: {namespace}\n  labels:\n    kubernetes.io/service-name: {service}\n{}addressType: {family}\nports:\n- name: http\n  port: {port}\n  protocol: TCP\n",
        owner_labels(revision, kind)
    );
    if ready.is_empty() && not_ready.is_empty() {
        yaml.push_str("endpoints: []\n");
    } else {
        yaml.push_str("endpoints:\n");
        for (ips, is_ready) in [(ready, true), (not_ready, false)] {
            for ip in ips {
                let _ = writeln!(
                    yaml,
                    "- addresses: [\"{ip}\"]\n  conditions:\n    ready: {is_ready}"
                );
            }
        }
    }
    yaml.push_str("---\n");
    yaml
}

/// `config-network` in `knative-serving` with these keys (values quoted).
pub fn config_network(data: &[(&str, &str)]) -> String {
    let data: String = data
        .iter()
        .map(|(key, value)| format!("  {key}: \"{value}\"\n"))
        .collect();
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-network\n  namespace: knative-serving\ndata:\n{data}---\n"
    )
}

/// A PEM text as a YAML block scalar, indented by `indent` spaces.
fn block(text: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    let mut out = String::from("|\n");
    for line in text.lines() {
        let _ = writeln!(out, "{pad}{line}");
    }
    out
}

/// The Secret `knative-serving/routing-serving-certs` as cert-manager writes it for Knative's
/// system-internal TLS (`reference/tls.md` §5): the activator's chain and key, and the CA.
pub fn routing_serving_certs(chain: &str, key: &str, ca: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: routing-serving-certs\n  namespace: knative-serving\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: {}  tls.key: {}  ca.crt: {}---\n",
        block(chain, 4),
        block(key, 4),
        block(ca, 4)
    )
}

/// A ConfigMap of `knative-serving` labelled `networking.knative.dev/trust-bundle` (value
/// `"true"`, as upstream's e2e test labels `knative-bundle`), one key per PEM bundle.
pub fn trust_bundle(name: &str, bundles: &[(&str, &str)]) -> String {
    let data: String = bundles
        .iter()
        .map(|(key, pem)| format!("  {key}: {}", block(pem, 4)))
        .collect();
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: knative-serving\n  labels:\n    networking.knative.dev/trust-bundle: \"true\"\ndata:\n{data}---\n"
    )
}
