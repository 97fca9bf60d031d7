//! What a template renders from ([`Input`]: the request, the response, the revision) and what
//! it tells its caller ([`HeadersRead`], [`RenderError`]): plain data, below the parser and the
//! renderer that both use it.

use std::fmt;

use crate::url;

/// A failure while rendering that Go's `Execute` also reports (an index out
/// of range, for example). Knative then writes [`fallback_line`] instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderError {
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for RenderError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "request log template: {}", self.message)
    }
}

impl std::error::Error for RenderError {}

/// Which request headers rendering can read, so the caller copies only those.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeadersRead {
    /// The template reads no header.
    None,
    /// Only these headers, as Go's canonical header keys (`X-B3-Traceid`),
    /// sorted. Use [`HeadersRead::wants`] to test a received name.
    Names(Vec<String>),
    /// The template reads the whole header map (prints it, ranges over it,
    /// looks up a name that is only known per request, ...).
    All,
}

impl HeadersRead {
    /// Whether a header received with `name` (in any letter case) must be
    /// passed in [`Request::headers`].
    pub fn wants(&self, name: &[u8]) -> bool {
        match self {
            HeadersRead::None => false,
            HeadersRead::All => true,
            HeadersRead::Names(names) => names
                .iter()
                .any(|key| url::header_name_matches(name, key.as_bytes())),
        }
    }
}

/// Everything one log line is rendered from: Knative's
/// `RequestLogTemplateInput`.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// The request (`.Request`).
    pub request: Request<'a>,
    /// The response summary (`.Response`).
    pub response: Response,
    /// The revision the proxy serves (`.Revision`).
    pub revision: &'a Revision,
}

/// The request protocol, as Go reports it in `Proto`, `ProtoMajor` and
/// `ProtoMinor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// `HTTP/1.0`.
    Http10,
    /// `HTTP/1.1`.
    Http11,
    /// `HTTP/2.0`.
    Http2,
}

impl Proto {
    pub(crate) fn text(self) -> &'static [u8] {
        match self {
            Proto::Http10 => b"HTTP/1.0",
            Proto::Http11 => b"HTTP/1.1",
            Proto::Http2 => b"HTTP/2.0",
        }
    }

    pub(crate) fn version(self) -> (i64, i64) {
        match self {
            Proto::Http10 => (1, 0),
            Proto::Http11 => (1, 1),
            Proto::Http2 => (2, 0),
        }
    }

    pub(crate) fn is_http1(self) -> bool {
        self != Proto::Http2
    }
}

/// The parts of Go's `*http.Request` that templates can read.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The method (`.Request.Method`).
    pub method: &'a [u8],
    /// The request-target as received (HTTP/2: `:path`); Go's `RequestURI`.
    /// `.Request.URL` is parsed from it the way Go's server parses it.
    pub request_uri: &'a [u8],
    /// The protocol version.
    pub proto: Proto,
    /// Go's `ContentLength`: the declared body length, -1 when unknown
    /// (chunked, or HTTP/2 without `content-length`), 0 without a body.
    pub content_length: i64,
    /// Go's `Host`: the authority of an absolute-form target, else the
    /// `Host` header (HTTP/2: `:authority`).
    pub host: &'a [u8],
    /// The peer address, `ip:port` or `[v6]:port`.
    pub remote_addr: &'a [u8],
    /// The headers in arrival order as `(name as received, value)`, values
    /// with surrounding spaces and tabs removed as Go's reader removes them.
    /// Only headers that [`Template::headers_read`] wants need to be present.
    ///
    /// For HTTP/2 these are the regular fields only (no pseudo-headers).
    ///
    /// The engine models what Go's server leaves in `Header`. HTTP/1.x
    /// (`http.ReadRequest`): `Host` and `Transfer-Encoding` are gone; with
    /// `content_length` -1 (chunked) so are `Content-Length` and `Trailer`;
    /// of repeated `Content-Length` lines only the first stays (Go accepts
    /// repeats only when they are equal); `Cache-Control: no-cache` is added
    /// when `Pragma` starts with `no-cache` and there is no `Cache-Control`.
    /// HTTP/2 (Go's HTTP/2 server): `Trailer` and an `Expect: 100-continue`
    /// are gone and repeated `Cookie` fields become one value joined by `"; "`.
    pub headers: &'a [(&'a [u8], &'a [u8])],
}

/// Knative's `RequestLogResponse`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Response {
    /// The status code (`.Response.Code`).
    pub code: u16,
    /// Body bytes written (`.Response.Size`, a Go `int`; saturates at
    /// `i64::MAX`).
    pub size: u64,
    /// Seconds from receiving the request to the end of the response
    /// (`.Response.Latency`).
    pub latency_seconds: f64,
}

/// Knative's `RequestLogRevision`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Revision {
    /// `.Revision.Name`.
    pub name: String,
    /// `.Revision.Namespace`.
    pub namespace: String,
    /// `.Revision.Service`.
    pub service: String,
    /// `.Revision.Configuration`.
    pub configuration: String,
    /// `.Revision.PodName`.
    pub pod_name: String,
    /// `.Revision.PodIP`.
    pub pod_ip: String,
}
