//! Probes: the kubelet's and the network probes the activator answers, and the health check it
//! sends a queue-proxy (upstream `revision_backends.go` §4.2, queue-proxy §4.6). The pods of an
//! h2c revision get the gRPC health check instead ([`crate::grpc_health`]), with the same
//! user agent and `K-Network-Probe` header.

/// A kubelet probe's user agent starts with this.
pub const KUBE_PROBE_USER_AGENT_PREFIX: &str = "kube-probe/";

/// Value of `K-Network-Probe` on an ingress probe.
pub const NETWORK_PROBE_INGRESS: &str = "probe";
/// Value of `K-Network-Probe` asking for the activator itself; the answer's body too.
pub const NETWORK_PROBE_ACTIVATOR: &str = "activator";

/// Path of the health check sent to a queue-proxy.
pub const HEALTH_PATH: &str = "/healthz";
/// User agent of that health check (upstream's, so pods and logs recognise it).
pub const HEALTH_USER_AGENT: &str = "Knative-Activator-Probe";
/// Value of `K-Network-Probe` on that health check, and the body a healthy queue-proxy answers.
pub const QUEUE: &str = "queue";

/// User agent of the autoscaler's probe (upstream `header.go`); a queue-proxy answers it as a
/// health check, as it does the kubelet's and the activator's.
pub const AUTOSCALING_PROBE_USER_AGENT: &str = "Knative-Autoscaling-Probe";
