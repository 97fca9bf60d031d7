//! Header names kactivator reads or writes, spelled as Go's canonical form. HTTP/1 compares
//! names without regard to case; an HTTP/2 front lower-cases them.

/// Request header naming the revision (set by the ingress).
pub const REVISION: &str = "Knative-Serving-Revision";
/// Request header naming the revision's namespace (set by the ingress).
pub const NAMESPACE: &str = "Knative-Serving-Namespace";

/// The traffic tag a request was routed by (set by the ingress when tag-header routing is on).
pub const ROUTE_TAG: &str = "Knative-Serving-Tag";
/// `true` when the ingress routed a request by the Route's default target (set by the ingress
/// when tag-header routing is on).
pub const DEFAULT_ROUTE: &str = "Knative-Serving-Default-Route";

/// Set on every proxied request: `K-Proxy-Request: activator`.
pub const PROXY_REQUEST: &str = "K-Proxy-Request";
/// Value of [`PROXY_REQUEST`].
pub const PROXY_REQUEST_VALUE: &str = "activator";
/// Where the client's `Host` goes when the outbound `Host` becomes the pod.
pub const ORIGINAL_HOST: &str = "K-Original-Host";
/// Appended with the client's address on every proxied request.
pub const FORWARDED_FOR: &str = "X-Forwarded-For";
/// A request id; replaced by [`RUN_ID`] when that is present.
pub const REQUEST_ID: &str = "X-Request-Id";
/// The fork's run id: when present it replaces [`REQUEST_ID`] and is removed.
pub const RUN_ID: &str = "X-Run-Id";

/// Knative's network probe header: `probe` (ingress, echoes [`NETWORK_HASH`]), `activator`
/// (answered `activator`), `queue` (what the activator sends a queue-proxy).
pub const NETWORK_PROBE: &str = "K-Network-Probe";
/// The hash an ingress probe carries and gets back.
pub const NETWORK_HASH: &str = "K-Network-Hash";
/// A non-empty value marks a kubelet probe (besides a `kube-probe/` user agent).
pub const KUBELET_PROBE: &str = "K-Kubelet-Probe";

/// Response header of a (fork) queue-proxy naming the revision it serves.
pub const SERVING_REVISION_NAME: &str = "X-Knative-Revision-Name";
/// Response header of a (fork) queue-proxy naming that revision's namespace.
pub const SERVING_REVISION_NAMESPACE: &str = "X-Knative-Revision-Namespace";

/// Marks a registration relayed by a peer activator: it is applied, not relayed again. Ours.
pub const RELAYED: &str = "K-Activator-Relayed";

pub const USER_AGENT: &str = "User-Agent";
pub const HOST: &str = "Host";

/// ★ On a response whose request waited in the activator for a slot: `activator;dur=<ms>`
/// (W3C Server Timing), the time waited.
pub const SERVER_TIMING: &str = "Server-Timing";
/// The Server Timing metric name the activator's wait goes under.
pub const SERVER_TIMING_METRIC: &str = "activator";
/// ★ On a response whose request waited for a revision with no routable pod (a cold start):
/// `true`. Our name; KEDA's HTTP add-on marks the same with `X-KEDA-HTTP-Cold-Start`.
pub const COLD_START: &str = "X-Activator-Cold-Start";
/// KEDA's HTTP add-on's response field: `true` when the request waited for its route's first
/// ready endpoint, `false` when one was ready (`pkg/http/headers.go` at v0.15.0).
pub const KEDA_COLD_START: &str = "X-KEDA-HTTP-Cold-Start";
