//! One HTTP/2 stream as one request: local answers (probes, unknown revisions, CONNECT), then
//! the shared request path — admission with one slot per stream, deadlines, the conclusion and
//! the revision's counters — around an exchange with the pod over h2c.
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
use kactivator_api::{headers, messages};
use monoio::time::Instant;

use super::pods::{h2_failure, Phase};
use crate::request::admission::{self, acquire, ClientWatch, Held};
use crate::request::deadlines::Deadlines;
use crate::request::error::RequestError;
use crate::request::faults;
use crate::request::headers::{RequestHeaders, CONSUMED_REQUEST_HEADERS, HOP_BY_HOP};
use crate::request::identity;
use crate::request::outcome::{conclude, Concluded, Ended, RequestShape};
use crate::request::probes;
use crate::request::retry::may_retry;
use crate::request::tally::Tally;
use crate::routing::replica::{LocalPod, LocalRevision};
use crate::runtime::contain;
use crate::runtime::control_link::EvidenceKind;
use crate::runtime::race::{race, Either};
use crate::runtime::shard::Shard;
use crate::upstream::error::UpstreamError;

/// An HTTP/2 request's headers as the request path reads them.
pub(crate) struct H2Headers<'a> {
    pub parts: &'a http::request::Parts,
}

impl RequestHeaders for H2Headers<'_> {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.parts.headers.get(name).map(HeaderValue::as_bytes)
    }

    /// `:authority`, else a `Host` header (RFC 9113 §8.3.1 allows either).
    fn authority(&self) -> Option<&[u8]> {
        match self.parts.uri.authority() {
            Some(authority) => Some(authority.as_str().as_bytes()),
            None => self.get(headers::HOST),
        }
    }
}

/// Serves one stream to its end, a panic included: a panic ends this stream only, with a 500
/// if its answer had not begun, else a reset.
pub(crate) async fn serve_contained(
    shard: Rc<Shard>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    peer_ip: Rc<[u8]>,
) {
    let served = contain::catching(serve(&shard, request, &mut respond, peer_ip)).await;
    if let Err(panic) = served {
        contain::record(shard.stats(), "an HTTP/2 stream", &*panic);
        if !answer(
            &mut respond,
            500,
            messages::INTERNAL_ERROR.as_bytes(),
            None,
            true,
            false,
        ) {
            respond.send_reset(Reason::INTERNAL_ERROR);
        }
    }
}

/// Serves one stream to its end.
async fn serve(
    shard: &Rc<Shard>,
    request: Request<RecvStream>,
    respond: &mut SendResponse<Bytes>,
    peer_ip: Rc<[u8]>,
) {
    let arrival = Instant::now();
    let (parts, mut body) = request.into_parts();
    let head_only = parts.method == Method::HEAD;
    if parts.method == Method::CONNECT {
        shard.stats().local_responses.increment();
        answer(
            respond,
            405,
            messages::CONNECT_REFUSED.as_bytes(),
            Some(("allow", messages::CONNECT_REFUSED_ALLOW.as_bytes())),
            true,
            false,
        );
        return;
    }
    let request = H2Headers { parts: &parts };
    if let Some(local) = probes::answer(&request, shard.health()) {
        shard.stats().local_responses.increment();
        let extra = local
            .extra_header
            .as_ref()
            .map(|(name, value)| (*name, value.as_slice()));
        answer(
            respond,
            local.status,
            &local.body,
            extra,
            local.error_style,
            head_only,
        );
        return;
    }
    faults::inject(&request);
    let revision_id = identity::revision_of(&request, &shard.settings.cluster_domain);
    let revision = revision_id.and_then(|id| shard.replica.find(id.namespace, id.name));
    let Some(revision) = revision else {
        let body = messages::revision_not_found(revision_id.map_or("", |id| id.name));
        answer(respond, 404, body.as_bytes(), None, true, head_only);
        return;
    };
    let request_id = request
        .get(headers::RUN_ID)
        .or_else(|| request.get(headers::REQUEST_ID))
        .map(|id| String::from_utf8_lossy(id).into_owned())
        .unwrap_or_default();
    let grpc = is_grpc(&parts.headers);
    let bodiless = body.is_end_stream();
    let outbound = outbound_request(&parts, &peer_ip);
    drop(parts);

    let tally = Tally::arrive(shard, &revision, arrival);
    let ended = proxy(
        shard,
        &revision,
        outbound,
        &mut body,
        respond,
        arrival,
        grpc,
        &request_id,
    )
    .await;
    let shape = RequestShape {
        keep_alive: true,
        bodiless,
        upgrade: false,
    };
    let status = match conclude(shape, ended) {
        Concluded::Done { status, .. } => status,
        Concluded::Answer { error, .. } => {
            tracing::debug!(
                request_id = %request_id,
                status = error.status(),
                fault = error.fault().label(),
                "answered by the activator: {error}"
            );
            answer(
                respond,
                error.status(),
                &error.body(),
                None,
                error.go_error_style(),
                head_only,
            );
            error.status()
        }
    };
    tally.end(arrival, status);
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
fn answer(
    respond: &mut SendResponse<Bytes>,
    status: u16,
    body: &[u8],
    extra: Option<(&str, &[u8])>,
    error_style: bool,
    head_only: bool,
) -> bool {
    let mut response = Response::new(());
    *response.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let fields = response.headers_mut();
    fields.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if error_style {
        fields.insert(
            HeaderName::from_static("x-content-type-options"),
            HeaderValue::from_static("nosniff"),
        );
    }
    fields.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    if let Some((name, value)) = extra {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            fields.insert(name, value);
        }
    }
    let end = body.is_empty() || head_only;
    // A client that reset the stream meanwhile cannot be answered; nothing to do about it.
    match respond.send_response(response, end) {
        Ok(mut send) => {
            if !end {
                // Small, so it is not worth waiting for window: `h2` sends it as the window
                // allows.
                let _ = send.send_data(Bytes::copy_from_slice(body), true);
            }
            true
        }
        Err(_) => false,
    }
}

/// The request the pod is sent, but for its `:authority` (the pod, known once one is picked).
/// The rules are HTTP/1's (`http1::rewrite::write_request_head`): hop-by-hop and consumed
/// headers dropped, `K-Original-Host`, `K-Proxy-Request: activator`, `X-Forwarded-For` with the
/// client appended, `X-Run-Id` replacing `X-Request-Id`; `TE: trailers` kept.
fn outbound_request(parts: &http::request::Parts, client_ip: &[u8]) -> Request<()> {
    let mut request = Request::new(());
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    let out = request.headers_mut();
    let run_id = parts
        .headers
        .get(headers::RUN_ID)
        .filter(|value| !value.is_empty());
    let mut forwarded: Vec<u8> = Vec::new();
    for (name, value) in &parts.headers {
        let text = name.as_str();
        if text == "te" {
            if value.as_bytes().eq_ignore_ascii_case(b"trailers") {
                out.append(name.clone(), value.clone());
            }
            continue;
        }
        if text.eq_ignore_ascii_case(headers::FORWARDED_FOR) {
            forwarded.extend_from_slice(value.as_bytes());
            forwarded.extend_from_slice(b", ");
            continue;
        }
        if HOP_BY_HOP.iter().any(|hop| text.eq_ignore_ascii_case(hop))
            || CONSUMED_REQUEST_HEADERS
                .iter()
                .any(|consumed| text.eq_ignore_ascii_case(consumed))
        {
            continue;
        }
        if run_id.is_some() && text.eq_ignore_ascii_case(headers::REQUEST_ID) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if !out.contains_key(headers::ORIGINAL_HOST) {
        let original = H2Headers { parts }.authority().map(<[u8]>::to_vec);
        if let Some(value) = original
            .filter(|host| !host.is_empty())
            .and_then(|host| HeaderValue::from_bytes(&host).ok())
        {
            out.insert(HeaderName::from_static("k-original-host"), value);
        }
    }
    if let Some(run_id) = run_id {
        out.insert(HeaderName::from_static("x-request-id"), run_id.clone());
    }
    out.insert(
        HeaderName::from_static("k-proxy-request"),
        HeaderValue::from_static(headers::PROXY_REQUEST_VALUE),
    );
    forwarded.extend_from_slice(client_ip);
    if let Ok(value) = HeaderValue::from_bytes(&forwarded) {
        out.insert(HeaderName::from_static("x-forwarded-for"), value);
    }
    request
}

/// Points the request at `pod` (`:authority` = the pod's address, as HTTP/1's `Host`).
fn address_to(request: &mut Request<()>, pod: &LocalPod) {
    let mut parts = std::mem::take(request.uri_mut()).into_parts();
    parts.scheme = Some(http::uri::Scheme::HTTP);
    parts.authority = Some(pod.authority());
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    if let Ok(uri) = Uri::from_parts(parts) {
        *request.uri_mut() = uri;
    }
}

/// The client of a stream waiting for a slot: it has something to say only by resetting the
/// stream (or losing its connection); its DATA waits in `h2` under flow control.
struct ResetWatch<'a> {
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

/// Waits for a pod and runs the exchange; as `http1::connection::proxy_request`, a request that
/// reached no pod goes back to admission within its deadline (`request::retry`).
#[allow(clippy::too_many_arguments)]
async fn proxy(
    shard: &Rc<Shard>,
    revision: &Rc<LocalRevision>,
    mut outbound: Request<()>,
    body: &mut RecvStream,
    respond: &mut SendResponse<Bytes>,
    arrival: Instant,
    grpc: bool,
    request_id: &str,
) -> Ended {
    let deadlines = Deadlines::new(&revision.timeouts(), arrival);
    let mut attempt = 0;
    let mut unreached: Option<UpstreamError> = None;
    loop {
        attempt += 1;
        let mut watch = ResetWatch {
            respond: RefCell::new(&mut *respond),
        };
        let pod = match acquire(shard, revision, deadlines.first_byte, &mut watch).await {
            Ok(pod) => pod,
            Err(error) => {
                return Ended::Failed {
                    error: admission::not_admitted(error, unreached),
                    request_complete: false,
                };
            }
        };
        let mut held = Some(Held::new(&pod, revision, shard));
        let addr = pod.tracker.addr;
        let (sender, reused) = match shard.h2_pods.checkout(addr, shard.stats()).await {
            Ok(checked_out) => checked_out,
            Err(error) => {
                tracing::warn!(request_id, pod = %addr, class = error.class(), "{error}");
                admission::dial_failed(shard, revision, &pod);
                drop(held);
                if !may_retry(attempt, &error, true) {
                    return Ended::Failed {
                        error: error.into(),
                        request_complete: false,
                    };
                }
                shard.stats().dial_retries.increment();
                unreached = Some(error);
                continue;
            }
        };
        address_to(&mut outbound, &pod);
        let exchanged = exchange(
            shard, revision, addr, sender, &outbound, body, respond, &deadlines, &mut held, grpc,
        )
        .await;
        let (error, replayable) = match exchanged {
            Exchanged::Ended(ended) => {
                if let Ended::Failed {
                    error: RequestError::Upstream(failure),
                    ..
                } = &ended
                {
                    tracing::warn!(request_id, pod = %addr, class = failure.class(), "{failure}");
                    if failure.is_pod_failure() && !reused {
                        admission::report(shard, revision, &pod, EvidenceKind::TransportFailure);
                    }
                }
                return ended;
            }
            Exchanged::NotTaken { error, replayable } => (error, replayable),
        };
        drop(held);
        match &error {
            UpstreamError::IpReused {
                namespace,
                revision: serving,
                ..
            } => admission::retire_reused(shard, revision, &pod, namespace, serving, request_id),
            // The connection went away under us: the next stream gets a new one.
            _ => shard.h2_pods.forget(addr),
        }
        if !may_retry(attempt, &error, replayable) {
            return Ended::Failed {
                error: error.into(),
                request_complete: false,
            };
        }
    }
}

/// How an exchange ended.
enum Exchanged {
    /// As far as the request path is concerned: relayed, failed, truncated.
    Ended(Ended),
    /// The pod took nothing of it, and nothing reached the client: a refused stream, or an
    /// answer in another revision's name. `replayable`: nothing of the body was consumed.
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

/// One exchange with the pod on `sender`'s connection.
#[allow(clippy::too_many_arguments)]
async fn exchange(
    shard: &Shard,
    revision: &LocalRevision,
    addr: SocketAddr,
    sender: h2::client::SendRequest<Bytes>,
    outbound: &Request<()>,
    body: &mut RecvStream,
    respond: &mut SendResponse<Bytes>,
    deadlines: &Deadlines,
    held: &mut Option<Held<'_>>,
    grpc: bool,
) -> Exchanged {
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
    let (response, mut to_pod) = match sender.send_request(clone_head(outbound), end_of_request) {
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
    if let Some((namespace, name)) = identity::other_revision(
        parts
            .headers
            .get(headers::SERVING_REVISION_NAME)
            .map(HeaderValue::as_bytes),
        parts
            .headers
            .get(headers::SERVING_REVISION_NAMESPACE)
            .map(HeaderValue::as_bytes),
        revision.key().namespace(),
        revision.key().name(),
    ) {
        return Exchanged::NotTaken {
            error: UpstreamError::IpReused {
                addr,
                namespace,
                revision: name,
            },
            replayable: end_of_request,
        };
    }
    let status = parts.status.as_u16();
    let mut head = Response::from_parts(parts, ());
    strip_hop_by_hop(head.headers_mut());
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
        return relayed(status);
    }

    // === the response body and trailers, while the request body may still go up ===
    let ended = {
        let download = relay_response(shard, addr, &mut from_pod, &mut to_client, deadlines, held);
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
    match ended {
        Ok(()) => relayed(status),
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
            Exchanged::Ended(Ended::Truncated { status })
        }
        Err(Cut::TimedOut) => {
            tracing::warn!(pod = %addr, "activator request timeout, response cut");
            let error = UpstreamError::Http2 {
                addr,
                detail: messages::TIMEOUT.into(),
            };
            cut_response(&mut to_client, grpc, &error);
            Exchanged::Ended(Ended::Truncated { status })
        }
    }
}

fn failed(error: RequestError) -> Exchanged {
    Exchanged::Ended(Ended::Failed {
        error,
        request_complete: false,
    })
}

fn relayed(status: u16) -> Exchanged {
    Exchanged::Ended(Ended::Relayed {
        status,
        response_keep_alive: true,
        request_complete: true,
        client_gone: false,
        tail_written: true,
    })
}

/// A copy of a request's head (the body goes separately).
fn clone_head(request: &Request<()>) -> Request<()> {
    let mut copy = Request::new(());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.headers_mut() = request.headers().clone();
    copy
}

/// Drops connection-specific fields a pod may have sent (HTTP/2 forbids them).
fn strip_hop_by_hop(fields: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        fields.remove(name);
    }
}

/// Why the response could not be relayed to its end.
enum Cut {
    ClientGone,
    Pod(UpstreamError),
    TimedOut,
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

/// Sends `data` as the peer's window allows, waiting for window as needed.
async fn send_all(send: &mut SendStream<Bytes>, mut data: Bytes) -> Result<(), h2::Error> {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let granted = poll_fn(|cx| match send.capacity() {
            0 => send.poll_capacity(cx),
            available => Poll::Ready(Some(Ok(available))),
        })
        .await;
        match granted {
            Some(Ok(0)) => continue,
            Some(Ok(available)) => {
                let chunk = data.split_to(available.min(data.len()));
                send.send_data(chunk, false)?;
            }
            Some(Err(error)) => return Err(error),
            None => return Err(h2::Error::from(Reason::CANCEL)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(request: Request<()>) -> http::request::Parts {
        request.into_parts().0
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
        let out = outbound_request(&parts(request), b"10.1.2.3");
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
        let out = outbound_request(&parts(request), b"10.1.2.3");
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
