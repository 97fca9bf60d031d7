//! One HTTP/2 stream as one request: HTTP/2's leaves of the request path
//! (`lifecycle::Front`) — the request's fields from its header map, the activator's
//! answers as HTTP/2 responses, a queued client watched for a reset, the request rewritten for
//! a pod (`request::policy`) — and the exchange with the pod over h2c.
//!
//! The exchange streams both ways with flow control: a chunk read from one side is released to
//! its sender only once the other side took it, so what the activator holds of a stream is
//! bounded by the windows, whatever the speed of either end. Trailers pass through (gRPC's
//! status lives there). A client that resets its stream, or whose connection dies, gives its
//! slot or queue place up at once and the pod's stream is reset.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Method, Request, Response, Uri};
use kactivator_api::{headers, messages, registration};
use kactivator_template::Proto;
use monoio::time::Instant;

use crate::lifecycle::admission::{ClientWatch, Held};
use crate::lifecycle::{self, Attempt, Front, Shape, SmallBody};
use crate::request::answer::Answer;
use crate::request::deadlines::Deadlines;
use crate::request::error::RequestError;
use crate::request::headers::RequestHeaders;
use crate::request::log::{Captured, RequestLine, RequestLog};
use crate::request::outcome::{Ended, Next, RequestShape};
use crate::request::peer::Peer;
use crate::request::policy::{self, AddedField, Edits, WaitNote};
use crate::request::trace::{Decided, Decider, PropagationField};
use crate::routing::replica::LocalPod;
use crate::runtime::contain;
use crate::runtime::race::{race, Either};
use crate::shard::Shard;
use crate::upstream::error::UpstreamError;
use crate::upstream::h2c::{h2_failure, send_all, Cut, Phase};

/// An HTTP/2 request's headers as the request path reads them.
pub(crate) struct H2Headers<'a> {
    pub parts: &'a http::request::Parts,
}

impl RequestHeaders for H2Headers<'_> {
    #[inline]
    fn get(&self, name: &str) -> Option<&[u8]> {
        let value = match known_name(name) {
            Some(known) => self.parts.headers.get(known),
            None => self.parts.headers.get(name),
        };
        value.map(HeaderValue::as_bytes)
    }

    /// `:authority`, else a `Host` header (RFC 9113 §8.3.1 allows either).
    fn authority(&self) -> Option<&[u8]> {
        match self.parts.uri.authority() {
            Some(authority) => Some(authority.as_str().as_bytes()),
            None => self.get(headers::HOST),
        }
    }

    fn target(&self) -> &[u8] {
        self.parts
            .uri
            .path_and_query()
            .map_or(b"/", |target| target.as_str().as_bytes())
    }

    fn has(&self, name: &str, value: Option<&[u8]>) -> bool {
        let mut values = self.parts.headers.get_all(name).iter();
        match value {
            None => values.next().is_some(),
            Some(value) => values.any(|field| field.as_bytes() == value),
        }
    }
}

/// Header names the request path reads, made once (at compile time): a lookup by `&str` parses
/// and lower-cases the name on every call, and this path makes about ten per request.
mod names {
    use http::header::HeaderName;

    pub const REVISION: HeaderName = HeaderName::from_static("knative-serving-revision");
    pub const NAMESPACE: HeaderName = HeaderName::from_static("knative-serving-namespace");
    pub const ORIGINAL_HOST: HeaderName = HeaderName::from_static("k-original-host");
    pub const PROXY_REQUEST: HeaderName = HeaderName::from_static("k-proxy-request");
    pub const FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
    pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
    pub const RUN_ID: HeaderName = HeaderName::from_static("x-run-id");
    pub const NETWORK_PROBE: HeaderName = HeaderName::from_static("k-network-probe");
    pub const NETWORK_HASH: HeaderName = HeaderName::from_static("k-network-hash");
    pub const KUBELET_PROBE: HeaderName = HeaderName::from_static("k-kubelet-probe");
    pub const SERVING_REVISION_NAME: HeaderName =
        HeaderName::from_static("x-knative-revision-name");
    pub const SERVING_REVISION_NAMESPACE: HeaderName =
        HeaderName::from_static("x-knative-revision-namespace");
    pub const RELAYED: HeaderName = HeaderName::from_static("k-activator-relayed");
}

/// The ready-made name of a field the request path reads (`kactivator_api::headers`), if it
/// is one of them.
#[inline]
fn known_name(name: &str) -> Option<&'static HeaderName> {
    static USER_AGENT: HeaderName = http::header::USER_AGENT;
    static HOST: HeaderName = http::header::HOST;
    static REVISION: HeaderName = names::REVISION;
    static NAMESPACE: HeaderName = names::NAMESPACE;
    static REQUEST_ID: HeaderName = names::REQUEST_ID;
    static RUN_ID: HeaderName = names::RUN_ID;
    static NETWORK_PROBE: HeaderName = names::NETWORK_PROBE;
    static NETWORK_HASH: HeaderName = names::NETWORK_HASH;
    static KUBELET_PROBE: HeaderName = names::KUBELET_PROBE;
    static RELAYED: HeaderName = names::RELAYED;
    Some(match name {
        headers::USER_AGENT => &USER_AGENT,
        headers::HOST => &HOST,
        headers::REVISION => &REVISION,
        headers::NAMESPACE => &NAMESPACE,
        headers::REQUEST_ID => &REQUEST_ID,
        headers::RUN_ID => &RUN_ID,
        headers::NETWORK_PROBE => &NETWORK_PROBE,
        headers::NETWORK_HASH => &NETWORK_HASH,
        headers::KUBELET_PROBE => &KUBELET_PROBE,
        headers::RELAYED => &RELAYED,
        _ => return None,
    })
}

/// Serves one stream to its end, a panic included: a panic ends this stream only, with a 500
/// if its answer had not begun, else a reset.
pub(crate) async fn serve_contained(
    shard: Rc<Shard>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    peer: Rc<Peer>,
) {
    let served = contain::catching(serve(&shard, request, &mut respond, peer)).await;
    if let Err(panic) = served {
        contain::record(shard.stats(), "an HTTP/2 stream", &*panic);
        if !send_answer(&mut respond, &Answer::internal_error(), false) {
            respond.send_reset(Reason::INTERNAL_ERROR);
        }
    }
}

/// Serves one stream to its end: through the request path with the stream as its front.
async fn serve(
    shard: &Rc<Shard>,
    request: Request<RecvStream>,
    respond: &mut SendResponse<Bytes>,
    peer: Rc<Peer>,
) {
    let arrival = Instant::now();
    let (parts, body) = request.into_parts();
    let mut front = H2Front::new(parts, body, respond, peer);
    lifecycle::serve(shard, &mut front, arrival).await;
}

/// One stream, as the request path sees it.
struct H2Front<'r> {
    /// The client's request head: what the local answers read, and what the pod's request is
    /// made from.
    parts: http::request::Parts,
    body: RecvStream,
    respond: &'r mut SendResponse<Bytes>,
    peer: Rc<Peer>,
    shape: Shape,
    /// The request, rewritten for a pod once prepared (its `:authority` set on each attempt).
    outbound: Request<()>,
    /// The request's `:authority` for every attempt under the queue-proxy's edits (the
    /// client's, or `K-Original-Host`'s); `None`: the pod's address (the activator's).
    authority: Option<http::uri::Authority>,
    /// The edits the request goes out under (`request::policy::Edits`).
    edits: Edits,
    /// The trace context decided when prepared, written again if the request goes out again.
    trace: Option<Decided>,
    grpc: bool,
    request_id: String,
}

impl<'r> H2Front<'r> {
    fn new(
        parts: http::request::Parts,
        body: RecvStream,
        respond: &'r mut SendResponse<Bytes>,
        peer: Rc<Peer>,
    ) -> H2Front<'r> {
        let shape = Shape {
            connect: parts.method == Method::CONNECT,
            registration: parts.method == Method::POST && parts.uri.path() == registration::PATH,
            head_only: parts.method == Method::HEAD,
            // A stream is not a connection: nothing of one request is left behind in it.
            request: RequestShape {
                keep_alive: true,
                bodiless: body.is_end_stream(),
                upgrade: false,
            },
        };
        H2Front {
            parts,
            body,
            respond,
            peer,
            shape,
            outbound: Request::new(()),
            authority: None,
            edits: Edits::Activator,
            trace: None,
            grpc: false,
            request_id: String::new(),
        }
    }
}

impl Front for H2Front<'_> {
    type Headers<'h>
        = H2Headers<'h>
    where
        Self: 'h;
    type Watch<'w>
        = ResetWatch<'w>
    where
        Self: 'w;

    fn headers(&self) -> H2Headers<'_> {
        H2Headers { parts: &self.parts }
    }

    fn shape(&self) -> Shape {
        self.shape
    }

    fn capture_for_log(&self, log: &RequestLog) -> Option<Captured> {
        let parts = &self.parts;
        // Go's HTTP/2 server: the declared length, 0 when the head ended the stream, else
        // unknown.
        let content_length = if self.shape.request.bodiless {
            0
        } else {
            parts
                .headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|value| value.to_str().ok()?.parse().ok())
                .unwrap_or(-1)
        };
        let line = RequestLine {
            method: parts.method.as_str().as_bytes(),
            target: parts
                .uri
                .path_and_query()
                .map_or(b"".as_slice(), |target| target.as_str().as_bytes()),
            proto: Proto::Http2,
            content_length,
            peer: &self.peer,
        };
        log.capture(&H2Headers { parts }, line, |visit| {
            for (name, value) in &parts.headers {
                visit(name.as_str().as_bytes(), value.as_bytes());
            }
        })
    }

    async fn answer(&mut self, _shard: &Shard, answer: &Answer<'_>, _keep_alive: bool) -> Next {
        send_answer(self.respond, answer, self.shape.head_only);
        Next::KeepAlive
    }

    async fn read_small_body(
        &mut self,
        shard: &Shard,
        limit: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>, SmallBody> {
        let mut body = Vec::new();
        loop {
            match race(self.body.data(), shard.alarms.at(deadline)).await {
                Either::Left(Some(Ok(chunk))) => {
                    let _ = self.body.flow_control().release_capacity(chunk.len());
                    if body.len() + chunk.len() > limit {
                        return Err(SmallBody::TooLarge);
                    }
                    body.extend_from_slice(&chunk);
                }
                Either::Left(None) => return Ok(body),
                Either::Left(Some(Err(_))) | Either::Right(()) => return Err(SmallBody::Gone),
            }
        }
    }

    fn prepare(&mut self, edits: Edits, mut trace: Option<&mut Decider<'_>>) {
        self.edits = edits;
        let fields = H2Headers { parts: &self.parts };
        self.request_id = policy::run_id(&fields)
            .or_else(|| fields.get(headers::REQUEST_ID))
            .map(|id| String::from_utf8_lossy(id).into_owned())
            .unwrap_or_default();
        self.grpc = is_grpc(&self.parts.headers);
        let (outbound, authority) =
            outbound_request(&self.parts, &self.peer, edits, trace.as_deref_mut());
        self.trace = trace.and_then(|decider| decider.decided);
        self.outbound = outbound;
        self.authority = authority;
    }

    fn request_id(&self) -> &str {
        &self.request_id
    }

    fn method_and_path(&self) -> (&str, &str) {
        (self.parts.method.as_str(), self.parts.uri.path())
    }

    fn watch(&mut self) -> ResetWatch<'_> {
        ResetWatch {
            respond: RefCell::new(&mut *self.respond),
        }
    }

    async fn attempt(
        &mut self,
        shard: &Rc<Shard>,
        pod: &Rc<LocalPod>,
        deadlines: &Deadlines,
        held: &mut Option<Held<'_>>,
        note: Option<&WaitNote>,
    ) -> Attempt {
        let addr = pod.tracker.addr;
        // The stream counts on its connection until the exchange ends (`stream` is dropped).
        let tls = pod.tls(self.peer.tls);
        let (sender, stream) = match shard.h2_stream(addr, tls.as_deref()).await {
            Ok(checked_out) => checked_out,
            Err(error) => return Attempt::Unreached(error),
        };
        // The request goes to `h2` by value (no copy of its header map per request); the rare
        // attempt that the pod did not take rebuilds it from the client's request below.
        let mut outbound = std::mem::replace(&mut self.outbound, Request::new(()));
        address_to(
            &mut outbound,
            self.authority
                .clone()
                .unwrap_or_else(|| stream.authority.clone()),
        );
        let pod_side = PodSide { addr, sender };
        let client = ClientSide {
            body: &mut self.body,
            respond: self.respond,
            grpc: self.grpc,
        };
        let exchanged = exchange(shard, pod_side, outbound, client, deadlines, held, note).await;
        match exchanged {
            Exchanged::Ended(ended) => {
                if matches!(
                    ended,
                    Ended::Failed {
                        error: RequestError::ClientGone,
                        ..
                    }
                ) {
                    // ★ The exchange dropped the pod's stream, which resets it (CANCEL): the
                    // slot stays held until the pod has read that reset.
                    shard.settle_reset(addr, &stream, deadlines.total).await;
                }
                Attempt::Ended {
                    ended,
                    fresh: !stream.reused,
                }
            }
            Exchanged::NotTaken { error, replayable } => {
                let mut again = self.trace.map(Decider::again);
                self.outbound =
                    outbound_request(&self.parts, &self.peer, self.edits, again.as_mut()).0;
                // The connection went away under us: the next stream gets another one.
                shard.forget_h2(addr, &stream);
                Attempt::NotTaken { error, replayable }
            }
        }
    }
}

/// Whether a request is gRPC (its failures after the response started are reported in
/// `grpc-status` trailers, which gRPC clients read).
fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

/// Answers the stream with a response of the activator's own, as `http1::rewrite` writes them:
/// plain text, `X-Content-Type-Options: nosniff` for errors in Go's style. False when the
/// stream could not take it (the client reset it, or an answer had already begun).
fn send_answer(respond: &mut SendResponse<Bytes>, answer: &Answer<'_>, head_only: bool) -> bool {
    let mut response = Response::new(());
    *response.status_mut() =
        http::StatusCode::from_u16(answer.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let fields = response.headers_mut();
    if !answer.own_content_type() {
        fields.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    if answer.error_style {
        fields.insert(
            HeaderName::from_static("x-content-type-options"),
            HeaderValue::from_static("nosniff"),
        );
    }
    fields.insert(CONTENT_LENGTH, HeaderValue::from(answer.body.len()));
    for (name, value) in answer.extra_header.iter().chain(answer.fields) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            fields.append(name, value);
        }
    }
    if let Some(revision) = answer.identity {
        for (name, value) in [
            (names::SERVING_REVISION_NAMESPACE, revision.namespace()),
            (names::SERVING_REVISION_NAME, revision.name()),
        ] {
            // Kubernetes names (DNS labels) are always valid field values.
            if let Ok(value) = HeaderValue::from_str(value) {
                fields.insert(name, value);
            }
        }
    }
    if let Some(note) = answer.wait {
        add_note(fields, note);
    }
    let end = answer.body.is_empty() || head_only;
    match respond.send_response(response, end) {
        Ok(mut send) => {
            if !end {
                // Small, so it is not worth waiting for window: `h2` sends it as the window
                // allows.
                let _ = send.send_data(Bytes::copy_from_slice(answer.body), true);
            }
            true
        }
        Err(_) => false,
    }
}

/// The request the pod is sent, but for its `:authority` (the pod, known once one is picked):
/// the request path's one writer of the header edits (`policy::write_fields`) under `edits`,
/// into a header map. Under the queue-proxy's edits, also the `:authority` every attempt
/// keeps: the client's, or `K-Original-Host`'s.
fn outbound_request(
    parts: &http::request::Parts,
    client_peer: &Peer,
    edits: Edits,
    trace: Option<&mut Decider<'_>>,
) -> (Request<()>, Option<http::uri::Authority>) {
    let mut request = Request::new(());
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    let client = H2Headers { parts };
    let mut sink = MapSink {
        out: request.headers_mut(),
    };
    let fields = || parts.headers.iter();
    let (ip, tls) = (&*client_peer.ip, client_peer.tls);
    let host = match edits {
        Edits::Activator => policy::write_fields::<_, _, _, { policy::ACTIVATOR }>(
            &client, fields, ip, tls, &mut sink, trace,
        ),
        Edits::QueueProxy => policy::write_fields::<_, _, _, { policy::QUEUE_PROXY }>(
            &client, fields, ip, tls, &mut sink, trace,
        ),
        Edits::Interceptor => policy::write_fields::<_, _, _, { policy::INTERCEPTOR }>(
            &client, fields, ip, tls, &mut sink, trace,
        ),
    };
    let authority = host.and_then(|host| http::uri::Authority::try_from(host).ok());
    (request, authority)
}

impl<'a> policy::Field<'a> for (&'a HeaderName, &'a HeaderValue) {
    #[inline(always)]
    fn name(self) -> &'a [u8] {
        self.0.as_str().as_bytes()
    }

    #[inline(always)]
    fn value(self) -> &'a [u8] {
        self.1.as_bytes()
    }
}

/// The edited fields as an `h2` header map.
struct MapSink<'o> {
    out: &'o mut http::HeaderMap,
}

impl<'a> policy::FieldSink<'a> for MapSink<'_> {
    type Field = (&'a HeaderName, &'a HeaderValue);

    fn pass(&mut self, (name, value): (&'a HeaderName, &'a HeaderValue)) {
        self.out.append(name.clone(), value.clone());
    }

    fn add(&mut self, field: AddedField, value: &[u8]) {
        let name = match field {
            AddedField::ProxyRequest => {
                self.out.append(
                    names::PROXY_REQUEST,
                    HeaderValue::from_static(headers::PROXY_REQUEST_VALUE),
                );
                return;
            }
            AddedField::OriginalHost => names::ORIGINAL_HOST,
            AddedField::RequestId => names::REQUEST_ID,
            AddedField::Forwarded => http::header::FORWARDED,
            AddedField::ForwardedHost => HeaderName::from_static("x-forwarded-host"),
            AddedField::ForwardedProto => HeaderName::from_static("x-forwarded-proto"),
            AddedField::Te => http::header::TE,
            AddedField::Trace(name) => trace_header_name(name),
        };
        if let Ok(value) = HeaderValue::from_bytes(value) {
            self.out.append(name, value);
        }
    }

    fn forwarded_for(&mut self, earlier: impl Iterator<Item = &'a [u8]>, client_ip: &[u8]) {
        let mut joined: Vec<u8> = Vec::new();
        for value in earlier {
            joined.extend_from_slice(value);
            joined.extend_from_slice(b", ");
        }
        let value = if joined.is_empty() {
            // The usual case, without a copy in between.
            HeaderValue::from_bytes(client_ip)
        } else {
            joined.extend_from_slice(client_ip);
            HeaderValue::from_bytes(&joined)
        };
        if let Ok(value) = value {
            self.out.append(names::FORWARDED_FOR, value);
        }
    }
}

/// A propagation header's name as HTTP/2 spells it, lower-case (`h2` refuses capitals).
fn trace_header_name(field: PropagationField) -> HeaderName {
    HeaderName::from_static(match field {
        PropagationField::TraceParent => "traceparent",
        PropagationField::TraceState => "tracestate",
        PropagationField::B3 => "b3",
        PropagationField::B3TraceId => "x-b3-traceid",
        PropagationField::B3SpanId => "x-b3-spanid",
        PropagationField::B3ParentSpanId => "x-b3-parentspanid",
        PropagationField::B3Sampled => "x-b3-sampled",
        PropagationField::B3Flags => "x-b3-flags",
    })
}

/// Points the request at a pod (`:authority` = the pod's address, as HTTP/1's `Host`).
fn address_to(request: &mut Request<()>, authority: http::uri::Authority) {
    let mut parts = std::mem::take(request.uri_mut()).into_parts();
    parts.scheme = Some(http::uri::Scheme::HTTP);
    parts.authority = Some(authority);
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    if let Ok(uri) = Uri::from_parts(parts) {
        *request.uri_mut() = uri;
    }
}

/// The client of a stream waiting for a slot: it has something to say only by resetting the
/// stream (or losing its connection); its DATA waits in `h2` under flow control.
pub(crate) struct ResetWatch<'a> {
    respond: RefCell<&'a mut SendResponse<Bytes>>,
}

impl ClientWatch for ResetWatch<'_> {
    fn parked(&mut self) {}

    async fn readable(&self) {
        poll_fn(|cx| self.respond.borrow_mut().poll_reset(cx).map(|_| ())).await
    }

    async fn absorb(&mut self) -> bool {
        false
    }
}

/// How an exchange ended.
enum Exchanged {
    /// As far as the request path is concerned: relayed, failed, truncated.
    Ended(Ended),
    /// The pod took nothing of it, and nothing reached the client: a refused stream.
    /// `replayable`: nothing of the body was consumed.
    NotTaken {
        error: UpstreamError,
        replayable: bool,
    },
}

/// How the request body's way to the pod ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Upload {
    /// Sent to its end, trailers included.
    Done,
    /// The client reset the stream or lost its connection.
    ClientGone,
    /// The pod's side closed or reset: its response says the rest.
    PodGone,
}

/// The pod's side of an exchange: its address and a sender on one of its connections.
struct PodSide {
    addr: SocketAddr,
    sender: h2::client::SendRequest<Bytes>,
}

/// The client's side of an exchange: the stream's body and its response.
struct ClientSide<'c> {
    body: &'c mut RecvStream,
    respond: &'c mut SendResponse<Bytes>,
    /// The request is a gRPC call: a cut response ends with gRPC's trailers.
    grpc: bool,
}

/// One exchange with the pod: `outbound` on the pod's side, the client's body up and the
/// pod's response down.
async fn exchange(
    shard: &Shard,
    pod: PodSide,
    outbound: Request<()>,
    client: ClientSide<'_>,
    deadlines: &Deadlines,
    held: &mut Option<Held<'_>>,
    note: Option<&WaitNote>,
) -> Exchanged {
    let PodSide { addr, sender } = pod;
    let ClientSide {
        body,
        respond,
        grpc,
    } = client;
    let refused = |error: &h2::Error| UpstreamError::StreamRefused {
        addr,
        detail: error.to_string(),
    };
    // Waits for the pod's stream limit; fails when the connection is gone.
    let mut sender = match sender.ready().await {
        Ok(sender) => sender,
        Err(error) => {
            return Exchanged::NotTaken {
                error: refused(&error),
                replayable: true,
            }
        }
    };
    let end_of_request = body.is_end_stream();
    let (response, mut to_pod) = match sender.send_request(outbound, end_of_request) {
        Ok(pair) => pair,
        Err(error) => {
            return Exchanged::NotTaken {
                error: refused(&error),
                replayable: true,
            }
        }
    };
    let consumed = std::cell::Cell::new(false);
    let upload = async {
        if end_of_request {
            return Upload::Done;
        }
        relay_request(body, &mut to_pod, &consumed).await
    };
    let mut upload = pin!(upload);
    let mut upload_ended: Option<Upload> = None;

    // === the response head, while the body goes up ===
    let mut response = pin!(response);
    let mut alarm = pin!(shard.alarms.at(deadlines.first_byte));
    enum Head {
        Response(Result<Response<RecvStream>, h2::Error>),
        ClientGone,
        TimedOut,
    }
    let head = poll_fn(|cx| {
        if upload_ended.is_none() {
            if let Poll::Ready(ended) = upload.as_mut().poll(cx) {
                upload_ended = Some(ended);
            }
        }
        if upload_ended == Some(Upload::ClientGone) {
            return Poll::Ready(Head::ClientGone);
        }
        if let Poll::Ready(result) = response.as_mut().poll(cx) {
            return Poll::Ready(Head::Response(result));
        }
        if respond.poll_reset(cx).is_ready() {
            return Poll::Ready(Head::ClientGone);
        }
        if alarm.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Head::TimedOut);
        }
        Poll::Pending
    })
    .await;
    let response = match head {
        Head::Response(Ok(response)) => response,
        Head::Response(Err(error)) => {
            let nothing_consumed = !consumed.get();
            if error.reason() == Some(Reason::REFUSED_STREAM) {
                return Exchanged::NotTaken {
                    error: refused(&error),
                    replayable: nothing_consumed,
                };
            }
            return failed(h2_failure(addr, &error, Phase::Receive).into());
        }
        Head::ClientGone => {
            shard.stats().client_aborts.increment();
            return failed(RequestError::ClientGone);
        }
        Head::TimedOut => return failed(RequestError::TimedOut),
    };
    let (parts, mut from_pod) = response.into_parts();
    let status = parts.status.as_u16();
    let mut head = Response::from_parts(parts, ());
    strip_hop_by_hop(head.headers_mut());
    if let Some(note) = note {
        add_note(head.headers_mut(), note);
    }
    let pod_done = from_pod.is_end_stream();
    let mut to_client = match respond.send_response(head, pod_done) {
        Ok(to_client) => to_client,
        Err(_) => {
            shard.stats().client_aborts.increment();
            return failed(RequestError::ClientGone);
        }
    };
    if pod_done {
        // A head-only answer (gRPC's trailers-only among them): the slot is free now.
        drop(held.take());
        return relayed(status, 0);
    }

    // === the response body and trailers, while the request body may still go up ===
    let body_bytes = std::cell::Cell::new(0);
    let ended = {
        let download = relay_response(
            shard,
            addr,
            &mut from_pod,
            &mut to_client,
            deadlines,
            held,
            &body_bytes,
        );
        let mut download = pin!(download);
        poll_fn(|cx| {
            if upload_ended.is_none() {
                if let Poll::Ready(ended) = upload.as_mut().poll(cx) {
                    upload_ended = Some(ended);
                }
            }
            if upload_ended == Some(Upload::ClientGone) {
                return Poll::Ready(Err(Cut::ClientGone));
            }
            download.as_mut().poll(cx)
        })
        .await
    };
    let body_bytes = body_bytes.get();
    match ended {
        Ok(()) => relayed(status, body_bytes),
        Err(Cut::ClientGone) => {
            shard.stats().client_aborts.increment();
            // Dropping the pod's stream resets it: the pod hears the client left.
            Exchanged::Ended(Ended::Failed {
                error: RequestError::ClientGone,
                request_complete: false,
            })
        }
        Err(Cut::Pod(error)) => {
            tracing::warn!(pod = %addr, class = error.class(), "response cut: {error}");
            cut_response(&mut to_client, grpc, &error);
            Exchanged::Ended(Ended::Truncated { status, body_bytes })
        }
        Err(Cut::TimedOut) => {
            tracing::warn!(pod = %addr, "activator request timeout, response cut");
            let error = UpstreamError::Http2 {
                addr,
                detail: messages::TIMEOUT.into(),
            };
            cut_response(&mut to_client, grpc, &error);
            Exchanged::Ended(Ended::Truncated { status, body_bytes })
        }
    }
}

fn failed(error: RequestError) -> Exchanged {
    Exchanged::Ended(Ended::Failed {
        error,
        request_complete: false,
    })
}

fn relayed(status: u16, body_bytes: u64) -> Exchanged {
    Exchanged::Ended(Ended::Relayed {
        status,
        response_keep_alive: true,
        request_complete: true,
        tail_written: true,
        body_bytes,
    })
}

/// Drops connection-specific fields a pod may have sent (HTTP/2 forbids them). A look at each
/// name, and a removal only for those found (almost never).
fn strip_hop_by_hop(fields: &mut HeaderMap) {
    let doomed: Vec<HeaderName> = fields
        .keys()
        .filter(|name| policy::drops_response_field(name.as_str().as_bytes()))
        .cloned()
        .collect();
    for name in doomed {
        fields.remove(name);
    }
}

/// Adds the activator's note of the request's wait to a response's fields.
fn add_note(fields: &mut HeaderMap, note: &WaitNote) {
    note.response_fields(|name, value| {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            fields.append(name, value);
        }
    });
}

/// Ends a response the pod did not finish: a gRPC client gets `UNAVAILABLE` in trailers (what
/// it would get from a dead connection, with the cause); any other client a reset stream.
fn cut_response(to_client: &mut SendStream<Bytes>, grpc: bool, error: &UpstreamError) {
    if grpc {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("14"));
        if let Ok(message) = HeaderValue::from_str(&percent_encode(&error.to_string())) {
            trailers.insert("grpc-message", message);
        }
        if to_client.send_trailers(trailers).is_ok() {
            return;
        }
    }
    to_client.send_reset(Reason::INTERNAL_ERROR);
}

/// gRPC's percent-encoding of `grpc-message`: printable ASCII but `%` as is, the rest `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Client body → pod, then the client's trailers. `consumed` is set once a chunk was taken
/// from the client (the request can no longer be sent again).
async fn relay_request(
    body: &mut RecvStream,
    to_pod: &mut SendStream<Bytes>,
    consumed: &std::cell::Cell<bool>,
) -> Upload {
    loop {
        match body.data().await {
            Some(Ok(chunk)) => {
                consumed.set(true);
                let len = chunk.len();
                if send_all(to_pod, chunk).await.is_err() {
                    return Upload::PodGone;
                }
                let _ = body.flow_control().release_capacity(len);
            }
            Some(Err(_)) => return Upload::ClientGone,
            None => break,
        }
    }
    match body.trailers().await {
        Ok(Some(trailers)) => {
            if to_pod.send_trailers(trailers).is_err() {
                return Upload::PodGone;
            }
        }
        Ok(None) => {
            if to_pod.send_data(Bytes::new(), true).is_err() {
                return Upload::PodGone;
            }
        }
        Err(_) => return Upload::ClientGone,
    }
    Upload::Done
}

/// Pod body → client, then the pod's trailers; the slot goes back as soon as the pod's stream
/// ended. Each read of the pod waits at most the idle deadline; the client resetting its
/// stream ends it at once.
async fn relay_response(
    shard: &Shard,
    addr: SocketAddr,
    from_pod: &mut RecvStream,
    to_client: &mut SendStream<Bytes>,
    deadlines: &Deadlines,
    held: &mut Option<Held<'_>>,
    body_bytes: &std::cell::Cell<u64>,
) -> Result<(), Cut> {
    loop {
        let read = {
            let mut alarm = pin!(shard.alarms.at(deadlines.next_body_read(Instant::now())));
            poll_fn(|cx| {
                if let Poll::Ready(data) = from_pod.poll_data(cx) {
                    return Poll::Ready(Ok(data));
                }
                if to_client.poll_reset(cx).is_ready() {
                    return Poll::Ready(Err(Cut::ClientGone));
                }
                if alarm.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(Cut::TimedOut));
                }
                Poll::Pending
            })
            .await?
        };
        match read {
            Some(Ok(chunk)) => {
                let len = chunk.len();
                if send_all(to_client, chunk).await.is_err() {
                    return Err(Cut::ClientGone);
                }
                body_bytes.set(body_bytes.get() + len as u64);
                let _ = from_pod.flow_control().release_capacity(len);
            }
            Some(Err(error)) => return Err(Cut::Pod(h2_failure(addr, &error, Phase::Receive))),
            None => break,
        }
    }
    let trailers = match race(
        from_pod.trailers(),
        shard.alarms.at(deadlines.next_body_read(Instant::now())),
    )
    .await
    {
        Either::Left(Ok(trailers)) => trailers,
        Either::Left(Err(error)) => return Err(Cut::Pod(h2_failure(addr, &error, Phase::Receive))),
        Either::Right(()) => return Err(Cut::TimedOut),
    };
    // The pod is done with this request: its slot goes to the next one now.
    drop(held.take());
    let sent = match trailers {
        Some(trailers) => to_client.send_trailers(trailers),
        None => to_client.send_data(Bytes::new(), true),
    };
    sent.map_err(|_| Cut::ClientGone)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(request: Request<()>) -> http::request::Parts {
        request.into_parts().0
    }

    fn client(ip: &str) -> Peer {
        Peer::of(SocketAddr::new(ip.parse().unwrap(), 40_000))
    }

    #[test]
    fn a_pod_behind_keda_s_interceptor_gets_the_add_on_s_rewrite_over_tls() {
        let request = Request::builder()
            .uri("https://app.example.com/v1/chat")
            .header("forwarded", "for=6.6.6.6")
            .header("k-original-host", "elsewhere.example")
            .header("x-forwarded-for", "1.2.3.4")
            .body(())
            .unwrap();
        let tls = client("10.1.2.3").over_tls(true);
        let (out, authority) = outbound_request(&parts(request), &tls, Edits::Interceptor, None);
        assert_eq!(
            authority.unwrap().as_str(),
            "app.example.com",
            "the client's authority, not K-Original-Host"
        );
        assert!(out.headers().get("forwarded").is_none());
        assert_eq!(out.headers()["k-original-host"], "elsewhere.example");
        assert_eq!(out.headers()["x-forwarded-host"], "app.example.com");
        assert_eq!(out.headers()["x-forwarded-proto"], "https");
        assert_eq!(out.headers()["x-forwarded-for"], "1.2.3.4, 10.1.2.3");
    }

    #[test]
    fn the_user_container_gets_the_queue_proxys_rewrite() {
        let request = Request::builder()
            .method("POST")
            .uri("http://10.1.2.3:8012/echo.Echo/Unary")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("k-original-host", "hello.example.com")
            .header("knative-serving-revision", "hello-00001")
            .header("knative-serving-namespace", "default")
            .header("k-proxy-request", "activator")
            .header("x-forwarded-for", "1.2.3.4, 10.0.0.9")
            .header("x-forwarded-proto", "https")
            .header("x-run-id", "run-7")
            .body(())
            .unwrap();
        let (out, authority) = outbound_request(
            &parts(request),
            &client("127.0.0.1"),
            Edits::QueueProxy,
            None,
        );
        assert_eq!(authority.unwrap().as_str(), "hello.example.com");
        let names: Vec<&str> = out.headers().keys().map(|name| name.as_str()).collect();
        assert_eq!(
            names,
            [
                "content-type",
                "k-proxy-request",
                "x-forwarded-proto",
                "x-run-id",
                "forwarded",
                "x-forwarded-for",
                "te"
            ],
            "the client's fields in order, then the edits' own, as HTTP/1 writes them"
        );
        assert_eq!(out.headers()["k-proxy-request"], "activator");
        assert_eq!(
            out.headers()["forwarded"],
            "for=1.2.3.4;proto=https, for=10.0.0.9"
        );
        assert_eq!(
            out.headers()["x-forwarded-for"],
            "1.2.3.4, 10.0.0.9, 127.0.0.1"
        );
        // Without K-Original-Host the client's authority stays.
        let plain = Request::builder()
            .uri("http://hello.example.com/")
            .body(())
            .unwrap();
        let (_, authority) =
            outbound_request(&parts(plain), &client("127.0.0.1"), Edits::QueueProxy, None);
        assert_eq!(authority.unwrap().as_str(), "hello.example.com");
    }

    #[test]
    fn the_pod_gets_the_same_rewrite_as_over_http1() {
        let request = Request::builder()
            .method("POST")
            .uri("http://hello-00001.default.svc.cluster.local/echo.Echo/Unary")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("knative-serving-revision", "hello-00001")
            .header("knative-serving-namespace", "default")
            .header("k-proxy-request", "someone")
            .header("x-forwarded-for", "10.0.0.1")
            .header("x-request-id", "abc")
            .header("x-run-id", "run-7")
            .header("connection", "close")
            .body(())
            .unwrap();
        let (out, _) =
            outbound_request(&parts(request), &client("10.1.2.3"), Edits::Activator, None);
        let get = |name: &str| {
            out.headers()
                .get_all(name)
                .iter()
                .map(|value| value.to_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(get("te"), ["trailers"]);
        assert_eq!(get("content-type"), ["application/grpc"]);
        assert!(get("knative-serving-revision").is_empty());
        assert!(get("knative-serving-namespace").is_empty());
        assert!(get("connection").is_empty());
        assert!(get("x-run-id").is_empty());
        assert_eq!(get("x-request-id"), ["run-7"]);
        assert_eq!(get("k-proxy-request"), ["activator"]);
        assert_eq!(get("x-forwarded-for"), ["10.0.0.1, 10.1.2.3"]);
        assert_eq!(
            get("k-original-host"),
            ["hello-00001.default.svc.cluster.local"]
        );
    }

    #[test]
    fn te_other_than_trailers_and_an_existing_original_host_are_respected() {
        let request = Request::builder()
            .uri("http://a.b.svc.cluster.local/")
            .header("te", "gzip")
            .header("k-original-host", "first.example")
            .body(())
            .unwrap();
        let (out, _) =
            outbound_request(&parts(request), &client("10.1.2.3"), Edits::Activator, None);
        assert!(out.headers().get("te").is_none());
        assert_eq!(out.headers()["k-original-host"], "first.example");
        assert_eq!(out.headers()["x-forwarded-for"], "10.1.2.3");
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(
            percent_encode("dial 10.0.0.1:80: 100% refused\n"),
            "dial 10.0.0.1:80: 100%25 refused%0A"
        );
    }
}
