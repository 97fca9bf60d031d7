//! Request routing: every route of the test backend, plus the identity headers stamped on
//! every response.

use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{
    HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, TRAILER,
};
use hyper::{Request, Response, StatusCode};

use super::bodies::{
    empty, full, text, BoxError, InFlightBody, PatternBody, RouteBody, SlowBody, SLOW_FRAME_SIZE,
};
use super::{upgrades, ConnectionContext, Shared};
use crate::pattern::Checksum;

/// Headers a Knative queue-proxy adds to every response, validated before use. The
/// revision headers can change while the backend runs, to play a pod whose address was
/// handed to another revision.
#[derive(Debug)]
pub(crate) struct Identity {
    pub(crate) name: String,
    name_value: HeaderValue,
    revision: RwLock<RevisionHeaders>,
}

#[derive(Debug, Default)]
struct RevisionHeaders {
    name: Option<HeaderValue>,
    namespace: Option<HeaderValue>,
}

const BACKEND_HEADER: HeaderName = HeaderName::from_static("x-backend");
const REVISION_NAME_HEADER: HeaderName = HeaderName::from_static("x-knative-revision-name");
const REVISION_NAMESPACE_HEADER: HeaderName =
    HeaderName::from_static("x-knative-revision-namespace");
const PROBE_HEADER: HeaderName = HeaderName::from_static("k-network-probe");

fn header_value(value: &str) -> std::io::Result<HeaderValue> {
    HeaderValue::from_str(value).map_err(|error| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{value:?} cannot be sent as a header value: {error}"),
        )
    })
}

impl Identity {
    /// Validates the configured names as header values, so a bad name fails `spawn`
    /// instead of every request.
    pub(crate) fn new(
        name: &str,
        revision_name: Option<&str>,
        revision_namespace: Option<&str>,
    ) -> std::io::Result<Self> {
        let identity = Self {
            name: name.to_owned(),
            name_value: header_value(name)?,
            revision: RwLock::default(),
        };
        identity.set_revision(revision_name, revision_namespace)?;
        Ok(identity)
    }

    /// Replaces the revision headers; `None` stops sending that header. Nothing changes
    /// when a value cannot be a header value.
    pub(crate) fn set_revision(
        &self,
        revision_name: Option<&str>,
        revision_namespace: Option<&str>,
    ) -> std::io::Result<()> {
        let headers = RevisionHeaders {
            name: revision_name.map(header_value).transpose()?,
            namespace: revision_namespace.map(header_value).transpose()?,
        };
        // A panic elsewhere cannot leave two header values half-written, so a poisoned
        // lock still holds a consistent pair.
        *self
            .revision
            .write()
            .unwrap_or_else(PoisonError::into_inner) = headers;
        Ok(())
    }

    pub(crate) fn stamp(&self, headers: &mut HeaderMap) {
        headers.insert(BACKEND_HEADER, self.name_value.clone());
        let revision = self.revision.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(revision_name) = &revision.name {
            headers.insert(REVISION_NAME_HEADER, revision_name.clone());
        }
        if let Some(revision_namespace) = &revision.namespace {
            headers.insert(REVISION_NAMESPACE_HEADER, revision_namespace.clone());
        }
    }
}

/// Serves one request: answers queue-proxy probes itself, otherwise counts the request,
/// routes it, and ties the in-flight count to the response body; every response gets the
/// identity headers.
pub(crate) async fn handle(
    request: Request<Incoming>,
    connection: Arc<ConnectionContext>,
) -> Response<InFlightBody> {
    let shared = &connection.shared;
    if is_queue_probe(&request) {
        let mut response = queue_probe(request, shared).await;
        shared.identity.stamp(response.headers_mut());
        return response.map(InFlightBody::untracked);
    }
    // Taken before routing so that a handler future dropped mid-way (client gone during
    // /delay) still releases the count.
    let guard = shared.counters.request_started();
    let mut response = route(request, &connection).await;
    shared.identity.stamp(response.headers_mut());
    response.map(|body| InFlightBody::new(body, guard))
}

/// A Knative queue-proxy answers `K-Network-Probe: queue` on any path, without passing the
/// request to the user container.
fn is_queue_probe(request: &Request<Incoming>) -> bool {
    request
        .headers()
        .get(PROBE_HEADER)
        .is_some_and(|value| value == "queue")
}

/// The queue-proxy's probe answer: 200 `queue` when ready, else 503 with no body.
async fn queue_probe(request: Request<Incoming>, shared: &Shared) -> Response<RouteBody> {
    shared.counters.probe_answered();
    drain(request.into_body()).await;
    let delay = shared.probe_delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if shared.probe_healthy.load(Ordering::SeqCst) {
        text(StatusCode::OK, "queue")
    } else {
        let mut response = Response::new(empty());
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        response
    }
}

async fn route(
    request: Request<Incoming>,
    connection: &Arc<ConnectionContext>,
) -> Response<RouteBody> {
    let path = request.uri().path().to_owned();
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(&path).split('/').collect();
    match segments.as_slice() {
        [""] => {
            drain(request.into_body()).await;
            let name = &connection.shared.identity.name;
            text(StatusCode::OK, format!("hello from {name}\n"))
        }
        // Queue-proxy probes never get here; see `handle`.
        ["healthz"] => {
            drain(request.into_body()).await;
            text(StatusCode::OK, "ok")
        }
        ["echo"] => echo(request),
        ["headers"] => headers(request).await,
        ["sink"] => sink(request.into_body()).await,
        ["bytes", length] => match parse::<u64>(length) {
            Some(length) => {
                drain(request.into_body()).await;
                let mut response = binary(PatternBody::sized(length).boxed_unsync());
                response
                    .headers_mut()
                    .insert(CONTENT_LENGTH, HeaderValue::from(length));
                response
            }
            None => no_route(request).await,
        },
        ["chunked", length] => match parse::<u64>(length) {
            Some(length) => {
                drain(request.into_body()).await;
                binary(PatternBody::chunked(length).boxed_unsync())
            }
            None => no_route(request).await,
        },
        ["delay", milliseconds] => match parse::<u64>(milliseconds) {
            Some(milliseconds) => {
                drain(request.into_body()).await;
                tokio::time::sleep(Duration::from_millis(milliseconds)).await;
                text(StatusCode::OK, format!("slept {milliseconds}\n"))
            }
            None => no_route(request).await,
        },
        ["status", code] => match parse::<u16>(code) {
            Some(code) => {
                drain(request.into_body()).await;
                status(code)
            }
            None => no_route(request).await,
        },
        ["trailers"] => {
            drain(request.into_body()).await;
            trailers()
        }
        // An app that sets a header of its choosing, e.g. one relaying another service's answer.
        ["respond-header", name, value] => match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            (Ok(name), Ok(value)) => {
                drain(request.into_body()).await;
                let mut response = text(StatusCode::OK, "with a header of my own\n");
                response.headers_mut().insert(name, value);
                response
            }
            _ => no_route(request).await,
        },
        ["slow-body", frames, milliseconds] => {
            match (parse::<u64>(frames), parse::<u64>(milliseconds)) {
                (Some(frames), Some(milliseconds)) => {
                    drain(request.into_body()).await;
                    slow_body(frames, Duration::from_millis(milliseconds))
                }
                _ => no_route(request).await,
            }
        }
        ["close"] => {
            drain(request.into_body()).await;
            let mut response = text(StatusCode::OK, "bye\n");
            // Hyper sees this header on the response and closes once it is written.
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            response
        }
        ["ws"] => upgrades::websocket(request, Arc::clone(connection)),
        ["ws-half-close"] => upgrades::raw_echo(request, Arc::clone(connection)),
        _ => no_route(request).await,
    }
}

/// Streams the request body straight back; hyper forwards each frame as it arrives, so
/// nothing beyond one frame is buffered.
fn echo(request: Request<Incoming>) -> Response<RouteBody> {
    let content_type = request.headers().get(CONTENT_TYPE).cloned();
    // Only a declared length is copied; otherwise hyper picks chunked encoding because the
    // incoming body's size is unknown.
    let content_length = request.headers().get(CONTENT_LENGTH).cloned();
    let body = request.into_body().map_err(BoxError::from).boxed_unsync();
    let mut response = Response::new(body);
    if let Some(content_type) = content_type {
        response.headers_mut().insert(CONTENT_TYPE, content_type);
    }
    if let Some(content_length) = content_length {
        response
            .headers_mut()
            .insert(CONTENT_LENGTH, content_length);
    }
    response
}

/// Describes the request as JSON, in the order hyper's header map yields the headers.
async fn headers(request: Request<Incoming>) -> Response<RouteBody> {
    let (parts, body) = request.into_parts();
    let header_pairs: Vec<[String; 2]> = parts
        .headers
        .iter()
        .map(|(name, value)| {
            [
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            ]
        })
        .collect();
    let mut checksum = Checksum::new();
    if let Err(error) = consume(body, &mut checksum).await {
        return body_failed(&error);
    }
    json(&serde_json::json!({
        "method": parts.method.as_str(),
        "uri": parts.uri.to_string(),
        "version": format!("{:?}", parts.version),
        "headers": header_pairs,
        "body_bytes": checksum.bytes(),
    }))
}

/// Reads the whole body frame by frame and reports its length and checksum.
async fn sink(body: Incoming) -> Response<RouteBody> {
    let mut checksum = Checksum::new();
    match consume(body, &mut checksum).await {
        Ok(()) => json(&serde_json::json!({
            "bytes": checksum.bytes(),
            "checksum": checksum.value(),
        })),
        Err(error) => body_failed(&error),
    }
}

fn status(code: u16) -> Response<RouteBody> {
    let status = match StatusCode::from_u16(code) {
        // An informational status cannot end an exchange; hyper would emit it and then
        // wait for a final response that never comes.
        Ok(status) if !status.is_informational() => status,
        _ => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("cannot respond with status {code}\n"),
            )
        }
    };
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        let mut response = Response::new(empty());
        *response.status_mut() = status;
        response
    } else {
        text(status, format!("status {code}\n"))
    }
}

/// A chunked body followed by two trailer fields.
///
/// Hyper 1.x writes trailers only when the request carried `TE: trailers` and the
/// response declares the field names in a `Trailer` header; otherwise it silently drops
/// them and still terminates the chunked body correctly. So this route declares them and
/// a client that omits `TE: trailers` gets `hello\n` and no trailers.
fn trailers() -> Response<RouteBody> {
    let mut trailer_fields = HeaderMap::new();
    trailer_fields.insert("x-checksum", HeaderValue::from_static("abc"));
    trailer_fields.insert("x-final", HeaderValue::from_static("yes"));
    let frames: [Result<Frame<Bytes>, BoxError>; 2] = [
        Ok(Frame::data(Bytes::from_static(b"hello\n"))),
        Ok(Frame::trailers(trailer_fields)),
    ];
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync();
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(TRAILER, HeaderValue::from_static("x-checksum, x-final"));
    response
}

/// `frames` KiB of pattern bytes, one KiB at a time with `interval` between them, sent
/// with a Content-Length so that a client can tell a cut-off body from a complete one.
fn slow_body(frames: u64, interval: Duration) -> Response<RouteBody> {
    let Some(length) = frames.checked_mul(SLOW_FRAME_SIZE as u64) else {
        return text(StatusCode::BAD_REQUEST, "too many frames\n");
    };
    let mut response = binary(SlowBody::new(frames, interval).boxed_unsync());
    response
        .headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(length));
    response
}

async fn no_route(request: Request<Incoming>) -> Response<RouteBody> {
    drain(request.into_body()).await;
    text(StatusCode::NOT_FOUND, "no route\n")
}

/// Reads and discards a request body.
///
/// Routes that ignore the body still read it before responding: hyper gives up on a
/// connection whose request body was left unread, and tests and benchmarks expect
/// keep-alive to hold regardless of what they upload.
async fn drain(mut body: Incoming) {
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            return;
        }
    }
}

/// Feeds every data frame of `body` to `checksum` without keeping the data.
async fn consume(mut body: Incoming, checksum: &mut Checksum) -> Result<(), hyper::Error> {
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            checksum.update(data);
        }
    }
    Ok(())
}

fn body_failed(error: &hyper::Error) -> Response<RouteBody> {
    text(
        StatusCode::BAD_REQUEST,
        format!("reading the request body failed: {error}\n"),
    )
}

fn parse<Number: FromStr>(segment: &str) -> Option<Number> {
    segment.parse().ok()
}

fn json(value: &serde_json::Value) -> Response<RouteBody> {
    let mut body = value.to_string();
    body.push('\n');
    let mut response = Response::new(full(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn binary(body: RouteBody) -> Response<RouteBody> {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    response
}
