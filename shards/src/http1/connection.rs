//! One client connection over HTTP/1.1: read a request head, answer it locally (probes,
//! unknown revisions, registrations) or take it through the request path — admission, the
//! exchange with a pod, the conclusion — then read the next one or close.
//!
//! Per request the order of side effects follows upstream's handler chain: probes first, then
//! revision lookup (404 if unknown), then the wait for a pod, then the exchange.

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::rc::Rc;

use kactivator_api::{headers, messages};
use kactivator_h1::{
    parse_request, BodyKind, HeadError, Method, Parsed, RequestHead, ResponseHead, Version,
};
use monoio::io::{AsyncWriteRent, Canceller, OwnedReadHalf, Splitable};
use monoio::net::TcpStream;
use monoio::time::Instant;
use std::net::SocketAddr;

use super::client::{answer_error, answer_locally, ClientConn, ClientWriter, RequestMeta};
use super::exchange::{exchange, WATCH_LIMIT};
use super::io::{client_readable, write_all};
use super::registration::{is_registration_path, register_pod};
use super::rewrite::{self, ClientSide, LocalResponse};
use crate::http2::Preface;
use crate::request::admission::{self, acquire, ClientWatch, Held};
use crate::request::deadlines::{self, Deadlines};
use crate::request::error::RequestError;
use crate::request::faults;
use crate::request::headers::RequestHeaders;
use crate::request::identity;
use crate::request::outcome::{conclude, Concluded, Ended, Next};
use crate::request::probes;
use crate::request::retry::may_retry;
use crate::request::tally::Tally;
use crate::routing::replica::LocalRevision;
use crate::runtime::buffer::InBuf;
use crate::runtime::contain;
use crate::runtime::control_link::EvidenceKind;
use crate::runtime::race::{race, Either};
use crate::runtime::shard::{Shard, FIRST_REQUEST_GRACE};
use crate::upstream::error::UpstreamError;

/// An HTTP/1 request head as the request path reads it.
struct H1Headers<'a> {
    head: &'a RequestHead,
    buf: &'a [u8],
}

impl RequestHeaders for H1Headers<'_> {
    #[inline]
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.head.header(self.buf, name)
    }

    /// The codec has already found it: an absolute-form target's authority, else Host.
    #[inline]
    fn authority(&self) -> Option<&[u8]> {
        self.head.authority.map(|authority| authority.of(self.buf))
    }
}

enum HeadRead {
    Ready,
    Closed,
    Invalid(HeadError),
    /// The connection opened with the HTTP/2 preface: it is the HTTP/2 front's.
    Http2,
}

/// Serves one accepted connection until it closes.
///
/// Not an `async fn`: the connection is set up before the future exists, so the future holds the
/// connection state once instead of the arguments and the state side by side (every open
/// connection, idle or queued, pays the future's size).
pub(crate) fn serve_connection(
    shard: Rc<Shard>,
    stream: TcpStream,
    peer: SocketAddr,
) -> impl Future<Output = ()> {
    let accepted = Instant::now();
    let stats = shard.stats();
    stats.connections_accepted.increment();
    let open = OpenConnection::count(&shard);
    let _ = stream.set_nodelay(true);
    let (reader, writer) = stream.into_split();
    let mut conn = ClientConn {
        reader,
        writer: ClientWriter::new(writer),
        // Every open connection holds these, idle or queued for a pod, so they start small: a
        // request head usually fits in 2 KiB and the buffer grows to `READ_CHUNK` once a read
        // fills it; the output buffers are allocated on first use (a queued request has not
        // needed either yet) and kept for the next request.
        inbuf: InBuf::default(),
        request_out: Vec::new(),
        response_out: Vec::new(),
        peer_ip: peer.ip().to_string().into_bytes(),
        canceller: None,
        head: RequestHead::default(),
        response_head: ResponseHead::default(),
        request_id: String::new(),
        close_after: false,
    };
    async move {
        // Counted out when this future ends, or is dropped while unwinding from a panic.
        let _open = open;
        let shard = &shard;
        let stats = shard.stats();
        let mut served = false;
        let mut http2 = false;
        loop {
            match read_request_head(shard, &mut conn, served, accepted).await {
                HeadRead::Ready => {}
                HeadRead::Closed => break,
                HeadRead::Http2 => {
                    http2 = true;
                    break;
                }
                HeadRead::Invalid(error) => {
                    stats.bad_requests.increment();
                    let body = format!(
                        "{} {}: {error}\n",
                        error.status(),
                        rewrite::reason_phrase(error.status())
                    );
                    conn.response_out.clear();
                    rewrite::write_local_response(
                        &LocalResponse {
                            status: error.status(),
                            body: body.as_bytes(),
                            extra_header: None,
                            error_style: true,
                        },
                        ClientSide {
                            version: Version::Http11,
                            keep_alive: false,
                            head_only: false,
                        },
                        &mut conn.response_out,
                    );
                    let _ = write_all(&mut conn.writer, &mut conn.response_out).await;
                    break;
                }
            }
            stats.requests.increment();
            served = true;
            conn.writer.begin();
            // A panic while serving this request ends the request and the connection, not the
            // shard.
            let handled = contain::catching(handle_request(shard, &mut conn)).await;
            let next = match handled {
                Ok(next) => next,
                Err(panic) => {
                    contain::record(stats, "a request", &*panic);
                    answer_after_panic(&mut conn).await;
                    Next::Close
                }
            };
            // A response that did not say `Connection: close` promised the client it may send
            // again on this connection, draining or not: it waits, idle, for that request (see
            // `read_request_head`); the end of the drain closes it.
            if next == Next::Close {
                break;
            }
            if shard.accept_paused.get() {
                // An idle connection can give way to a client waiting at the connection cap.
                shard.connection_closed.notify_all();
            }
        }
        if http2 {
            // Boxed: an HTTP/2 connection's state is far larger than an HTTP/1 one's, and only
            // the connections that turn out to be HTTP/2 pay for it.
            let ClientConn {
                reader,
                writer,
                inbuf,
                peer_ip,
                ..
            } = conn;
            match reader.reunite(writer.into_inner()) {
                Ok(stream) => {
                    let read = bytes::Bytes::copy_from_slice(inbuf.data());
                    drop(inbuf);
                    Box::pin(crate::http2::server::take_over(
                        shard.clone(),
                        stream,
                        read,
                        Rc::from(peer_ip),
                    ))
                    .await;
                }
                Err(_) => tracing::warn!("cannot rejoin the halves of a connection for HTTP/2"),
            }
        } else {
            // Closing the write half sends FIN now rather than when the read half is dropped.
            let _ = conn.writer.shutdown().await;
        }
    }
}

/// A connection counted among the shard's open ones until this is dropped, also while
/// unwinding from a panic.
struct OpenConnection(Rc<Shard>);

impl OpenConnection {
    fn count(shard: &Rc<Shard>) -> OpenConnection {
        shard.stats().connections_open.increment();
        OpenConnection(shard.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.stats().connections_open.decrement();
        self.0.connection_closed.notify_all();
    }
}

/// After a panic ended a request: a 500 if nothing of an answer was written yet (the
/// connection closes either way; what the panic left in it cannot be trusted).
async fn answer_after_panic(conn: &mut ClientConn) {
    if conn.writer.wrote() {
        return;
    }
    conn.response_out.clear();
    rewrite::write_local_response(
        &LocalResponse {
            status: 500,
            body: messages::INTERNAL_ERROR.as_bytes(),
            extra_header: None,
            error_style: true,
        },
        ClientSide {
            version: conn.head.version,
            keep_alive: false,
            head_only: conn.head.method == Method::Head,
        },
        &mut conn.response_out,
    );
    let _ = write_all(&mut conn.writer, &mut conn.response_out).await;
}

/// Reads until a request head is complete. `served`: the connection has carried a request
/// before (it is an idle keep-alive connection while nothing is buffered); `accepted`: when it
/// was accepted.
///
/// Timers, as upstream's server (`ReadHeaderTimeout`): a connection's first head must be whole
/// within the head timeout of the accept, so a client that connects and says nothing cannot
/// hold a place under the connection cap for longer; a later head within the head timeout of
/// its first byte. Between requests a keep-alive connection waits without a timer, until its
/// client sends, or it is the longest idle at the connection cap, or the drain ends.
async fn read_request_head(
    shard: &Shard,
    conn: &mut ClientConn,
    served: bool,
    accepted: Instant,
) -> HeadRead {
    let head_timeout = shard.settings.head_timeout;
    // When the head must be whole: set from the accept for the first request, from the first
    // byte for later ones.
    let mut deadline = (!served).then(|| deadlines::later(accepted, head_timeout));
    let mut first_byte = false;
    // Counted among the shard's pending heads from the first read that left it unfinished
    // until it is read or the connection closes (the common head, whole in one read, never is).
    let _pending = PendingHead {
        shard,
        counted: Cell::new(false),
    };
    loop {
        if !conn.inbuf.is_empty() {
            // A connection may open with the HTTP/2 preface instead of a request head (h2c with
            // prior knowledge, on any data port, as upstream).
            let opening = if served {
                Preface::No
            } else {
                crate::http2::preface(conn.inbuf.data())
            };
            match opening {
                Preface::Yes => return HeadRead::Http2,
                Preface::Partial => {}
                Preface::No => match parse_request(conn.inbuf.data(), &mut conn.head) {
                    Ok(Parsed::Complete) => return HeadRead::Ready,
                    Ok(Parsed::Partial) => {}
                    Err(error) => return HeadRead::Invalid(error),
                },
            }
            if !first_byte {
                first_byte = true;
                _pending.count();
                deadline.get_or_insert_with(|| deadlines::later(Instant::now(), head_timeout));
            }
        }
        let read = match deadline {
            // A new connection that has sent nothing yet is not closed under its first request
            // by the drain: it has until `FIRST_REQUEST_GRACE` after every listener closed to
            // send one, and is answered; and until its head deadline in any case.
            Some(deadline) if !served && !first_byte => {
                let stop = async {
                    shard.stopping.wait().await;
                    shard.alarms.at(Instant::now() + FIRST_REQUEST_GRACE).await;
                };
                match race(
                    conn.inbuf.fill(&mut conn.reader),
                    race(shard.alarms.at(deadline), stop),
                )
                .await
                {
                    Either::Left(read) => read,
                    Either::Right(Either::Left(())) => {
                        shard.stats().head_timeouts.increment();
                        return HeadRead::Closed;
                    }
                    Either::Right(Either::Right(())) => return HeadRead::Closed,
                }
            }
            Some(deadline) => {
                match race(conn.inbuf.fill(&mut conn.reader), shard.alarms.at(deadline)).await {
                    Either::Left(read) => read,
                    Either::Right(()) => {
                        shard.stats().head_timeouts.increment();
                        return HeadRead::Closed;
                    }
                }
            }
            // Idle between requests. Told to close (the longest idle at the connection cap, or
            // the drain is over), the read is cancelled, not dropped: a request that arrived at
            // that moment is served, and the connection closes after it.
            None => {
                let cancel = conn.canceller.get_or_insert_with(Canceller::new).handle();
                let mut fill = pin!(conn.inbuf.fill_cancelable(&mut conn.reader, cancel));
                match race(fill.as_mut(), shard.idle.wait()).await {
                    Either::Left(read) => read,
                    Either::Right(()) => {
                        conn.close_after = true;
                        if let Some(canceller) = conn.canceller.as_mut() {
                            *canceller = std::mem::take(canceller).cancel();
                        }
                        fill.await
                    }
                }
            }
        };
        match read {
            Ok(0) | Err(_) => return HeadRead::Closed,
            Ok(_) => {}
        }
    }
}

/// A connection's place among the shard's pending heads, given back on drop.
struct PendingHead<'a> {
    shard: &'a Shard,
    counted: Cell<bool>,
}

impl PendingHead<'_> {
    fn count(&self) {
        self.counted.set(true);
        self.shard
            .pending_heads
            .set(self.shard.pending_heads.get() + 1);
    }
}

impl Drop for PendingHead<'_> {
    fn drop(&mut self) {
        if self.counted.get() {
            self.shard
                .pending_heads
                .set(self.shard.pending_heads.get() - 1);
            if self.shard.accept_paused.get() {
                self.shard.connection_closed.notify_all();
            }
        }
    }
}

async fn handle_request(shard: &Rc<Shard>, conn: &mut ClientConn) -> Next {
    let arrival = Instant::now();
    let mut meta = RequestMeta::of(&conn.head);
    // Told to close while idle, just as this request arrived: it is the connection's last.
    meta.keep_alive &= !conn.close_after;
    let head_len = conn.head.len;
    if meta.method == Method::Connect {
        return Box::pin(refuse_connect(shard, conn)).await;
    }
    let buf = conn.inbuf.data();
    let request = H1Headers {
        head: &conn.head,
        buf,
    };

    if let Some(answer) = probes::answer(&request, shard.health()) {
        shard.stats().local_responses.increment();
        // A probe's body is never read; closing keeps the stream in sync without reading it.
        let keep_alive =
            meta.keep_alive && meta.body == BodyKind::Empty && !shard.draining.is_set();
        let extra = answer
            .extra_header
            .as_ref()
            .map(|(name, value)| (*name, value.as_slice()));
        conn.inbuf.consume(head_len);
        return answer_locally(
            conn,
            &LocalResponse {
                status: answer.status,
                body: &answer.body,
                extra_header: extra,
                error_style: answer.error_style,
            },
            ClientSide {
                version: meta.version,
                keep_alive,
                head_only: meta.method == Method::Head,
            },
        )
        .await;
    }

    faults::inject(&request);

    if meta.method == Method::Post && is_registration_path(conn.head.target.of(buf)) {
        // Boxed: registrations are rare next to proxied requests, and inline their state would
        // widen every connection's future.
        return Box::pin(register_pod(shard, conn, meta)).await;
    }

    let revision_id = identity::revision_of(&request, &shard.settings.cluster_domain);
    let revision = revision_id.and_then(|id| shard.replica.find(id.namespace, id.name));
    let Some(revision) = revision else {
        let body = messages::revision_not_found(revision_id.map_or("", |id| id.name));
        let keep_alive =
            meta.keep_alive && meta.body == BodyKind::Empty && !shard.draining.is_set();
        conn.inbuf.consume(head_len);
        return answer_locally(
            conn,
            &LocalResponse {
                status: 404,
                body: body.as_bytes(),
                extra_header: None,
                error_style: true,
            },
            ClientSide {
                version: meta.version,
                keep_alive,
                head_only: meta.method == Method::Head,
            },
        )
        .await;
    };

    conn.request_id.clear();
    if let Some(id) = request
        .get(headers::RUN_ID)
        .or_else(|| request.get(headers::REQUEST_ID))
    {
        conn.request_id.push_str(&String::from_utf8_lossy(id));
    }
    conn.request_out.clear();
    let host_at =
        rewrite::write_request_head(&conn.head, buf, &conn.peer_ip, &mut conn.request_out);
    conn.inbuf.consume(head_len);

    let tally = Tally::arrive(shard, &revision, arrival);
    let ended = proxy_request(shard, conn, &revision, meta, arrival, host_at).await;
    // An answer of the activator's own is written here, once the request's own state is gone:
    // this keeps the error path's write out of the (long-lived) waiting state.
    let (status, next) = match conclude(meta.shape(), ended) {
        Concluded::Done { status, next } => (status, next),
        Concluded::Answer { error, keep_alive } => {
            tracing::debug!(
                request_id = %conn.request_id,
                status = error.status(),
                fault = error.fault().label(),
                "answered by the activator: {error}"
            );
            let next = answer_error(
                conn,
                meta,
                error.status(),
                &error.body(),
                error.go_error_style(),
                keep_alive && !shard.draining.is_set(),
            )
            .await;
            (error.status(), next)
        }
    };
    tally.end(arrival, status);
    next
}

/// CONNECT is refused before probes, registration and routing: an activator routes by
/// revision and is not a forward proxy. The connection closes, since whatever the client sends
/// next is meant for a tunnel.
async fn refuse_connect(shard: &Shard, conn: &mut ClientConn) -> Next {
    shard.stats().local_responses.increment();
    conn.inbuf.consume(conn.head.len);
    answer_locally(
        conn,
        &LocalResponse {
            status: 405,
            body: messages::CONNECT_REFUSED.as_bytes(),
            extra_header: Some(("Allow", messages::CONNECT_REFUSED_ALLOW.as_bytes())),
            error_style: true,
        },
        ClientSide {
            version: conn.head.version,
            keep_alive: false,
            head_only: false,
        },
    )
    .await;
    Next::Close
}

/// Waits for a pod, then runs the exchange, and says how it ended.
///
/// A request that reached no pod goes back to admission, within its deadline and a bounded
/// number of times (`request::retry`): when the connection to the pod could not be made (the
/// pod is reported and this shard passes it over for a moment, see `admission::dial_failed`),
/// and when a pod answers as another revision (its IP was reused: it is retired at once on
/// every shard and reported) and the request can be replayed (no body). Otherwise a failure is
/// a 502 naming the problem.
async fn proxy_request(
    shard: &Rc<Shard>,
    conn: &mut ClientConn,
    revision: &Rc<LocalRevision>,
    meta: RequestMeta,
    arrival: Instant,
    host_at: usize,
) -> Ended {
    let deadlines = Deadlines::new(&revision.timeouts(), arrival);
    // Only bodiless requests can be replayed; `send_request` leaves their head in
    // `request_out` for that.
    let replayable = meta.keeps_head();
    let mut attempt = 0;
    // The last pod that could not be reached: if no other pod serves the request before its
    // deadline, the client hears why, not only that time ran out.
    let mut unreached: Option<UpstreamError> = None;
    loop {
        attempt += 1;
        let mut client = Watch {
            reader: &mut conn.reader,
            inbuf: &mut conn.inbuf,
        };
        let pod = match acquire(shard, revision, deadlines.first_byte, &mut client).await {
            Ok(pod) => pod,
            Err(error) => {
                return Ended::Failed {
                    error: admission::not_admitted(error, unreached),
                    request_complete: false,
                };
            }
        };
        let mut held = Some(Held::new(&pod, revision, shard));
        rewrite::insert_host(&mut conn.request_out, host_at, &pod.host_line);

        let upstream = match shard.pool.checkout(pod.tracker.addr, shard.stats()).await {
            Ok(upstream) => upstream,
            Err(error) => {
                tracing::warn!(request_id = %conn.request_id, pod = %pod.tracker.addr, class = error.class(), "{error}");
                admission::dial_failed(shard, revision, &pod);
                drop(held);
                if !may_retry(attempt, &error, replayable) {
                    return Ended::Failed {
                        error: error.into(),
                        request_complete: false,
                    };
                }
                shard.stats().dial_retries.increment();
                // Nothing was sent: the head goes back as it was before this pod's Host line.
                rewrite::remove_host(&mut conn.request_out, host_at, &pod.host_line);
                unreached = Some(error);
                continue;
            }
        };
        let reused_connection = upstream.reused;
        // The exchange is the largest state a connection goes through; it runs in a block of
        // its own so that waiting and idle connections do not carry its size (see `blocks`).
        let ended = shard
            .exchanges
            .place(exchange(
                shard,
                conn,
                upstream,
                meta,
                deadlines,
                revision.key(),
                &mut held,
            ))
            .await;
        let Ended::Failed {
            error: RequestError::Upstream(failure),
            ..
        } = &ended
        else {
            return ended;
        };
        if let UpstreamError::IpReused {
            namespace,
            revision: serving,
            ..
        } = &**failure
        {
            admission::retire_reused(shard, revision, &pod, namespace, serving, &conn.request_id);
            drop(held);
            if !may_retry(attempt, failure, replayable) {
                return ended;
            }
            rewrite::remove_host(&mut conn.request_out, host_at, &pod.host_line);
            continue;
        }
        // A fresh connection the pod dropped says more than a pooled one that raced its
        // keep-alive timeout.
        if failure.is_pod_failure() && !reused_connection {
            admission::report(shard, revision, &pod, EvidenceKind::TransportFailure);
        }
        return ended;
    }
}

/// The client of an HTTP/1 request waiting for a slot: readable when bytes, a FIN or a reset
/// arrive; bytes (a body, a pipelined request) are kept, up to [`WATCH_LIMIT`].
struct Watch<'a> {
    reader: &'a mut OwnedReadHalf<TcpStream>,
    inbuf: &'a mut InBuf,
}

impl ClientWatch for Watch<'_> {
    fn parked(&mut self) {
        // Nothing is read while the request waits, so an empty read buffer goes back.
        self.inbuf.release_if_empty();
    }

    async fn readable(&self) {
        if self.inbuf.len() >= WATCH_LIMIT {
            // Enough is buffered; reading on would buffer without bound.
            std::future::pending::<()>().await;
        }
        let _ = client_readable(self.reader).await;
    }

    async fn absorb(&mut self) -> bool {
        matches!(self.inbuf.fill(self.reader).await, Ok(read) if read > 0)
    }
}
