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

/// A request's headers as the request path reads them.
pub trait RequestHeaders {
    /// The first value of header `name`, compared without regard to case.
    fn get(&self, name: &str) -> Option<&[u8]>;

    /// Where the client addressed the request: HTTP/1's `Host`, HTTP/2's `:authority`.
    fn authority(&self) -> Option<&[u8]>;
}

/// Headers as a list of `(name, value)` pairs, `Host` being the authority: what the tests of
/// the header rules use, and a front with no header structure of its own could.
impl RequestHeaders for [(&str, &str)] {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(field, _)| field.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_bytes())
    }

    fn authority(&self) -> Option<&[u8]> {
        RequestHeaders::get(self, kactivator_api::headers::HOST)
    }
}
