//! An HTTP/1 client's request to a pod that takes only HTTP/2: KEDA's add-on sends every
//! request to a Service port of `appProtocol: kubernetes.io/h2c` in h2c, whatever its client
//! spoke (`reference/keda-http-add-on.md` §4.6), and a pod behind such a port may speak nothing
//! else. Here the head `rewrite` wrote for the pod becomes an HTTP/2 request, the client's body
//! goes up as DATA under the pod's flow control (its trailers as HTTP/2 trailers), and the
//! pod's response comes back framed for the client by the writer every pod's response goes
//! through (`rewrite::write_response_head`), its trailers in the last chunk. An upgrade
//! (WebSocket), which HTTP/2 cannot carry as asked, is not sent here (`front`).
//!
//! A client that leaves resets the pod's stream, and the pod's slot stays held until the pod
//! has read the reset, as for an HTTP/2 client (`Shard::settle_reset`).

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::{Reason, RecvStream, SendStream};
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, Request, Uri};
use kactivator_h1::{
    encode_chunk, encode_last_chunk, name_eq, parse_response, BodyDecoder, BodyError, BodyEvent,
    BodyKind, Method, Version,
};
use monoio::io::{Canceller, OwnedReadHalf};
use monoio::time::Instant;

use super::client::{write_out, ClientConn, RequestMeta};
use super::exchange::{read_ahead, SendPhase};
use super::rewrite::{self, client_framing, ClientFraming};
use crate::lifecycle::admission::Held;
use crate::lifecycle::Attempt;
use crate::request::deadlines::Deadlines;
use crate::request::error::RequestError;
use crate::request::outcome::Ended;
use crate::routing::replica::LocalPod;
use crate::runtime::buffer::InBuf;
use crate::runtime::race::{race, Either};
use crate::runtime::stream::ByteStream;
use crate::shard::Shard;
use crate::upstream::error::UpstreamError;
use crate::upstream::h2c::{h2_failure, send_all, Cut, Phase};

/// HTTP/1's own fields, which an HTTP/2 request does not carry: hop-by-hop or framing (RFC 9113
/// §8.2.2); `Host` becomes `:authority`.
const HTTP1_ONLY: [&[u8]; 6] = [
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"transfer-encoding",
    b"upgrade",
    b"http2-settings",
];

/// What an HTTP/1.1 client waiting to send its body (`Expect: 100-continue`) is told once the
/// request is on its way to the pod: Go's server says it when the add-on's proxy starts
/// reading the body, and `h2` hands on no interim response from the pod.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Response bytes gathered from chunks at hand before they are written to the client.
const FLUSH_AT: usize = 64 * 1024;

/// One attempt on `pod` in HTTP/2 (h2c, or TLS with ALPN `h2` when the pod is reached over
/// TLS for this client): a stream on one of the shard's connections to it and the exchange.
pub(super) async fn attempt<S: ByteStream>(
    shard: &Rc<Shard>,
    conn: &mut ClientConn<S>,
    pod: &LocalPod,
    meta: RequestMeta,
    deadlines: &Deadlines,
    held: &mut Option<Held<'_>>,
) -> Attempt {
    let addr = pod.tracker.addr;
    let tls = pod.tls(conn.peer.tls);
    let (sender, stream) = match shard.h2_stream(addr, tls.as_deref()).await {
        Ok(checked_out) => checked_out,
        Err(error) => return Attempt::Unreached(error),
    };
    let Some((request, continue_first)) = outbound(&conn.request_out, &stream.authority, &meta)
    else {
        // The head is the rewrite's own, so this is a target or method HTTP/2 cannot say.
        return Attempt::Ended {
            ended: Ended::Failed {
                error: RequestError::from(UpstreamError::Http2 {
                    addr,
                    detail: "the request cannot be sent in HTTP/2".into(),
                }),
                request_complete: false,
            },
            fresh: !stream.reused,
        };
    };
    let pod_side = PodSide {
        addr,
        sender,
        continue_first,
    };
    match exchange(shard, conn, pod_side, request, meta, deadlines, held).await {
        Exchanged::Ended { ended, reset } => {
            if reset {
                // ★ Dropping the pod's stream reset it: the slot stays held until the pod has
                // read that, within the request's deadline.
                shard.settle_reset(addr, &stream, deadlines.total).await;
            }
            Attempt::Ended {
                ended,
                fresh: !stream.reused,
            }
        }
        Exchanged::NotTaken { error, replayable } => {
            // The connection went away under us: the next stream gets another one.
            shard.forget_h2(addr, &stream);
            Attempt::NotTaken { error, replayable }
        }
    }
}

/// The HTTP/2 request for `head`, the HTTP/1 head `rewrite` wrote for the pod: its method and
/// target, its `Host` as `:authority` (else the pod's address: an HTTP/1.0 request may come
/// without one), its fields but HTTP/1's own, and whether its client waits for
/// `100 Continue` before the body (an HTTP/1.1 client's `Expect` on a request with a body is
/// answered here, as Go's server answers it, so it does not go on). `None` for what HTTP/2
/// cannot carry.
fn outbound(head: &[u8], pod: &Authority, meta: &RequestMeta) -> Option<(Request<()>, bool)> {
    let lines = head.windows(2).filter(|pair| pair == b"\r\n").count();
    let mut fields = vec![httparse::EMPTY_HEADER; lines];
    let mut parsed = httparse::Request::new(&mut fields);
    if !matches!(parsed.parse(head), Ok(httparse::Status::Complete(_))) {
        return None;
    }
    let method = http::Method::from_bytes(parsed.method?.as_bytes()).ok()?;
    let path = PathAndQuery::try_from(parsed.path?).ok()?;
    let mut authority = pod.clone();
    let mut continue_first = false;
    let mut request = Request::new(());
    let out = request.headers_mut();
    for field in parsed.headers.iter() {
        let (name, value) = (field.name.as_bytes(), field.value);
        if name_eq(name, b"host") {
            if let Ok(host) = Authority::try_from(value) {
                authority = host;
            }
            continue;
        }
        if name_eq(name, b"expect") && value.eq_ignore_ascii_case(b"100-continue") {
            continue_first = meta.version == Version::Http11 && meta.body != BodyKind::Empty;
            continue;
        }
        if HTTP1_ONLY.iter().any(|own| name_eq(name, own))
            || (name_eq(name, b"te") && !value.eq_ignore_ascii_case(b"trailers"))
        {
            continue;
        }
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            out.append(name, value);
        }
    }
    *request.method_mut() = method;
    *request.uri_mut() = Uri::builder()
        .scheme(Scheme::HTTP)
        .authority(authority)
        .path_and_query(path)
        .build()
        .ok()?;
    Some((request, continue_first))
}

/// How an exchange ended.
enum Exchanged {
    /// As far as the request path is concerned: relayed, failed, cut. `reset`: the pod's
    /// stream was dropped while the pod was still on it, because the client left.
    Ended { ended: Ended, reset: bool },
    /// The pod took none of it and nothing reached the client: a refused stream.
    /// `replayable`: nothing of the body was taken from the client.
    NotTaken {
        error: UpstreamError,
        replayable: bool,
    },
}

/// How the request's way up ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Upload {
    /// Sent to its end; the read-ahead on the client that followed saw nothing end.
    Done,
    /// The client closed or reset its connection.
    ClientGone,
    /// The client's body framing was invalid.
    ClientBody(BodyError),
    /// The pod closed its side of the stream (it answered early): its response says the rest.
    PodGone,
}

/// A failure that left no work on the pod to tell of (its stream ended, or it never answered).
fn failed(error: RequestError, request_complete: bool) -> Exchanged {
    Exchanged::Ended {
        ended: Ended::Failed {
            error,
            request_complete,
        },
        reset: false,
    }
}

/// The pod's side of an exchange.
struct PodSide {
    addr: SocketAddr,
    sender: SendRequest<Bytes>,
    /// The client waits for `100 Continue` before its body.
    continue_first: bool,
}

/// One exchange: `request` on a new stream, the client's body up while the pod's response
/// comes down. The slot goes back as soon as the pod's stream ended, before the response's
/// last bytes are written.
async fn exchange<S: ByteStream>(
    shard: &Rc<Shard>,
    conn: &mut ClientConn<S>,
    pod: PodSide,
    request: Request<()>,
    meta: RequestMeta,
    deadlines: &Deadlines,
    held: &mut Option<Held<'_>>,
) -> Exchanged {
    let PodSide {
        addr,
        sender,
        continue_first,
    } = pod;
    let ClientConn {
        reader,
        writer,
        inbuf,
        response_out,
        response_head,
        canceller,
        request_id,
        ..
    } = &mut *conn;
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
    let bodiless = matches!(meta.body, BodyKind::Empty | BodyKind::Length(0));
    let (response, mut to_pod) = match sender.send_request(request, bodiless) {
        Ok(pair) => pair,
        Err(error) => {
            return Exchanged::NotTaken {
                error: refused(&error),
                replayable: true,
            }
        }
    };
    drop(sender);
    let client_gone = |request_complete| Exchanged::Ended {
        ended: Ended::Failed {
            error: RequestError::ClientGone,
            request_complete,
        },
        reset: true,
    };
    if continue_first {
        response_out.clear();
        response_out.extend_from_slice(CONTINUE);
        if write_out(writer, response_out).await.is_err() {
            shard.stats().client_aborts.increment();
            return client_gone(false);
        }
    }

    // === the request body, then a read-ahead on the client until the response is done ===
    let phase = Cell::new(SendPhase::Body);
    let consumed = Cell::new(false);
    let ticket = shard.late.enter::<S>(Instant::now());
    let cancel = canceller.get_or_insert_with(Canceller::new).handle();
    let upload = async {
        if !bodiless {
            let sent = upload(reader, inbuf, meta.body, &mut to_pod, &consumed).await;
            if sent != Upload::Done {
                return sent;
            }
        }
        phase.set(SendPhase::Sent);
        // As over HTTP/1: the client is read ahead (its FIN, or a pipelined request) only once
        // the exchange is late.
        ticket.late().await;
        phase.set(SendPhase::ReadingAhead);
        match read_ahead(reader, inbuf, cancel).await {
            true => Upload::ClientGone,
            false => Upload::Done,
        }
    };
    let mut upload = pin!(upload);
    let mut sent: Option<Upload> = None;
    let client_left =
        |sent: Option<Upload>| matches!(sent, Some(Upload::ClientGone | Upload::ClientBody(_)));

    // === the response head, while the body goes up ===
    enum Head {
        Response(Result<http::Response<RecvStream>, h2::Error>),
        ClientLeft,
        TimedOut,
    }
    let head = {
        let mut response = pin!(response);
        let mut overdue = pin!(shard.alarms.at(deadlines.first_byte));
        poll_fn(|cx| {
            if sent.is_none() {
                if let Poll::Ready(ended) = upload.as_mut().poll(cx) {
                    sent = Some(ended);
                }
            }
            if client_left(sent) {
                return Poll::Ready(Head::ClientLeft);
            }
            if let Poll::Ready(result) = response.as_mut().poll(cx) {
                return Poll::Ready(Head::Response(result));
            }
            if overdue.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Head::TimedOut);
            }
            Poll::Pending
        })
        .await
    };
    let request_complete = || phase.get() != SendPhase::Body;
    let response = match head {
        Head::Response(Ok(response)) => response,
        Head::Response(Err(error)) => {
            if error.reason() == Some(Reason::REFUSED_STREAM) {
                return Exchanged::NotTaken {
                    error: refused(&error),
                    replayable: !consumed.get(),
                };
            }
            let error = h2_failure(addr, &error, Phase::Receive);
            tracing::warn!(request_id = %request_id, pod = %addr, class = error.class(), "{error}");
            return failed(error.into(), request_complete());
        }
        Head::ClientLeft => {
            return match sent {
                Some(Upload::ClientBody(error)) => {
                    shard.stats().bad_requests.increment();
                    Exchanged::Ended {
                        ended: Ended::Failed {
                            error: RequestError::InvalidBody(error),
                            request_complete: false,
                        },
                        reset: true,
                    }
                }
                _ => {
                    shard.stats().client_aborts.increment();
                    client_gone(request_complete())
                }
            };
        }
        Head::TimedOut => {
            tracing::warn!(request_id = %request_id, pod = %addr, "activator request timeout");
            return failed(RequestError::TimedOut, request_complete());
        }
    };

    // === the response head as HTTP/1, by the one writer of client heads ===
    let (parts, mut from_pod) = response.into_parts();
    let status = parts.status.as_u16();
    let pod_done = from_pod.is_end_stream();
    let mut raw = Vec::with_capacity(256);
    http1_head(&parts, pod_done, meta.method, &mut raw);
    if let Err(error) = parse_response(&raw, meta.method, response_head) {
        let error = UpstreamError::MalformedResponse {
            addr,
            reason: error.to_string(),
        };
        tracing::warn!(request_id = %request_id, pod = %addr, class = error.class(), "{error}");
        return failed(error.into(), request_complete());
    }
    let framing = client_framing(response_head.body, meta.version);
    let with_body = response_head.body != BodyKind::Empty;
    let client_keep_alive =
        meta.keep_alive && framing != ClientFraming::UntilClose && !shard.is_draining();
    response_out.clear();
    rewrite::write_response_head(
        response_head,
        &raw,
        meta.version,
        framing,
        client_keep_alive,
        meta.note.as_ref(),
        response_out,
    );

    // === the response body and trailers, while the request body may still go up ===
    let response_started = Cell::new(false);
    let body_bytes = Cell::new(0);
    let relayed = {
        let download = async {
            let mut trailers = None;
            if !pod_done {
                let mut body = Body {
                    shard,
                    addr,
                    from_pod: &mut from_pod,
                    deadlines,
                };
                loop {
                    let item = match body.at_hand().await {
                        Some(item) => item?,
                        None => {
                            // Nothing more at hand: what is ready goes to the client first.
                            if !response_out.is_empty() {
                                response_started.set(true);
                                write_out(writer, response_out)
                                    .await
                                    .map_err(|_| Cut::ClientGone)?;
                            }
                            body.next().await?
                        }
                    };
                    let Some(chunk) = item else { break };
                    body_bytes.set(body_bytes.get() + chunk.len() as u64);
                    match (with_body, framing) {
                        (false, _) => {}
                        (true, ClientFraming::Chunked) => encode_chunk(&chunk, response_out),
                        (true, _) => response_out.extend_from_slice(&chunk),
                    }
                    if response_out.len() >= FLUSH_AT {
                        response_started.set(true);
                        write_out(writer, response_out)
                            .await
                            .map_err(|_| Cut::ClientGone)?;
                    }
                }
                trailers = body.trailers().await?;
            }
            // The pod is done with this request: its slot goes to the next one now.
            if held.take().is_some_and(Held::give_back) {
                shard.back_of_queue.yield_now().await;
            }
            if framing == ClientFraming::Chunked {
                let lines = trailers.as_ref().map(trailer_lines);
                encode_last_chunk(lines.as_deref(), response_out);
            }
            response_started.set(true);
            Ok(write_out(writer, response_out).await.is_ok())
        };
        let mut download = pin!(download);
        poll_fn(|cx| {
            if sent.is_none() {
                if let Poll::Ready(ended) = upload.as_mut().poll(cx) {
                    sent = Some(ended);
                }
            }
            if client_left(sent) {
                return Poll::Ready(Err(Cut::ClientGone));
            }
            download.as_mut().poll(cx)
        })
        .await
    };
    // A read-ahead in flight is interrupted without losing bytes; a body still going up is
    // abandoned (the request is incomplete, so the connection closes).
    if sent.is_none() && phase.get() == SendPhase::ReadingAhead {
        if let Some(canceller) = canceller {
            *canceller = std::mem::take(canceller).cancel();
        }
        sent = Some(upload.await);
    }
    let body_bytes = body_bytes.get();
    let cut = |status| Ended::Truncated { status, body_bytes };
    match relayed {
        Ok(tail_written) => Exchanged::Ended {
            ended: Ended::Relayed {
                status,
                response_keep_alive: client_keep_alive,
                request_complete: request_complete() && !client_left(sent),
                tail_written,
                body_bytes,
            },
            reset: false,
        },
        Err(Cut::ClientGone) => {
            shard.stats().client_aborts.increment();
            let ended = match response_started.get() {
                true => cut(status),
                false => Ended::Failed {
                    error: RequestError::ClientGone,
                    request_complete: request_complete(),
                },
            };
            Exchanged::Ended { ended, reset: true }
        }
        Err(Cut::Pod(error)) => {
            tracing::warn!(request_id = %request_id, pod = %addr, class = error.class(), "response cut: {error}");
            Exchanged::Ended {
                ended: cut(status),
                reset: false,
            }
        }
        Err(Cut::TimedOut) => {
            tracing::warn!(request_id = %request_id, pod = %addr, "activator request timeout, response cut");
            Exchanged::Ended {
                ended: cut(status),
                reset: false,
            }
        }
    }
}

/// The client's body to the pod, decoded from its HTTP/1 framing, then its trailers (a chunked
/// body's) or the end of the stream. `consumed` is set once anything was taken from the
/// client's buffer (the request can no longer be sent again).
async fn upload<S: ByteStream>(
    reader: &mut OwnedReadHalf<S>,
    inbuf: &mut InBuf,
    kind: BodyKind,
    to_pod: &mut SendStream<Bytes>,
    consumed: &Cell<bool>,
) -> Upload {
    let mut decoder = BodyDecoder::new(kind);
    let mut trailers: Option<HeaderMap> = None;
    loop {
        let (used, event) = match decoder.decode(inbuf.data()) {
            Ok(decoded) => decoded,
            Err(error) => return Upload::ClientBody(error),
        };
        let chunk = match event {
            Some(BodyEvent::Data(data)) => Some(Bytes::copy_from_slice(data)),
            Some(BodyEvent::Trailers(lines)) => {
                trailers = Some(trailer_map(lines));
                None
            }
            Some(BodyEvent::End) | None => None,
        };
        let end = event == Some(BodyEvent::End);
        let need_more = event.is_none();
        if used > 0 {
            inbuf.consume(used);
            consumed.set(true);
        }
        if let Some(chunk) = chunk {
            if send_all(to_pod, chunk).await.is_err() {
                return Upload::PodGone;
            }
        }
        if end {
            break;
        }
        if need_more {
            match inbuf.fill(reader).await {
                Ok(0) | Err(_) => return Upload::ClientGone,
                Ok(_) => {}
            }
        }
    }
    let ended = match trailers {
        Some(trailers) if !trailers.is_empty() => to_pod.send_trailers(trailers),
        _ => to_pod.send_data(Bytes::new(), true),
    };
    match ended {
        Ok(()) => Upload::Done,
        Err(_) => Upload::PodGone,
    }
}

/// The pod's response body as the client's side reads it: each read bounded by the idle
/// deadline, flow-control window released as chunks are taken.
struct Body<'b> {
    shard: &'b Shard,
    addr: SocketAddr,
    from_pod: &'b mut RecvStream,
    deadlines: &'b Deadlines,
}

impl Body<'_> {
    /// The next chunk if one is at hand now (`Ok(None)`: the body ended); `None` when it has
    /// to be waited for.
    async fn at_hand(&mut self) -> Option<Result<Option<Bytes>, Cut>> {
        match poll_fn(|cx| Poll::Ready(self.from_pod.poll_data(cx))).await {
            Poll::Ready(item) => Some(self.take(item)),
            Poll::Pending => None,
        }
    }

    /// The next chunk, waited for up to the idle deadline; `None` at the end of the body.
    async fn next(&mut self) -> Result<Option<Bytes>, Cut> {
        let deadline = self.deadlines.next_body_read(Instant::now());
        match race(self.from_pod.data(), self.shard.alarms.at(deadline)).await {
            Either::Left(item) => self.take(item),
            Either::Right(()) => Err(Cut::TimedOut),
        }
    }

    /// A chunk read: its window goes back to the pod (what the shard holds of the stream is
    /// bounded by [`FLUSH_AT`] and the window `h2` keeps).
    fn take(&mut self, item: Option<Result<Bytes, h2::Error>>) -> Result<Option<Bytes>, Cut> {
        match item {
            Some(Ok(chunk)) => {
                let _ = self.from_pod.flow_control().release_capacity(chunk.len());
                Ok(Some(chunk))
            }
            Some(Err(error)) => Err(Cut::Pod(h2_failure(self.addr, &error, Phase::Receive))),
            None => Ok(None),
        }
    }

    /// The trailers after the body, waited for up to the idle deadline.
    async fn trailers(&mut self) -> Result<Option<HeaderMap>, Cut> {
        let deadline = self.deadlines.next_body_read(Instant::now());
        match race(self.from_pod.trailers(), self.shard.alarms.at(deadline)).await {
            Either::Left(Ok(trailers)) => Ok(trailers),
            Either::Left(Err(error)) => {
                Err(Cut::Pod(h2_failure(self.addr, &error, Phase::Receive)))
            }
            Either::Right(()) => Err(Cut::TimedOut),
        }
    }
}

/// The pod's response head (`parts`) as an HTTP/1.1 head, for the codec to read back: its
/// framing declared as HTTP/1 needs it (a length, or chunked while the body is still coming,
/// or an empty body when the stream already ended).
fn http1_head(parts: &http::response::Parts, ended: bool, method: Method, out: &mut Vec<u8>) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let status = parts.status.as_u16();
    let bodiless = method == Method::Head || status < 200 || status == 204 || status == 304;
    if !bodiless && !parts.headers.contains_key(CONTENT_LENGTH) {
        out.extend_from_slice(match ended {
            true => b"Content-Length: 0\r\n".as_slice(),
            false => b"Transfer-Encoding: chunked\r\n".as_slice(),
        });
    }
    out.extend_from_slice(b"\r\n");
}

/// A chunked body's raw trailer lines as HTTP/2 trailers (fields that do not parse are left
/// out).
fn trailer_map(lines: &[u8]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for line in lines.split(|&byte| byte == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&byte| byte == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            map.append(name, value);
        }
    }
    map
}

/// HTTP/2 trailers as the raw field lines of a last chunk.
fn trailer_lines(trailers: &HeaderMap) -> Vec<u8> {
    let mut lines = Vec::new();
    for (name, value) in trailers {
        lines.extend_from_slice(name.as_str().as_bytes());
        lines.extend_from_slice(b": ");
        lines.extend_from_slice(value.as_bytes());
        lines.extend_from_slice(b"\r\n");
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Authority {
        Authority::from_static("10.0.0.7:8080")
    }

    fn meta(version: Version, body: BodyKind) -> RequestMeta {
        RequestMeta {
            method: Method::Get,
            version,
            body,
            keep_alive: true,
            upgrade: false,
            note: None,
        }
    }

    #[test]
    fn the_head_for_the_pod_becomes_an_http2_request_without_http1s_own_fields() {
        let head =
            b"POST /a/b?c=1 HTTP/1.1\r\nHost: app.example.com\r\nTransfer-Encoding: chunked\r\n\
                     Connection: keep-alive\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n\
                     Expect: 100-continue\r\nX-Forwarded-For: 192.0.2.1\r\nX-Custom: One\r\n\
                     x-custom: two\r\n\r\n";
        let chunked = meta(Version::Http11, BodyKind::Chunked);
        let (request, continue_first) = outbound(head, &pod(), &chunked).expect("a request");
        assert!(continue_first, "the client waits for 100 Continue");
        assert_eq!(request.method(), http::Method::POST);
        assert_eq!(
            request.uri().to_string(),
            "http://app.example.com/a/b?c=1",
            "Host is the :authority"
        );
        let fields: Vec<(String, String)> = request
            .headers()
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
            .collect();
        let pairs: Vec<(&str, &str)> = fields
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("te", "trailers"),
                ("x-forwarded-for", "192.0.2.1"),
                ("x-custom", "One"),
                ("x-custom", "two"),
            ],
            "names lower-cased, order and repeats kept"
        );
    }

    #[test]
    fn without_a_host_the_pods_address_is_the_authority_and_only_a_body_waits_for_continue() {
        // An HTTP/1.0 client's request may have no Host; the rewrite still says HTTP/1.1.
        let head = b"GET / HTTP/1.1\r\nExpect: 100-continue\r\nTE: gzip\r\n\r\n";
        let bodiless = meta(Version::Http11, BodyKind::Empty);
        let (request, continue_first) = outbound(head, &pod(), &bodiless).expect("a request");
        assert!(!continue_first, "no body, nothing to wait for");
        assert_eq!(request.uri().to_string(), "http://10.0.0.7:8080/");
        assert!(request.headers().is_empty(), "{:?}", request.headers());
        let old = meta(Version::Http10, BodyKind::Length(3));
        let (_, continue_first) = outbound(head, &pod(), &old).expect("a request");
        assert!(
            !continue_first,
            "an HTTP/1.0 client's expectation is ignored"
        );
        assert!(outbound(b"GET / HTTP/1.1\r\n", &pod(), &bodiless).is_none());
    }

    #[test]
    fn a_response_head_declares_the_framing_http1_needs() {
        fn head(status: u16, fields: &[(&str, &str)], ended: bool, method: Method) -> String {
            let mut response = http::Response::new(());
            *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
            for (name, value) in fields {
                response.headers_mut().append(
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    HeaderValue::from_str(value).unwrap(),
                );
            }
            let (parts, ()) = response.into_parts();
            let mut out = Vec::new();
            http1_head(&parts, ended, method, &mut out);
            String::from_utf8(out).unwrap()
        }
        assert_eq!(
            head(200, &[("x-a", "1")], false, Method::Get),
            "HTTP/1.1 200 OK\r\nx-a: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        assert_eq!(
            head(404, &[], true, Method::Get),
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
        );
        assert_eq!(
            head(200, &[("content-length", "5")], false, Method::Get),
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"
        );
        for (status, method) in [(204, Method::Get), (304, Method::Get), (200, Method::Head)] {
            assert_eq!(
                head(status, &[], false, method),
                format!(
                    "HTTP/1.1 {status} {}\r\n\r\n",
                    http::StatusCode::from_u16(status)
                        .unwrap()
                        .canonical_reason()
                        .unwrap()
                ),
                "no body: no framing field"
            );
        }
        assert_eq!(
            head(299, &[], true, Method::Get),
            "HTTP/1.1 299 \r\nContent-Length: 0\r\n\r\n",
            "a status without a reason phrase"
        );
    }

    #[test]
    fn trailers_cross_between_the_protocols() {
        let map = trailer_map(b"X-One: 1\r\nx-two:  2 \r\nbad line\r\nx-one: again\r\n");
        assert_eq!(map.get_all("x-one").iter().count(), 2);
        assert_eq!(map["x-two"], "2", "whitespace around the value goes");
        assert_eq!(map.len(), 3, "a line without a colon is left out");
        assert_eq!(
            trailer_lines(&map),
            b"x-one: 1\r\nx-one: again\r\nx-two: 2\r\n".to_vec()
        );
    }
}
