//! Read access to a request's headers, whatever protocol carried them, so that the rules that
//! read headers (which revision, local answers, what the pod is sent) are written once for
//! every front.

use kactivator_api::headers;

/// Hop-by-hop headers that never cross the proxy (RFC 9110 §7.6.1 plus the legacy ones Go drops).
pub const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Request headers that the activator consumes or replaces, whatever protocol carried them.
pub const CONSUMED_REQUEST_HEADERS: [&str; 7] = [
    headers::HOST,
    headers::REVISION,
    headers::NAMESPACE,
    headers::NETWORK_HASH,
    headers::PROXY_REQUEST,
    headers::FORWARDED_FOR,
    headers::RUN_ID,
];

/// The view of a request's fields every layer reads (defined below the layers that read it).
pub use crate::fields::RequestHeaders;
