//! A gRPC test backend that speaks HTTP/1.1 and h2c (HTTP/2 with prior knowledge) on one
//! port, as a Knative queue-proxy does (or h2c alone, `BackendConfig::http2_only`), and an h2c
//! gRPC client for the tests that drive it.
//!
//! The backend serves the `Echo` service of `testkit/proto/echo.proto` (generated code in
//! [`pb`]) with tonic's generated server, but accepts connections with its own hyper-util
//! server so that gRPC, plain HTTP and queue-proxy probes share the port:
//!
//! | request | answer |
//! |---|---|
//! | any, with `K-Network-Probe: queue` | 200 `queue`, counted in [`GrpcStats::probes`] only |
//! | `content-type: application/grpc…` | the Echo service |
//! | `GET /` | 200 `hello from <name>\n` (`HEAD /`: its length, no body) |
//! | `GET /sleep?ms=N` | the same, N ms later |
//! | `POST /echo` | 200, the body streamed back without a length, then trailers `x-echo-bytes` (its size) and `x-echo-trailer` (the request's, if it had one) |
//! | anything else | 404 `no route\n` |
//!
//! Every answer carries `X-Backend: <name>`, the revision headers when configured, and
//! `X-Http-Version: HTTP/1.1` or `HTTP/2.0`, the protocol the request reached the pod over, and
//! `X-Request-Authority`, the `:authority` (HTTP/2) or `Host` (HTTP/1.1) it arrived with, and
//! `X-Received-Traceparent`, the `traceparent` it arrived with, when it had one.
//!
//! A test drives it like this (through the proxy, `addr` would be the proxy's):
//!
//! ```no_run
//! # async fn example() -> Result<(), kactivator_testkit::grpc::BoxError> {
//! use kactivator_testkit::backend::BackendConfig;
//! use kactivator_testkit::grpc::{connect, pb::EchoRequest, spawn_grpc};
//!
//! let backend = spawn_grpc(BackendConfig::named("pod-a"))?;
//! let mut client = connect(backend.addr(), "hello-00001.default.svc.cluster.local").await?;
//! let reply = client
//!     .unary(EchoRequest { payload: "ping".into(), delay_ms: 0, reply_bytes: 0 })
//!     .await?
//!     .into_inner();
//! assert_eq!(reply.backend, "pod-a");
//! assert_eq!(backend.stats().requests, 1);
//! # Ok(())
//! # }
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, Stream, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tonic::codegen::Service;
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

use crate::backend::routes::Identity;
use crate::backend::stats::{ConnectionGuard, Counters, InFlightGuard};
use crate::backend::{run_server_until_signal, BackendConfig, ServerThread, Stats};
use crate::pattern::{pattern_byte, pattern_frame, FRAME_SIZE};

/// Code generated from `testkit/proto/echo.proto`: messages, client and server.
pub mod pb {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("kactivator.test.v1");
}

use pb::echo_client::EchoClient;
use pb::echo_server::{Echo, EchoServer};
use pb::{EchoReply, EchoRequest, StreamRequest};

/// Largest gRPC message the backend and [`connect`]'s client send or accept: well above the
/// 16 MiB messages the large-message tests use (tonic's default limit is 4 MiB).
pub const MAX_MESSAGE_SIZE: usize = 64 * 1024 * 1024;

/// Pause after a failed accept, so the accept loop does not spin while the cause lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);

const HTTP_VERSION_HEADER: HeaderName = HeaderName::from_static("x-http-version");
const AUTHORITY_HEADER: HeaderName = HeaderName::from_static("x-request-authority");
const PROBE_HEADER: HeaderName = HeaderName::from_static("k-network-probe");

/// Error type of the response bodies and of the client helpers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

type ResponseBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

// === counters ===

/// A snapshot of a gRPC backend's counters: those of the HTTP backend ([`Stats`]) plus two
/// that only make sense with HTTP/2 streams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GrpcStats {
    /// Requests (gRPC calls and plain HTTP) whose handler started; probes excluded.
    pub requests: u64,
    /// Requests started and not yet finished: a streaming call counts until its response
    /// stream ends or is dropped. A proxy that limits concurrency per pod is checked here.
    pub in_flight: u64,
    /// High-water mark of `in_flight`.
    pub max_in_flight: u64,
    /// Queue-proxy probes answered (`K-Network-Probe: queue`, any path, either protocol).
    pub probes: u64,
    /// TCP connections accepted.
    pub connections_accepted: u64,
    /// TCP connections not yet closed.
    pub connections_open: u64,
    /// Requests dropped before their response finished: the client reset the stream (or
    /// closed the connection) while the handler ran or the response was still streaming.
    pub cancelled: u64,
    /// Connections that carried at least one HTTP/2 request.
    pub h2_connections: u64,
}

/// The gRPC-only counters; the rest live in the HTTP backend's [`Counters`].
#[derive(Debug, Default)]
struct ExtraCounters {
    cancelled: AtomicU64,
    h2_connections: AtomicU64,
}

/// State shared by every connection of one backend and its handle.
#[derive(Debug)]
struct Shared {
    identity: Identity,
    counters: Arc<Counters>,
    extra: Arc<ExtraCounters>,
    echo: EchoServer<EchoService>,
    max_concurrent_streams: Option<u32>,
    /// HTTP/2 only (`BackendConfig::http2_only`).
    http2_only: bool,
    /// Lets held calls go ([`HOLD`]).
    releases: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    fn new(config: &BackendConfig) -> io::Result<Self> {
        let (releases, released) = tokio::sync::watch::channel(0);
        let echo = EchoService {
            name: config.name.clone(),
            releases: released,
        };
        Ok(Self {
            identity: Identity::new(
                &config.name,
                config.revision_name.as_deref(),
                config.revision_namespace.as_deref(),
            )?,
            counters: Arc::default(),
            extra: Arc::default(),
            echo: EchoServer::new(echo)
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
            max_concurrent_streams: config.max_concurrent_streams,
            http2_only: config.http2_only,
            releases,
        })
    }

    fn snapshot(&self) -> GrpcStats {
        let Stats {
            requests,
            in_flight,
            max_in_flight,
            probes,
            connections_accepted,
            connections_open,
        } = self.counters.snapshot();
        GrpcStats {
            requests,
            in_flight,
            max_in_flight,
            probes,
            connections_accepted,
            connections_open,
            cancelled: self.extra.cancelled.load(Ordering::SeqCst),
            h2_connections: self.extra.h2_connections.load(Ordering::SeqCst),
        }
    }

    fn reset(&self) {
        self.counters.reset();
        self.extra.cancelled.store(0, Ordering::SeqCst);
        self.extra.h2_connections.store(0, Ordering::SeqCst);
    }
}

/// One accepted connection: keeps it counted as open, and remembers whether it has been
/// counted as HTTP/2 already.
#[derive(Debug)]
struct ConnectionContext {
    shared: Arc<Shared>,
    spoke_h2: AtomicBool,
    _open: ConnectionGuard,
}

/// Keeps one request in `in_flight`, and counts it in `cancelled` if it is dropped before
/// its response finished.
struct RequestGuard {
    _in_flight: InFlightGuard,
    extra: Arc<ExtraCounters>,
    finished: bool,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.extra.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A response body that releases its request's [`RequestGuard`] when it ends or is dropped.
///
/// "Ends" is the last frame: trailers (how every gRPC response ends; hyper stops polling
/// after them), the end of the stream, or a body that says it has nothing more to send.
struct TrackedBody {
    inner: ResponseBody,
    guard: Option<RequestGuard>,
}

impl TrackedBody {
    fn untracked(inner: ResponseBody) -> Self {
        Self { inner, guard: None }
    }

    fn finish(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            guard.finished = true;
        }
    }
}

impl Body for TrackedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(context);
        let last = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(frame))) => frame.is_trailers() || self.inner.is_end_stream(),
            // An error is the body's own failure, not the client's cancel.
            Poll::Ready(Some(Err(_))) => true,
            Poll::Pending => false,
        };
        if last {
            self.finish();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TrackedBody {
    fn drop(&mut self) {
        // A body with nothing to send may never be polled at all.
        if self.inner.is_end_stream() {
            self.finish();
        }
    }
}

// === the Echo service ===

/// `EchoRequest::delay_ms` that holds the call until the test lets held calls go
/// ([`GrpcHandle::release_held`]), however long that takes: a test that must see a call still
/// at the pod after some steps of its own does not race a fixed delay against them. Once
/// released, a backend holds no call any more.
pub const HOLD: u32 = u32::MAX;

/// The implementation behind tonic's generated server.
#[derive(Clone, Debug)]
struct EchoService {
    name: String,
    /// How many times held calls were let go; a held call waits while it is 0.
    releases: tokio::sync::watch::Receiver<u64>,
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<EchoReply, Status>> + Send>>;

impl EchoService {
    fn reply(&self, payload: Bytes, seq: u64) -> EchoReply {
        EchoReply {
            payload,
            backend: self.name.clone(),
            seq,
        }
    }

    /// The answer to one request, after its delay (or, [`HOLD`], once released).
    async fn answer(&self, request: EchoRequest, seq: u64) -> EchoReply {
        if request.delay_ms == HOLD {
            // A level, not an edge: a call whose handler started before the release but got
            // here after it must not wait for another. A dropped sender (the backend is
            // stopping) ends the wait too.
            let mut releases = self.releases.clone();
            let _ = releases.wait_for(|released| *released > 0).await;
        } else {
            sleep_ms(request.delay_ms).await;
        }
        let payload = match request.reply_bytes {
            0 => request.payload,
            length => pattern_payload(length),
        };
        self.reply(payload, seq)
    }
}

/// The first `length` bytes of the testkit's pattern (see [`crate::pattern`]), as one
/// payload; small ones share the pattern's static buffer.
pub fn pattern_payload(length: u32) -> Bytes {
    let length = length as usize;
    if length <= FRAME_SIZE {
        pattern_frame(0, length)
    } else {
        (0..length as u64)
            .map(pattern_byte)
            .collect::<Vec<u8>>()
            .into()
    }
}

async fn sleep_ms(milliseconds: u32) {
    if milliseconds > 0 {
        tokio::time::sleep(Duration::from_millis(u64::from(milliseconds))).await;
    }
}

#[tonic::async_trait]
impl Echo for EchoService {
    async fn unary(
        &self,
        request: tonic::Request<EchoRequest>,
    ) -> Result<tonic::Response<EchoReply>, Status> {
        Ok(tonic::Response::new(
            self.answer(request.into_inner(), 0).await,
        ))
    }

    type ServerStreamStream = ReplyStream;

    async fn server_stream(
        &self,
        request: tonic::Request<StreamRequest>,
    ) -> Result<tonic::Response<ReplyStream>, Status> {
        let StreamRequest {
            count,
            interval_ms,
            reply_bytes,
        } = request.into_inner();
        let service = self.clone();
        let replies = stream::iter(0..u64::from(count)).then(move |seq| {
            let service = service.clone();
            async move {
                if seq > 0 {
                    sleep_ms(interval_ms).await;
                }
                Ok(service.reply(pattern_payload(reply_bytes), seq))
            }
        });
        Ok(tonic::Response::new(Box::pin(replies)))
    }

    async fn client_stream(
        &self,
        request: tonic::Request<tonic::Streaming<EchoRequest>>,
    ) -> Result<tonic::Response<EchoReply>, Status> {
        let mut requests = request.into_inner();
        let mut payload = Vec::new();
        let mut received = 0;
        let mut reply_bytes = 0;
        while let Some(request) = requests.message().await? {
            sleep_ms(request.delay_ms).await;
            payload.extend_from_slice(&request.payload);
            reply_bytes = request.reply_bytes;
            received += 1;
        }
        let payload = match reply_bytes {
            0 => Bytes::from(payload),
            length => pattern_payload(length),
        };
        Ok(tonic::Response::new(self.reply(payload, received)))
    }

    type BidiStream = ReplyStream;

    async fn bidi(
        &self,
        request: tonic::Request<tonic::Streaming<EchoRequest>>,
    ) -> Result<tonic::Response<ReplyStream>, Status> {
        let service = self.clone();
        // Replies are produced as the stream is polled, so dropping it (a reset) stops
        // everything; no task outlives the call.
        let replies = stream::unfold((request.into_inner(), 0_u64), move |(mut requests, seq)| {
            let service = service.clone();
            async move {
                match requests.message().await {
                    Ok(Some(request)) => {
                        let reply = service.answer(request, seq).await;
                        Some((Ok(reply), (requests, seq + 1)))
                    }
                    Ok(None) => None,
                    Err(status) => Some((Err(status), (requests, seq))),
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(replies)))
    }
}

// === serving ===

/// Starts a gRPC backend on 127.0.0.1 with an ephemeral port; see [`GrpcHandle::addr`].
pub fn spawn_grpc(config: BackendConfig) -> io::Result<GrpcHandle> {
    spawn_grpc_on(SocketAddr::from(([127, 0, 0, 1], 0)), config)
}

/// Starts a gRPC backend on `addr` on its own thread with a current-thread runtime. The
/// port is bound before this returns.
pub fn spawn_grpc_on(addr: SocketAddr, config: BackendConfig) -> io::Result<GrpcHandle> {
    let shared = Arc::new(Shared::new(&config)?);
    let serving = Arc::clone(&shared);
    let (addr, server) = ServerThread::spawn(
        addr,
        format!("grpc-backend-{}", config.name),
        move |listener, stop| serve(listener, serving, stop),
    )?;
    Ok(GrpcHandle {
        addr,
        shared,
        server,
    })
}

/// Runs a gRPC backend on the current thread until SIGTERM or SIGINT, calling `on_ready`
/// with the bound address once it accepts connections and the signal handlers are in place.
pub fn run_grpc_until_signal(
    addr: SocketAddr,
    config: BackendConfig,
    on_ready: impl FnOnce(SocketAddr),
) -> io::Result<()> {
    let shared = Arc::new(Shared::new(&config)?);
    run_server_until_signal(addr, on_ready, move |listener, stop| {
        serve(listener, shared, stop)
    })
}

/// A running gRPC backend. Dropping it stops the backend, like [`GrpcHandle::shutdown`].
#[derive(Debug)]
pub struct GrpcHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: ServerThread,
}

impl GrpcHandle {
    /// The address the backend listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> GrpcStats {
        self.shared.snapshot()
    }

    /// Zeroes the cumulative counters (`requests`, `probes`, `connections_accepted`,
    /// `cancelled`, `h2_connections`) and restarts `max_in_flight` from the current
    /// `in_flight`; the gauges keep counting what is live.
    pub fn reset_stats(&self) {
        self.shared.reset();
    }

    /// Lets every held call ([`HOLD`]) answer, and every later one at once.
    pub fn release_held(&self) {
        self.shared.releases.send_modify(|releases| *releases += 1);
    }

    /// Stops accepting, closes every connection and joins the backend's thread.
    pub fn shutdown(mut self) {
        self.server.stop();
    }
}

/// Accepts connections until `stop` completes.
async fn serve(listener: TcpListener, shared: Arc<Shared>, stop: impl Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut stop => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _peer)) => serve_connection(stream, &shared),
            Err(error) => {
                tracing::warn!(%error, "gRPC test backend failed to accept a connection");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
}

fn serve_connection(stream: TcpStream, shared: &Arc<Shared>) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "could not disable Nagle's algorithm");
    }
    let connection = Arc::new(ConnectionContext {
        shared: Arc::clone(shared),
        spoke_h2: AtomicBool::new(false),
        _open: shared.counters.connection_opened(),
    });
    let max_concurrent_streams = shared.max_concurrent_streams;
    let http2_only = shared.http2_only;
    let service = service_fn(move |request| {
        let connection = Arc::clone(&connection);
        async move { Ok::<_, Infallible>(handle(request, connection).await) }
    });
    tokio::spawn(async move {
        // The auto builder reads the first bytes: the HTTP/2 preface means h2c with prior
        // knowledge, anything else HTTP/1.1.
        // Told HTTP/2 only, it takes the preface or nothing.
        let mut builder = auto::Builder::new(TokioExecutor::new());
        if http2_only {
            builder = builder.http2_only();
        }
        builder
            .http2()
            .max_concurrent_streams(max_concurrent_streams);
        let served = builder
            .serve_connection(TokioIo::new(stream), service)
            .await;
        if let Err(error) = served {
            tracing::debug!(%error, "gRPC test backend connection ended with an error");
        }
    });
}

async fn handle(
    request: Request<Incoming>,
    connection: Arc<ConnectionContext>,
) -> Response<TrackedBody> {
    let shared = &connection.shared;
    let version = request.version();
    let authority = request_authority(&request);
    // What trace context reached the pod, for the tracing tests.
    let traceparent = request.headers().get(TRACEPARENT).cloned();
    if version == Version::HTTP_2 && !connection.spoke_h2.swap(true, Ordering::SeqCst) {
        shared.extra.h2_connections.fetch_add(1, Ordering::SeqCst);
    }
    let mut response = if is_queue_probe(&request) {
        shared.counters.probe_answered();
        text(StatusCode::OK, "queue").map(TrackedBody::untracked)
    } else {
        // Taken before the handler runs, so a handler dropped mid-way (the client reset the
        // stream during a delay) is counted as cancelled and leaves `in_flight`.
        let guard = RequestGuard {
            _in_flight: shared.counters.request_started(),
            extra: Arc::clone(&shared.extra),
            finished: false,
        };
        let response = if is_grpc(&request) {
            grpc(request, shared).await
        } else {
            plain(request, &shared.identity.name).await
        };
        response.map(|body| TrackedBody {
            inner: body,
            guard: Some(guard),
        })
    };
    let headers = response.headers_mut();
    shared.identity.stamp(headers);
    if let Ok(value) = HeaderValue::from_str(&format!("{version:?}")) {
        headers.insert(HTTP_VERSION_HEADER, value);
    }
    if let Some(authority) = authority {
        headers.insert(AUTHORITY_HEADER, authority);
    }
    if let Some(traceparent) = traceparent {
        headers.insert(RECEIVED_TRACEPARENT_HEADER, traceparent);
    }
    response
}

/// The request's `traceparent`, as the pod received it.
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// Where each answer says what `traceparent` its request carried.
pub const RECEIVED_TRACEPARENT_HEADER: HeaderName =
    HeaderName::from_static("x-received-traceparent");

/// What the request was addressed to: HTTP/2's `:authority` (hyper puts it in the URI), else
/// the `Host` header.
fn request_authority(request: &Request<Incoming>) -> Option<HeaderValue> {
    match request.uri().authority() {
        Some(authority) => HeaderValue::from_str(authority.as_str()).ok(),
        None => request.headers().get(HOST).cloned(),
    }
}

fn is_queue_probe(request: &Request<Incoming>) -> bool {
    request
        .headers()
        .get(PROBE_HEADER)
        .is_some_and(|value| value == "queue")
}

fn is_grpc(request: &Request<Incoming>) -> bool {
    request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"))
}

async fn grpc(request: Request<Incoming>, shared: &Shared) -> Response<ResponseBody> {
    let mut echo = shared.echo.clone();
    // tonic's generated server is always ready and never fails: errors become statuses.
    let Ok(()) = std::future::poll_fn(|context| {
        Service::<Request<Incoming>>::poll_ready(&mut echo, context)
    })
    .await;
    let Ok(response) = echo.call(request).await;
    response.map(|body| body.map_err(BoxError::from).boxed_unsync())
}

/// The plain HTTP side: the greeting on `GET /`, the same after a pause on
/// `GET /sleep?ms=N`, the body streamed back on `POST /echo` (no length, ending in a trailer
/// `x-echo-bytes` with its size and one `x-echo-trailer` repeating the request's trailer of that
/// name), 404 elsewhere.
async fn plain(request: Request<Incoming>, name: &str) -> Response<ResponseBody> {
    let path = request.uri().path().to_owned();
    if request.method() == Method::POST && path == "/echo" {
        return echo_body(request.into_body());
    }
    let sleep = (request.method() == Method::GET && path == "/sleep").then(|| {
        request
            .uri()
            .query()
            .and_then(|query| query.strip_prefix("ms="))
            .and_then(|ms| ms.parse::<u32>().ok())
            .unwrap_or(0)
    });
    let head = request.method() == Method::HEAD;
    let greeting = (request.method() == Method::GET || head) && path == "/";
    // Read to the end even though nothing uses it: an HTTP/1.1 connection whose request
    // body was left unread is closed rather than reused, and tests expect keep-alive.
    let mut body = request.into_body();
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            break;
        }
    }
    if let Some(milliseconds) = sleep {
        sleep_ms(milliseconds).await;
    }
    if greeting || sleep.is_some() {
        let greeting = format!("hello from {name}\n");
        if head {
            // The GET's length and no body, as Go's server answers a HEAD (hyper's HTTP/2
            // server would send the body).
            let mut response = text(StatusCode::OK, Bytes::new());
            response
                .headers_mut()
                .insert(CONTENT_LENGTH, HeaderValue::from(greeting.len()));
            return response;
        }
        text(StatusCode::OK, greeting)
    } else {
        text(StatusCode::NOT_FOUND, "no route\n")
    }
}

/// `POST /echo`: the request body's frames back as they come, then the trailers.
fn echo_body(body: Incoming) -> Response<ResponseBody> {
    struct Echoing {
        body: Incoming,
        bytes: u64,
        trailer: Option<HeaderValue>,
        done: bool,
    }
    let frames = stream::unfold(
        Echoing {
            body,
            bytes: 0,
            trailer: None,
            done: false,
        },
        |mut state| async move {
            if state.done {
                return None;
            }
            loop {
                match state.body.frame().await {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => {
                            state.bytes += data.len() as u64;
                            return Some((Ok(Frame::data(data)), state));
                        }
                        Err(frame) => {
                            if let Ok(trailers) = frame.into_trailers() {
                                state.trailer = trailers.get("x-echo-trailer").cloned();
                            }
                        }
                    },
                    Some(Err(error)) => return Some((Err(BoxError::from(error)), state)),
                    None => {
                        let mut trailers = hyper::HeaderMap::new();
                        trailers.insert("x-echo-bytes", HeaderValue::from(state.bytes));
                        if let Some(value) = state.trailer.take() {
                            trailers.insert("x-echo-trailer", value);
                        }
                        state.done = true;
                        return Some((Ok(Frame::trailers(trailers)), state));
                    }
                }
            }
        },
    );
    let body = http_body_util::StreamBody::new(frames).boxed_unsync();
    let mut response = Response::new(body);
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    response
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<ResponseBody> {
    let body = Full::new(body.into())
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

// === clients ===

/// An Echo client speaking h2c (HTTP/2 with prior knowledge) to `addr`, sending `authority`
/// as `:authority` (what the proxy routes on, e.g. `hello-00001.default.svc.cluster.local`),
/// with message limits raised to [`MAX_MESSAGE_SIZE`]. Connects before returning.
pub async fn connect(addr: SocketAddr, authority: &str) -> Result<EchoClient<Channel>, BoxError> {
    let channel = endpoint(addr, authority)?.connect().await?;
    Ok(echo_client(channel))
}

/// Like [`connect`], but connects on the first call (and reconnects after failures), for
/// tests that start the client before the server is reachable.
pub fn connect_lazy(addr: SocketAddr, authority: &str) -> Result<EchoClient<Channel>, BoxError> {
    Ok(echo_client(endpoint(addr, authority)?.connect_lazy()))
}

fn endpoint(addr: SocketAddr, authority: &str) -> Result<Endpoint, BoxError> {
    let origin: Uri = format!("http://{authority}").parse()?;
    Ok(Endpoint::from_shared(format!("http://{addr}"))?.origin(origin))
}

fn echo_client(channel: Channel) -> EchoClient<Channel> {
    EchoClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
}

/// One plain HTTP/2 request over a fresh h2c (prior knowledge) connection: `method path`
/// with `:authority` = `authority` and the given extra headers, response body collected.
/// For checking what protocol reaches the pod (`x-http-version`) and probes over h2c.
pub async fn h2c_request(
    addr: SocketAddr,
    authority: &str,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Response<Bytes>, BoxError> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
    let driver = tokio::spawn(connection);
    let uri: Uri = format!("http://{authority}{path}").parse()?;
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(http_body_util::Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await?.to_bytes();
    drop(sender);
    driver.abort();
    Ok(Response::from_parts(parts, body))
}
