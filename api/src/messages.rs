//! Bodies of the answers the activator writes itself, byte for byte as the Go activator writes
//! them (`http.Error` adds the newline) unless a comment says the answer is ours.

/// 404 for a revision the activator does not know (upstream's lister error, quoted).
pub fn revision_not_found(name: &str) -> String {
    format!("Error getting active endpoint: revision.serving.knative.dev \"{name}\" not found\n")
}

/// 503 when the revision's queue (or the process-wide cap, ours) is full.
pub const QUEUE_FULL: &str = "pending request queue full\n";

/// 504 when a request timer fires before anything was written (upstream: no newline).
pub const TIMEOUT: &str = "activator request timeout";

/// The same 504 from a queue-proxy (upstream `pkg/http/handler/timeout.go`, no newline).
pub const QUEUE_PROXY_TIMEOUT: &str = "request timeout";

/// 503 for a request that was waiting when its revision left routing. Ours.
pub const REVISION_GONE: &str = "revision is no longer served\n";

/// 500 to a kubelet probe once SIGTERM has arrived.
pub const DRAINING: &str = "received SIGTERM from kubelet\n";

/// 500 to a kubelet probe (without the newline, which the answer adds) while the autoscaler's
/// stat link is down: upstream's `statSink.Status()` error.
pub const AUTOSCALER_NOT_CONNECTED: &str = "connection has not yet been established";

/// 503 from a queue-proxy to a health check or network probe once it drains (upstream
/// `drain.go`).
pub const SHUTTING_DOWN: &str = "shutting down\n";

/// 400 to `K-Network-Probe: probe` without a hash.
pub const PROBE_WITHOUT_HASH: &str =
    "a probe request must contain a non-empty \"K-Network-Hash\" header\n";

/// 503 to a registration when the control thread cannot take it. Ours.
pub const CONTROL_PLANE_UNAVAILABLE: &str = "activator control plane unavailable\n";

/// Body of the 500 a request gets when a panic in kactivator ended it before any of its answer
/// was written (the shard serves on; the panic is logged and counted).
pub const INTERNAL_ERROR: &str = "activator internal error (see the activator's log)\n";

/// 405 to a CONNECT request: the activator routes by revision and is not a forward proxy
/// (upstream relays CONNECT to the pod). Ours.
pub const CONNECT_REFUSED: &str = "CONNECT is not supported: kactivator is not a forward proxy\n";

/// The `Allow` field of the 405 to CONNECT: the methods a revision is served with.
pub const CONNECT_REFUSED_ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH";

/// Content type of an error body, as Go's `http.Error` sends it.
pub const ERROR_CONTENT_TYPE: &str = "text/plain; charset=utf-8";
