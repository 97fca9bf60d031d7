//! One downstream connection: read requests, answer probes locally, proxy the rest to a pod.
//!
//! Per request the order of side effects follows upstream's handler chain: probes first, then
//! revision lookup (404 if unknown), then the wait for a pod, then the exchange. During the
//! exchange the request body flows to the pod while the response flows back, concurrently, so an
//! early response, `100 Continue` and streaming in both directions all work. Nothing is retried.

use std::borrow::Cow;
use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use monoio::time::Instant;

use kactivator_h1::{
    encode_last_chunk, parse_request, parse_response, BodyDecoder, BodyEvent, BodyKind, HeadError,
    Method, Parsed, RequestHead, ResponseHead, Version,
};
use monoio::buf::IoBuf;
use monoio::io::{
    AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, Canceller, OwnedReadHalf, OwnedWriteHalf,
    Splitable,
};
use monoio::net::TcpStream;

use crate::http1::reframe::{reframe, Reframed};
use crate::http1::rewrite::{self, client_framing, ClientFraming, ClientSide, LocalResponse};
use crate::request::identity;
use crate::request::probes::{self, Health};
use crate::routing::replica::{LocalPod, LocalRevision};
use crate::runtime::buffer::InBuf;
use crate::runtime::control_link::{
    PodSignal, SignalKind, REGISTRATION_MAX_BODY, REGISTRATION_PATH, REGISTRATION_USER_AGENT,
    RELAYED_HEADER,
};
use crate::runtime::race::{race, Either};
use crate::runtime::shard::Shard;
use crate::throttle::gate::{Admission, WaiterId};
use crate::upstream::error::{TransportCause, UpstreamError};
use crate::upstream::pool::UpstreamConn;

/// Once the first byte of a request arrived, its head must complete within this (Go's
/// `ReadHeaderTimeout` on the activator's server is one minute).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(60);
/// While waiting for a response, read ahead at most this much of a pipelined next request.
const WATCH_LIMIT: usize = 64 * 1024;
/// How long after the request is sent the client connection starts being watched.
const READ_AHEAD_DELAY: Duration = Duration::from_millis(5);
/// Status recorded for requests whose client went away (nginx's convention).
pub const CLIENT_CLOSED: u16 = 499;

/// The body upstream Knative sends when the queue is full.
const QUEUE_FULL_BODY: &[u8] = b"pending request queue full\n";
/// The body upstream Knative sends on a timeout (no trailing newline).
const TIMEOUT_BODY: &[u8] = b"activator request timeout";

/// The downstream side of a connection and its reusable scratch buffers.
struct ClientConn {
    reader: OwnedReadHalf<TcpStream>,
    writer: OwnedWriteHalf<TcpStream>,
    inbuf: InBuf,
    /// Outbound request head and body bytes on their way to the pod.
    request_out: Vec<u8>,
    /// Response bytes on their way to the client.
    response_out: Vec<u8>,
    /// The client's IP as text, for `X-Forwarded-For`; formatted once per connection.
    peer_ip: Vec<u8>,
    /// Interrupts the read-ahead on the client once a response is complete; one per connection,
    /// made by its first exchange (a connection that only waits in a queue never needs one).
    canceller: Option<Canceller>,
    head: RequestHead,
    response_head: ResponseHead,
    request_id: String,
}

/// What the exchange needs to know about the request once its head is consumed.
#[derive(Clone, Copy, Debug)]
struct RequestMeta {
    method: Method,
    version: Version,
    body: BodyKind,
    keep_alive: bool,
    upgrade: bool,
}

impl RequestMeta {
    fn of(head: &RequestHead) -> RequestMeta {
        RequestMeta {
            method: head.method,
            version: head.version,
            body: head.body,
            keep_alive: head.keep_alive(),
            upgrade: head.upgrade.is_some(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    KeepAlive,
    Close,
}

enum HeadRead {
    Ready,
    Closed,
    Invalid(HeadError),
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
    let stats = shard.stats();
    stats.connections_accepted.increment();
    stats.connections_open.increment();
    let _ = stream.set_nodelay(true);
    let (reader, writer) = stream.into_split();
    let mut conn = ClientConn {
        reader,
        writer,
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
    };
    async move {
        let shard = &shard;
        let stats = shard.stats();
        loop {
            match read_request_head(shard, &mut conn).await {
                HeadRead::Ready => {}
                HeadRead::Closed => break,
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
            if handle_request(shard, &mut conn).await == Next::Close || shard.stopping.is_set() {
                break;
            }
        }
        // Closing the write half sends FIN now rather than when the read half is dropped.
        let _ = conn.writer.shutdown().await;
        stats.connections_open.decrement();
        shard.connection_closed.notify_all();
    }
}

async fn read_request_head(shard: &Shard, conn: &mut ClientConn) -> HeadRead {
    let mut first_byte_at: Option<Instant> = None;
    loop {
        if !conn.inbuf.is_empty() {
            match parse_request(conn.inbuf.data(), &mut conn.head) {
                Ok(Parsed::Complete) => return HeadRead::Ready,
                Ok(Parsed::Partial) => {}
                Err(error) => return HeadRead::Invalid(error),
            }
            first_byte_at.get_or_insert_with(Instant::now);
        }
        let read = match first_byte_at {
            Some(start) => match race(
                conn.inbuf.fill(&mut conn.reader),
                shard.alarms.at(start + HEAD_TIMEOUT),
            )
            .await
            {
                Either::Left(read) => read,
                Either::Right(()) => return HeadRead::Closed,
            },
            // Idle between requests: a drain closes the connection here, never mid-request.
            None => match race(conn.inbuf.fill(&mut conn.reader), shard.stopping.wait()).await {
                Either::Left(read) => read,
                Either::Right(()) => return HeadRead::Closed,
            },
        };
        match read {
            Ok(0) | Err(_) => return HeadRead::Closed,
            Ok(_) => {}
        }
    }
}

async fn handle_request(shard: &Rc<Shard>, conn: &mut ClientConn) -> Next {
    let arrival = Instant::now();
    let meta = RequestMeta::of(&conn.head);
    let head_len = conn.head.len;
    let buf = conn.inbuf.data();

    if let Some(answer) = probes::answer(&conn.head, buf, shard.health()) {
        shard.stats().local_responses.increment();
        // A probe's body is never read; closing keeps the stream in sync without reading it.
        let keep_alive =
            meta.keep_alive && meta.body == BodyKind::Empty && !shard.stopping.is_set();
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

    if meta.method == Method::Post && is_registration_path(conn.head.target.of(buf)) {
        // Boxed: registrations are rare next to proxied requests, and inline their state would
        // widen every connection's future.
        return Box::pin(register_pod(shard, conn, meta)).await;
    }

    let revision_id = identity::revision_of(&conn.head, buf, &shard.settings.cluster_domain);
    let revision = revision_id.and_then(|id| shard.replica.find(id.namespace, id.name));
    let Some(revision) = revision else {
        let name = revision_id.map_or("", |id| id.name);
        let body = format!(
            "Error getting active endpoint: revision.serving.knative.dev \"{name}\" not found\n"
        );
        let keep_alive =
            meta.keep_alive && meta.body == BodyKind::Empty && !shard.stopping.is_set();
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
    if let Some(id) = conn
        .head
        .header(buf, "x-run-id")
        .or_else(|| conn.head.header(buf, "x-request-id"))
    {
        conn.request_id.push_str(&String::from_utf8_lossy(id));
    }
    conn.request_out.clear();
    let host_at =
        rewrite::write_request_head(&conn.head, buf, &conn.peer_ip, &mut conn.request_out);
    conn.inbuf.consume(head_len);

    let counters = revision.counters.clone();
    counters.concurrency.increment();
    let (status, next) = match proxy_request(shard, conn, &revision, meta, arrival, host_at).await {
        Ok(done) => done,
        // Written here, once the request's own state is gone: this keeps the error path's
        // write out of the (long-lived) waiting state.
        Err(refusal) => {
            respond_error(
                conn,
                meta,
                refusal.status,
                &refusal.body,
                refusal.body_consumed,
            )
            .await
        }
    };
    counters.concurrency.decrement();
    counters.record(status, arrival.elapsed().as_micros() as u64);
    next
}

fn is_registration_path(target: &[u8]) -> bool {
    let path = target
        .iter()
        .position(|&byte| byte == b'?')
        .map_or(target, |query| &target[..query]);
    path == REGISTRATION_PATH
}

/// Longest wait for the rest of a registration body.
const REGISTRATION_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// `POST /api/v1/pod-registration` from a queue-proxy: check the caller, read the body (at most
/// 64 KiB), hand it to the control thread and answer with what it says once the state worker
/// has applied it. Other methods on the path are proxied like any request, as upstream does.
async fn register_pod(shard: &Rc<Shard>, conn: &mut ClientConn, meta: RequestMeta) -> Next {
    let buf = conn.inbuf.data();
    let user_agent_ok = conn.head.header(buf, "user-agent") == Some(REGISTRATION_USER_AGENT);
    let relayed = conn.head.header(buf, RELAYED_HEADER).is_some();
    conn.inbuf.consume(conn.head.len);
    shard.stats().local_responses.increment();
    if !user_agent_ok {
        let status = respond_error(
            conn,
            meta,
            401,
            b"Invalid User-Agent for pod registration\n",
            false,
        )
        .await;
        return status.1;
    }
    let body = match read_small_body(shard, conn, meta.body, REGISTRATION_MAX_BODY).await {
        Ok(body) => body,
        Err(SmallBodyError::TooLarge) => {
            return respond_error(conn, meta, 400, b"Request body too large\n", false)
                .await
                .1;
        }
        Err(SmallBodyError::Invalid) => {
            return respond_error(conn, meta, 400, b"Invalid request body\n", false)
                .await
                .1;
        }
        Err(SmallBodyError::Gone) => return Next::Close,
    };
    let reply = shard.control.register(body, relayed).await;
    answer_locally(
        conn,
        &LocalResponse {
            status: reply.status,
            body: &reply.body,
            extra_header: reply
                .json
                .then_some(("Content-Type", b"application/json".as_slice())),
            error_style: !reply.json,
        },
        ClientSide {
            version: meta.version,
            keep_alive: meta.keep_alive && !shard.stopping.is_set(),
            head_only: false,
        },
    )
    .await
}

enum SmallBodyError {
    TooLarge,
    Invalid,
    Gone,
}

/// Reads a whole request body of at most `limit` bytes into memory.
async fn read_small_body(
    shard: &Shard,
    conn: &mut ClientConn,
    kind: BodyKind,
    limit: usize,
) -> Result<Vec<u8>, SmallBodyError> {
    if let BodyKind::Length(length) = kind {
        if length > limit as u64 {
            return Err(SmallBodyError::TooLarge);
        }
    }
    let deadline = Instant::now() + REGISTRATION_BODY_TIMEOUT;
    let mut decoder = BodyDecoder::new(kind);
    let mut body = Vec::new();
    loop {
        let (consumed, event) = decoder
            .decode(conn.inbuf.data())
            .map_err(|_| SmallBodyError::Invalid)?;
        let need_more = match event {
            Some(BodyEvent::Data(data)) => {
                if body.len() + data.len() > limit {
                    return Err(SmallBodyError::TooLarge);
                }
                body.extend_from_slice(data);
                false
            }
            Some(BodyEvent::End) => {
                conn.inbuf.consume(consumed);
                return Ok(body);
            }
            Some(BodyEvent::Trailers(_)) => false,
            None => true,
        };
        conn.inbuf.consume(consumed);
        if need_more {
            match race(conn.inbuf.fill(&mut conn.reader), shard.alarms.at(deadline)).await {
                Either::Left(Ok(read)) if read > 0 => {}
                _ => return Err(SmallBodyError::Gone),
            }
        }
    }
}

/// Answers with a response the activator made itself.
async fn answer_locally(
    conn: &mut ClientConn,
    response: &LocalResponse<'_>,
    client: ClientSide,
) -> Next {
    conn.response_out.clear();
    rewrite::write_local_response(response, client, &mut conn.response_out);
    match write_all(&mut conn.writer, &mut conn.response_out).await {
        Ok(()) if client.keep_alive => Next::KeepAlive,
        _ => Next::Close,
    }
}

/// When each timer of a request fires.
#[derive(Clone, Copy, Debug)]
struct Deadlines {
    /// End of the whole request.
    total: Instant,
    /// Latest time for the first response byte.
    first_byte: Instant,
    /// Longest gap between response writes.
    idle: Option<Duration>,
}

impl Deadlines {
    fn new(shard_route: &crate::routing::Timeouts, arrival: Instant) -> Deadlines {
        let total = arrival + shard_route.total;
        let mut first_byte = total;
        // Idle also caps the time to first byte: before any write the request counts as idle.
        for limit in [shard_route.response_start, shard_route.idle]
            .into_iter()
            .flatten()
        {
            first_byte = first_byte.min(arrival + limit);
        }
        Deadlines {
            total,
            first_byte,
            idle: shard_route.idle,
        }
    }
}

/// An error the activator answers itself instead of proxying.
struct Refusal {
    status: u16,
    body: Cow<'static, [u8]>,
    /// Whether the request body was read entirely (only then may the connection go on).
    body_consumed: bool,
}

impl Refusal {
    fn new(status: u16, body: impl Into<Cow<'static, [u8]>>, body_consumed: bool) -> Refusal {
        Refusal {
            status,
            body: body.into(),
            body_consumed,
        }
    }
}

/// Most pods a bodiless request is offered to when pods turn out to serve another revision.
const MAX_REUSE_RETRIES: usize = 3;

/// Waits for a pod, then runs the exchange. Returns the status to record and what happens next.
///
/// A pod that answers as another revision (its IP was reused) is retired at once on every
/// shard, reported, and the request goes to another pod when it can be replayed (no body);
/// otherwise it gets a 502 naming the problem.
async fn proxy_request(
    shard: &Rc<Shard>,
    conn: &mut ClientConn,
    revision: &Rc<LocalRevision>,
    meta: RequestMeta,
    arrival: Instant,
    host_at: usize,
) -> Result<(u16, Next), Refusal> {
    let deadlines = Deadlines::new(&revision.timeouts(), arrival);
    // Only bodiless requests can be replayed; `send_request` leaves their head in
    // `request_out` for that.
    let replayable = keeps_head(meta);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let pod = match revision.admit(shard) {
            Admission::Proceed(pod) => pod,
            Admission::Rejected => {
                return Err(Refusal::new(503, QUEUE_FULL_BODY, false));
            }
            Admission::Queued(id) => {
                let queued_at = Instant::now();
                let waited = wait_for_slot(conn, revision, shard, id, deadlines.first_byte).await;
                count_queue_time(shard, queued_at.elapsed());
                match waited {
                    Waited::Granted(pod) => pod,
                    Waited::Removed => {
                        return Err(Refusal::new(503, b"revision is no longer served\n", false));
                    }
                    Waited::TimedOut => return Err(Refusal::new(504, TIMEOUT_BODY, false)),
                    Waited::ClientGone => {
                        shard.stats().client_aborts.increment();
                        return Ok((CLIENT_CLOSED, Next::Close));
                    }
                }
            }
        };
        let mut held = Some(Held {
            pod: &pod,
            revision,
            shard,
        });
        rewrite::insert_host(&mut conn.request_out, host_at, &pod.host_line);

        let upstream = match shard.pool.checkout(pod.tracker.addr, shard.stats()).await {
            Ok(upstream) => upstream,
            Err(error) => {
                tracing::warn!(request_id = %conn.request_id, pod = %pod.tracker.addr, class = error.class(), "{error}");
                report(shard, revision, &pod, SignalKind::TransportFailure);
                return Err(Refusal::new(502, format!("{error}\n").into_bytes(), false));
            }
        };
        let reused_connection = upstream.reused;
        // The exchange is the largest state a connection goes through; it runs in a block of
        // its own so that waiting and idle connections do not carry its size (see `blocks`).
        let exchanged = shard
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
        match exchanged {
            Exchanged::Done(status, next) => return Ok((status, next)),
            Exchanged::PodFailed(status, next) => {
                // A fresh connection the pod dropped says more than a pooled one that raced
                // its keep-alive timeout.
                if !reused_connection {
                    report(shard, revision, &pod, SignalKind::TransportFailure);
                }
                return Ok((status, next));
            }
            Exchanged::WrongRevision {
                namespace,
                revision: serving,
            } => {
                tracing::warn!(
                    request_id = %conn.request_id,
                    pod = %pod.tracker.addr,
                    now_serving = %format_args!("{namespace}/{serving}"),
                    "pod IP reused by another revision; retiring it"
                );
                // No shard may start another request there, even before the control thread
                // publishes the removal.
                pod.tracker.slots.set_capacity(0);
                let body = format!(
                    "pod {} now serves revision {namespace}/{serving} (IP reused)\n",
                    pod.tracker.addr
                );
                report(
                    shard,
                    revision,
                    &pod,
                    SignalKind::IpReused {
                        namespace,
                        revision: serving,
                    },
                );
                drop(held);
                if !replayable || attempt > MAX_REUSE_RETRIES {
                    return Err(Refusal::new(502, body.into_bytes(), true));
                }
                // The head as it was before this pod's Host line went in.
                conn.request_out
                    .drain(host_at..host_at + pod.host_line.len());
            }
        }
    }
}

/// Counts a wait against the fork's warning, error and critical thresholds, once each.
fn count_queue_time(shard: &Shard, waited: Duration) {
    let stats = shard.stats();
    if waited >= Duration::from_secs(4) {
        stats.queue_time_warning.increment();
    }
    if waited >= Duration::from_secs(60) {
        stats.queue_time_error.increment();
    }
    if waited >= Duration::from_secs(180) {
        stats.queue_time_critical.increment();
    }
}

/// Tells the control thread what a request found out about a pod; a full channel drops it
/// (the request path never waits on the control thread) and counts the drop.
fn report(shard: &Shard, revision: &LocalRevision, pod: &LocalPod, kind: SignalKind) {
    let signal = PodSignal {
        revision: revision.key().clone(),
        pod: pod.tracker.addr,
        kind,
    };
    if !shard.control.signal(signal) {
        shard.stats().signals_dropped.increment();
    }
}

/// How a wait in the queue ended.
enum Waited {
    Granted(Rc<LocalPod>),
    /// The revision was removed while the request waited.
    Removed,
    TimedOut,
    /// The client closed its connection: its place in the queue is already given up.
    ClientGone,
}

/// Waits for a slot while watching the client: a client that leaves frees its place at once
/// instead of at its deadline.
///
/// A queued request is kept small: its deadline is an alarm in the shard's timer, and the
/// client is watched for readability, with no read (and no buffer) in flight. The empty read
/// buffer is given back meanwhile. Bytes that do arrive (a body, a pipelined request) are read
/// into the buffer, up to `WATCH_LIMIT`; a FIN or a reset means the client is gone.
async fn wait_for_slot(
    conn: &mut ClientConn,
    revision: &LocalRevision,
    shard: &Shard,
    id: WaiterId,
    deadline: Instant,
) -> Waited {
    enum Woke {
        Queue(Option<Rc<LocalPod>>),
        Deadline,
        Readable,
    }
    conn.inbuf.release_if_empty();
    let mut queued = pin!(Queued {
        revision,
        shard,
        id,
        done: false,
    });
    let mut alarm = pin!(shard.alarms.at(deadline));
    let mut watching = true;
    loop {
        let woke = {
            let reader = &conn.reader;
            let mut readable = pin!(async {
                if watching {
                    let _ = client_readable(reader).await;
                } else {
                    std::future::pending::<()>().await;
                }
            });
            poll_fn(|cx| {
                if let Poll::Ready(grant) = queued.as_mut().poll(cx) {
                    return Poll::Ready(Woke::Queue(grant));
                }
                if alarm.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woke::Deadline);
                }
                if readable.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woke::Readable);
                }
                Poll::Pending
            })
            .await
        };
        match woke {
            Woke::Queue(Some(pod)) => return Waited::Granted(pod),
            Woke::Queue(None) => return Waited::Removed,
            Woke::Deadline => return Waited::TimedOut,
            Woke::Readable if conn.inbuf.len() >= WATCH_LIMIT => watching = false,
            // Readable: this read completes at once (bytes, FIN or error are there), so the
            // queue and the alarm can wait for it.
            Woke::Readable => match conn.inbuf.fill(&mut conn.reader).await {
                // Dropping the queued wait (on return) gives up its place.
                Ok(0) | Err(_) => return Waited::ClientGone,
                Ok(_) => {}
            },
        }
    }
}

/// Completes when the client's socket has something to read (bytes, a FIN, an error), without
/// reading it.
async fn client_readable(reader: &OwnedReadHalf<TcpStream>) -> io::Result<()> {
    // SAFETY: both halves reach the stream through one `UnsafeCell`. This shared borrow lives
    // only while a request waits for a slot: nothing is written to the client then, and the read
    // half is not used for anything else until this future is dropped.
    let stream: &TcpStream = unsafe { &*reader.0.get() };
    stream.readable(false).await
}

/// A queued request waiting for its slot. Dropped before the slot arrives (timeout, client
/// gone), it frees its place in the queue, or the slot granted meanwhile.
struct Queued<'a> {
    revision: &'a LocalRevision,
    shard: &'a Shard,
    id: WaiterId,
    done: bool,
}

impl Future for Queued<'_> {
    type Output = Option<Rc<LocalPod>>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Self::Output> {
        let ready = self.revision.poll_grant(self.id, cx);
        if ready.is_ready() {
            self.done = true;
        }
        ready
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.revision.cancel(self.id, self.shard);
        }
    }
}

/// Holds a pod slot for the duration of a request; giving it back hands it to the oldest
/// waiter on any shard.
struct Held<'a> {
    pod: &'a LocalPod,
    revision: &'a LocalRevision,
    shard: &'a Shard,
}

impl Held<'_> {
    /// Gives the slot back now; true when a request queued on this shard was woken with it.
    fn give_back(self) -> bool {
        let held = std::mem::ManuallyDrop::new(self);
        held.revision.release(held.pod, held.shard)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.revision.release(self.pod, self.shard);
    }
}

/// Answers with an error the activator made. `body_consumed` says whether the request body was
/// read entirely (only then may the connection carry another request).
async fn respond_error(
    conn: &mut ClientConn,
    meta: RequestMeta,
    status: u16,
    body: &[u8],
    body_consumed: bool,
) -> (u16, Next) {
    let keep_alive =
        meta.keep_alive && (body_consumed || meta.body == BodyKind::Empty) && !meta.upgrade;
    let next = answer_locally(
        conn,
        &LocalResponse {
            status,
            body,
            extra_header: None,
            error_style: status != 504,
        },
        ClientSide {
            version: meta.version,
            keep_alive,
            head_only: meta.method == Method::Head,
        },
    )
    .await;
    (status, next)
}

/// How far the request side got; the response side reads it to decide how to stop it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SendPhase {
    /// Head or body still going to the pod.
    Body,
    /// Everything sent; waiting a moment before reading ahead on the client.
    Sent,
    /// A cancelable read on the client is in flight.
    ReadingAhead,
}

/// Why sending the request stopped early.
#[derive(Debug)]
enum SendError {
    /// The client closed or reset its connection.
    ClientGone,
    /// The client's body framing was invalid.
    ClientBody,
    /// Writing to the pod failed; the response may still come.
    Upstream,
}

/// How the response side ended.
enum ReceiveError {
    /// Nothing was written to the client yet: it can still get a 502.
    Upstream(UpstreamError),
    /// Nothing was written yet and a timer fired: 504.
    Timeout,
    /// The response started but could not finish: only closing is left.
    Truncated,
    /// The pod's response names another revision; nothing was written to the client.
    WrongRevision { namespace: String, revision: String },
}

struct Received {
    status: u16,
    client_keep_alive: bool,
    upstream_reusable: bool,
    upgraded: bool,
}

/// How an exchange ended.
enum Exchanged {
    /// The status to record and what happens to the connection.
    Done(u16, Next),
    /// As `Done`, after a 502 that was the pod's fault (it dropped the connection).
    PodFailed(u16, Next),
    /// The pod answered as another revision; nothing was sent to the client.
    WrongRevision { namespace: String, revision: String },
}

/// Runs one request/response exchange over `upstream`.
///
/// The moment the pod's response is complete, before its last bytes are relayed, the pod's
/// connection goes back to the pool and its slot (`held`) is given back: the next waiter's
/// request goes out while this client still receives the tail, instead of one write later.
async fn exchange(
    shard: &Rc<Shard>,
    conn: &mut ClientConn,
    mut upstream: UpstreamConn,
    meta: RequestMeta,
    deadlines: Deadlines,
    expected: &str,
    held: &mut Option<Held<'_>>,
) -> Exchanged {
    let ClientConn {
        reader,
        writer,
        inbuf,
        request_out,
        response_out,
        response_head,
        request_id,
        canceller,
        ..
    } = &mut *conn;
    let phase = Cell::new(SendPhase::Body);
    let addr = upstream.addr;
    let pod_fd = upstream.fd();
    // The request side borrows the pod's write half only until everything is sent; it puts it
    // back here so the connection can return to the pool while the client is still read ahead.
    let upstream_writer = Cell::new(Some(upstream.writer));
    let (received, sent, tail_written, mut upstream) = {
        let send = send_request(
            request_out,
            meta,
            reader,
            inbuf,
            &upstream_writer,
            pod_fd,
            &phase,
            canceller.get_or_insert_with(Canceller::new).handle(),
        );
        let mut send = pin!(send);
        let mut sent: Option<Result<(), SendError>> = None;
        let received = {
            let receive = receive_response(
                &mut upstream.reader,
                &mut upstream.inbuf,
                writer,
                response_out,
                response_head,
                meta,
                deadlines,
                addr,
                expected,
                shard,
            );
            let mut receive = pin!(receive);
            poll_fn(|cx| {
                // The request side goes first. Its last write and the pod's whole response can
                // complete in one batch (io_uring reports both at once); polled second, the
                // request would still look unsent, and a finished keep-alive exchange would
                // close both connections. The client cannot have the whole response yet (its
                // tail is written below), so a client that leaves now really left early.
                if sent.is_none() {
                    if let Poll::Ready(result) = send.as_mut().poll(cx) {
                        sent = Some(result);
                    }
                }
                if let Poll::Ready(received) = receive.as_mut().poll(cx) {
                    return Poll::Ready(Some(received));
                }
                if matches!(
                    sent,
                    Some(Err(SendError::ClientGone | SendError::ClientBody))
                ) {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await
        };
        // The request side hands the write half back once everything is sent.
        let mut upstream = match upstream_writer.take() {
            Some(writer) => {
                upstream.writer = writer;
                Some(upstream)
            }
            None => None,
        };
        // The pod is done with this request: its connection (when both directions ended cleanly)
        // and its slot go back before the tail is relayed and before the read-ahead is stopped.
        let mut tail_written = Ok(());
        if let Some(Ok(
            done @ Received {
                upgraded: false, ..
            },
        )) = &received
        {
            if let Some(upstream) = upstream.take_if(|_| done.upstream_reusable) {
                shard.pool.checkin(upstream);
            }
            if held.take().is_some_and(Held::give_back) {
                // The slot went to a request queued on this shard: its bytes reach the pod
                // before this tail reaches the client (the pod is what everyone waits for).
                shard.back_of_queue.yield_now().await;
            }
            if !response_out.is_empty() {
                tail_written = write_all(writer, response_out).await;
            }
        }
        // A request side still reading ahead is interrupted without losing bytes; one still sending
        // the body is abandoned, and both connections close. In `Sent` no read is in flight:
        // dropping the request side loses nothing.
        if received.is_some() && sent.is_none() && phase.get() == SendPhase::ReadingAhead {
            // Cancelling hands back a fresh canceller that keeps the old one's bookkeeping
            // capacity, so a keep-alive connection allocates nothing here after its first request.
            if let Some(canceller) = canceller {
                *canceller = std::mem::take(canceller).cancel();
            }
            sent = Some(send.await);
        }
        (received, sent, tail_written, upstream)
    };
    let request_complete = phase.get() != SendPhase::Body;
    let Some(received) = received else {
        shard.stats().client_aborts.increment();
        return match sent {
            Some(Err(SendError::ClientBody)) => Exchanged::Done(400, Next::Close),
            _ => Exchanged::Done(CLIENT_CLOSED, Next::Close),
        };
    };
    let client_gone = matches!(
        sent,
        Some(Err(SendError::ClientGone | SendError::ClientBody))
    );

    match received {
        Ok(received) if received.upgraded => {
            // An upgrade request ends at its head, so the request side has handed the write half
            // back. From here on it is a byte stream in both directions; no timer applies (★).
            let Some(upstream) = upstream.as_mut() else {
                return Exchanged::Done(101, Next::Close);
            };
            splice_upgraded(
                reader,
                inbuf,
                writer,
                &mut upstream.reader,
                &mut upstream.inbuf,
                &mut upstream.writer,
            )
            .await;
            Exchanged::Done(101, Next::Close)
        }
        Ok(_) if tail_written.is_err() => Exchanged::Done(response_head.status, Next::Close),
        Ok(received) => {
            let next = if received.client_keep_alive && request_complete && !client_gone {
                Next::KeepAlive
            } else {
                Next::Close
            };
            Exchanged::Done(received.status, next)
        }
        Err(ReceiveError::Upstream(error)) => {
            tracing::warn!(request_id = %request_id, pod = %addr, class = error.class(), "{error}");
            let body = format!("{error}\n");
            if client_gone {
                return Exchanged::Done(CLIENT_CLOSED, Next::Close);
            }
            let pod_failed = error.is_pod_failure();
            let (status, next) =
                respond_error(conn, meta, 502, body.as_bytes(), request_complete).await;
            if pod_failed {
                Exchanged::PodFailed(status, next)
            } else {
                Exchanged::Done(status, next)
            }
        }
        Err(ReceiveError::WrongRevision {
            namespace,
            revision,
        }) => {
            if client_gone {
                return Exchanged::Done(CLIENT_CLOSED, Next::Close);
            }
            Exchanged::WrongRevision {
                namespace,
                revision,
            }
        }
        Err(ReceiveError::Timeout) => {
            tracing::warn!(request_id = %request_id, pod = %addr, "activator request timeout");
            let (status, next) =
                respond_error(conn, meta, 504, TIMEOUT_BODY, request_complete).await;
            Exchanged::Done(status, next)
        }
        // The status already sent is what the client saw.
        Err(ReceiveError::Truncated) => Exchanged::Done(response_head.status, Next::Close),
    }
}

/// Sends the request head and body to the pod, then watches the client for a disconnect.
#[allow(clippy::too_many_arguments)]
async fn send_request(
    out: &mut Vec<u8>,
    meta: RequestMeta,
    reader: &mut OwnedReadHalf<TcpStream>,
    inbuf: &mut InBuf,
    upstream_writer: &Cell<Option<OwnedWriteHalf<TcpStream>>>,
    pod_fd: RawFd,
    phase: &Cell<SendPhase>,
    cancel: monoio::io::CancelHandle,
) -> Result<(), SendError> {
    let Some(mut upstream) = upstream_writer.take() else {
        return Err(SendError::Upstream);
    };
    let mut decoder = BodyDecoder::new(meta.body);
    let mut trailers: Option<Vec<u8>> = None;
    let chunked = meta.body == BodyKind::Chunked;
    // Once the socket has not taken everything at once it is backed up: trying again first
    // would only add a failed syscall to every write of the body.
    let mut try_now = true;
    loop {
        // Move the body bytes already buffered into `out`, behind the head.
        let progress = reframe(&mut decoder, inbuf, chunked, &mut trailers, out)
            .map_err(|_| SendError::ClientBody)?;
        if !out.is_empty() {
            // The pod's time is what requests queue for: its bytes go out now, not when this
            // shard next submits to the ring (see `send_now`).
            let sent = if try_now { send_now(pod_fd, out) } else { 0 };
            try_now = sent == out.len();
            let written = if sent < out.len() {
                write_rest(&mut upstream, out, sent).await
            } else {
                Ok(())
            };
            if !keeps_head(meta) {
                out.clear();
            }
            written.map_err(|_| SendError::Upstream)?;
        }
        match progress {
            Reframed::Finished => break,
            Reframed::OutputFull => continue,
            Reframed::NeedInput => match inbuf.fill(reader).await {
                Ok(0) | Err(_) => return Err(SendError::ClientGone),
                Ok(_) => {}
            },
        }
    }
    upstream_writer.set(Some(upstream));
    phase.set(SendPhase::Sent);
    if meta.upgrade {
        // Bytes after an upgrade request belong to the new protocol; leave them to the splice.
        return Ok(());
    }
    // Read ahead (a pipelined request, or the FIN of a client that gave up) until interrupted.
    // Most responses arrive within microseconds; waiting a moment first saves a read and its
    // cancellation per request, and a vanished client is still noticed within milliseconds.
    monoio::time::sleep(READ_AHEAD_DELAY).await;
    phase.set(SendPhase::ReadingAhead);
    if read_ahead(reader, inbuf, cancel).await {
        Err(SendError::ClientGone)
    } else {
        Ok(())
    }
}

/// The revision a response says it comes from, when that is not `expected` (`namespace/name`).
fn other_revision(head: &ResponseHead, buf: &[u8], expected: &str) -> Option<(String, String)> {
    let (expected_namespace, expected_name) = expected.split_once('/')?;
    identity::other_revision(
        head.header(buf, "x-knative-revision-name"),
        head.header(buf, "x-knative-revision-namespace"),
        expected_namespace,
        expected_name,
    )
}

/// Reads ahead on the client (a body, a pipelined request, or the FIN of a client that gave
/// up) until cancelled through `cancel`, which loses no byte. True when the client is gone;
/// false when cancelled or when enough is buffered (reading on would buffer without bound).
async fn read_ahead(
    reader: &mut OwnedReadHalf<TcpStream>,
    inbuf: &mut InBuf,
    cancel: monoio::io::CancelHandle,
) -> bool {
    loop {
        if inbuf.len() >= WATCH_LIMIT {
            return false;
        }
        match inbuf.fill_cancelable(reader, cancel.clone()).await {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => return false,
            Err(_) => return true,
        }
    }
}

/// Reads the pod's response and relays it to the client.
#[allow(clippy::too_many_arguments)]
async fn receive_response(
    upstream: &mut OwnedReadHalf<TcpStream>,
    upstream_inbuf: &mut InBuf,
    client: &mut OwnedWriteHalf<TcpStream>,
    out: &mut Vec<u8>,
    head: &mut ResponseHead,
    meta: RequestMeta,
    deadlines: Deadlines,
    addr: SocketAddr,
    expected: &str,
    shard: &Shard,
) -> Result<Received, ReceiveError> {
    // The head, relaying any 1xx on the way.
    loop {
        match parse_response(upstream_inbuf.data(), meta.method, head) {
            Ok(Parsed::Complete) if head.is_informational() && head.status != 101 => {
                if meta.version == Version::Http11 {
                    out.clear();
                    rewrite::write_response_head(
                        head,
                        upstream_inbuf.data(),
                        meta.version,
                        ClientFraming::AsIs,
                        true,
                        out,
                    );
                    write_all(client, out)
                        .await
                        .map_err(|_| ReceiveError::Truncated)?;
                }
                upstream_inbuf.consume(head.len);
                continue;
            }
            Ok(Parsed::Complete) => {
                if let Some((namespace, revision)) =
                    other_revision(head, upstream_inbuf.data(), expected)
                {
                    return Err(ReceiveError::WrongRevision {
                        namespace,
                        revision,
                    });
                }
                break;
            }
            Ok(Parsed::Partial) => {}
            Err(error) => {
                return Err(ReceiveError::Upstream(UpstreamError::MalformedResponse {
                    addr,
                    reason: error.to_string(),
                }))
            }
        }
        let read =
            monoio::time::timeout_at(deadlines.first_byte, upstream_inbuf.fill(upstream)).await;
        match read {
            Err(_elapsed) => return Err(ReceiveError::Timeout),
            Ok(Ok(0)) if upstream_inbuf.is_empty() => {
                return Err(ReceiveError::Upstream(
                    UpstreamError::ClosedBeforeResponse { addr },
                ))
            }
            Ok(Ok(0)) => {
                return Err(ReceiveError::Upstream(UpstreamError::MalformedResponse {
                    addr,
                    reason: "connection closed in the middle of the response head".into(),
                }))
            }
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                return Err(ReceiveError::Upstream(UpstreamError::Receive {
                    addr,
                    cause: TransportCause::of(&error),
                }))
            }
        }
    }

    if head.status == 101 {
        if !meta.upgrade {
            return Err(ReceiveError::Upstream(UpstreamError::UnexpectedSwitch {
                addr,
            }));
        }
        out.clear();
        rewrite::write_response_head(
            head,
            upstream_inbuf.data(),
            meta.version,
            ClientFraming::AsIs,
            true,
            out,
        );
        upstream_inbuf.consume(head.len);
        write_all(client, out)
            .await
            .map_err(|_| ReceiveError::Truncated)?;
        return Ok(Received {
            status: 101,
            client_keep_alive: false,
            upstream_reusable: false,
            upgraded: true,
        });
    }

    let framing = client_framing(head.body, meta.version);
    let upstream_reusable = head.keep_alive() && head.body != BodyKind::UntilClose;
    let client_keep_alive =
        meta.keep_alive && framing != ClientFraming::UntilClose && !shard.stopping.is_set();
    out.clear();
    rewrite::write_response_head(
        head,
        upstream_inbuf.data(),
        meta.version,
        framing,
        client_keep_alive,
        out,
    );
    upstream_inbuf.consume(head.len);
    let status = head.status;

    let mut decoder = BodyDecoder::new(head.body);
    let mut trailers: Option<Vec<u8>> = None;
    let mut wrote_head = false;
    let chunked = framing == ClientFraming::Chunked;
    loop {
        let progress = match reframe(&mut decoder, upstream_inbuf, chunked, &mut trailers, out) {
            Ok(progress) => progress,
            Err(error) if !wrote_head => {
                return Err(ReceiveError::Upstream(UpstreamError::MalformedResponse {
                    addr,
                    reason: error.to_string(),
                }))
            }
            Err(_) => return Err(ReceiveError::Truncated),
        };
        if progress == Reframed::Finished {
            // The tail stays in `out`: the caller gives the pod back before relaying it.
            return Ok(Received {
                status,
                client_keep_alive,
                upstream_reusable,
                upgraded: false,
            });
        }
        if !out.is_empty() {
            write_all(client, out)
                .await
                .map_err(|_| ReceiveError::Truncated)?;
            wrote_head = true;
        }
        // More is already buffered: never wait on the socket for bytes we hold.
        if progress == Reframed::OutputFull {
            continue;
        }
        let deadline = match deadlines.idle {
            Some(idle) => deadlines.total.min(Instant::now() + idle),
            None => deadlines.total,
        };
        match monoio::time::timeout_at(deadline, upstream_inbuf.fill(upstream)).await {
            Ok(Ok(0)) => {
                if decoder.finish().is_err() {
                    return Err(ReceiveError::Truncated);
                }
                // Close-delimited body: the end is the pod's FIN.
                if framing == ClientFraming::Chunked {
                    encode_last_chunk(None, out);
                    write_all(client, out)
                        .await
                        .map_err(|_| ReceiveError::Truncated)?;
                }
                return Ok(Received {
                    status,
                    client_keep_alive,
                    upstream_reusable: false,
                    upgraded: false,
                });
            }
            Ok(Ok(_)) => {}
            Ok(Err(_)) | Err(_) => return Err(ReceiveError::Truncated),
        }
    }
}

/// Copies bytes both ways after a `101`, propagating each direction's FIN as a half-close.
async fn splice_upgraded(
    client_reader: &mut OwnedReadHalf<TcpStream>,
    client_inbuf: &mut InBuf,
    client_writer: &mut OwnedWriteHalf<TcpStream>,
    upstream_reader: &mut OwnedReadHalf<TcpStream>,
    upstream_inbuf: &mut InBuf,
    upstream_writer: &mut OwnedWriteHalf<TcpStream>,
) {
    let to_pod = copy_until_eof(client_reader, client_inbuf, upstream_writer);
    let to_client = copy_until_eof(upstream_reader, upstream_inbuf, client_writer);
    let mut to_pod = pin!(to_pod);
    let mut to_client = pin!(to_client);
    let (mut pod_done, mut client_done) = (false, false);
    poll_fn(|cx| {
        if !pod_done {
            if let Poll::Ready(result) = to_pod.as_mut().poll(cx) {
                if result.is_err() {
                    return Poll::Ready(());
                }
                pod_done = true;
            }
        }
        if !client_done {
            if let Poll::Ready(result) = to_client.as_mut().poll(cx) {
                if result.is_err() {
                    return Poll::Ready(());
                }
                client_done = true;
            }
        }
        if pod_done && client_done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Copies `reader` into `writer` until EOF, then shuts the writer down (half-close).
async fn copy_until_eof<R: AsyncReadRent, W: AsyncWriteRent>(
    reader: &mut R,
    inbuf: &mut InBuf,
    writer: &mut W,
) -> io::Result<()> {
    let mut buf = Vec::with_capacity(16 * 1024);
    buf.extend_from_slice(inbuf.data());
    let buffered = inbuf.len();
    inbuf.consume(buffered);
    loop {
        if !buf.is_empty() {
            write_all(writer, &mut buf).await?;
        }
        buf.clear();
        let (read, returned) = reader.read(buf).await;
        buf = returned;
        match read {
            Ok(0) => {
                writer.shutdown().await?;
                return Ok(());
            }
            Ok(_) => {}
            Err(error) => {
                let _ = writer.shutdown().await;
                return Err(error);
            }
        }
    }
}

/// Writes all of `out` and clears it, keeping its allocation.
async fn write_all<W: AsyncWriteRent>(writer: &mut W, out: &mut Vec<u8>) -> io::Result<()> {
    let result = write_rest(writer, out, 0).await;
    out.clear();
    result
}

/// Writes what the socket takes at once of `bytes`, without waiting; returns how much.
///
/// Under io_uring a write would otherwise wait for the end of the shard's turn, behind every
/// other operation queued in it (client writes, each waking a client thread). For the request
/// a pod has been waiting for, that queue is the idle gap between two of its requests. A
/// non-blocking `send` puts the bytes on the wire at once; whatever it did not take (a full
/// socket buffer) or any error is left to the regular write, which reports it.
fn send_now(fd: RawFd, bytes: &[u8]) -> usize {
    // SAFETY: `fd` is the pod connection's socket, owned by the exchange that calls this and
    // open for the call; `bytes` is a live slice the kernel only reads. MSG_DONTWAIT makes the
    // call non-blocking whatever the socket's mode; MSG_NOSIGNAL turns a closed peer into
    // EPIPE instead of a signal.
    let n = unsafe {
        libc::send(
            fd,
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    usize::try_from(n).unwrap_or(0)
}

/// Writes `out[from..]` and leaves `out` as it was.
async fn write_rest<W: AsyncWriteRent>(
    writer: &mut W,
    out: &mut Vec<u8>,
    from: usize,
) -> io::Result<()> {
    let buf = std::mem::take(out);
    let (result, rest) = writer.write_all(buf.slice(from..)).await;
    *out = rest.into_inner();
    result.map(|_| ())
}

/// A bodiless, non-upgrade request is written to the pod in one piece and kept in
/// `request_out` afterwards, so it can be replayed on another pod without a copy.
fn keeps_head(meta: RequestMeta) -> bool {
    meta.body == BodyKind::Empty && !meta.upgrade
}

impl Shard {
    fn health(&self) -> Health {
        if self.draining.is_set() {
            Health::Draining
        } else {
            Health::Healthy
        }
    }
}
