//! The exporters: one per applied config, each sending one batch at a time and saying whether
//! the collector took it. OTLP/HTTP and Zipkin post over HTTP/1.1, OTLP/gRPC calls
//! `TraceService/Export` (or, for metrics, `MetricsService/Export`) over HTTP/2 with prior
//! knowledge (no TLS: `endpoint` refuses `https://`), stdout writes lines on the blocking pool.
//! Spans and metrics go through the same OTLP client ([`OtlpClient`]) and the same connection
//! handling ([`Link`]: one connection, reused while the collector keeps it open; a failure
//! drops it and the next export dials again). Nothing here retries or times out: the drivers
//! own the timeout.

use std::fmt;
use std::future::Future;
use std::io::{self, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::header::{CONTENT_TYPE, HOST, TE, USER_AGENT};
use http::{HeaderMap, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kactivator_api::grpc_health;
use kactivator_api::trace::span::FinishedSpan;
use prost::Message;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::encode;
use crate::endpoint::Collector;
use crate::proto::collector::ExportTraceServiceResponse;
use crate::proto::metrics_collector::ExportMetricsServiceResponse;
use crate::{Resource, TraceProtocol, TracingConfig, TracingConfigError};

/// The `User-Agent` the exporters send.
pub const EXPORTER_USER_AGENT: &str = concat!("kactivator/", env!("CARGO_PKG_VERSION"));
/// The most of a collector's answer read: enough for any partial-success message or error
/// text; a longer answer is a protocol error.
pub const RESPONSE_BODY_LIMIT: usize = 64 * 1024;
/// The most of an error answer's text put in a message.
const ERROR_EXCERPT_LIMIT: usize = 256;

const CONTENT_TYPE_PROTOBUF: &str = "application/x-protobuf";
const CONTENT_TYPE_JSON: &str = "application/json";

/// What a collector answered to a batch it took.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Exported {
    /// Spans it said it rejected (OTLP's partial success); the rest were accepted.
    pub rejected: u64,
    /// Why, in its words.
    pub message: String,
    /// The payload's size: the encoded message, the Zipkin body, the stdout lines (before any
    /// HTTP or gRPC framing).
    pub bytes: u64,
}

/// A batch's export failed; its spans are dropped.
#[derive(Debug)]
pub struct ExportError {
    /// Where the batch was going: the collector's URL, or `stdout`.
    pub target: String,
    pub failure: ExportFailure,
}

/// What went wrong with one export.
#[derive(Debug)]
pub enum ExportFailure {
    /// Dialing the collector failed (refused, unreachable, the name did not resolve).
    Connect(io::Error),
    /// The HTTP exchange broke: the connection closed or spoke something else.
    Http(hyper::Error),
    /// The collector answered with an HTTP status that is not a success; `body` is the start
    /// of its answer when it is text.
    Status { status: StatusCode, body: String },
    /// The gRPC call ended with a status other than OK.
    Grpc { code: u32, message: String },
    /// An answer that breaks the protocol (a gRPC answer without `grpc-status`, a body that
    /// does not decode, one longer than [`RESPONSE_BODY_LIMIT`]).
    Protocol(String),
    /// No answer within the export timeout.
    TimedOut(Duration),
    /// Writing the lines to stdout failed.
    Stdout(io::Error),
    /// The previous batch's lines are still being written: stdout is blocked.
    StdoutBusy,
}

impl ExportFailure {
    /// A short name for the cause, fit for a metric label.
    pub const fn label(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connect",
            Self::Http(_) => "http",
            Self::Status { .. } => "status",
            Self::Grpc { .. } => "grpc_status",
            Self::Protocol(_) => "protocol",
            Self::TimedOut(_) => "timeout",
            Self::Stdout(_) | Self::StdoutBusy => "stdout",
        }
    }
}

impl fmt::Display for ExportFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connect(error) => write!(f, "connect: {error}"),
            Self::Http(error) => write!(f, "HTTP: {error}"),
            Self::Status { status, body } if body.is_empty() => write!(f, "answered HTTP {status}"),
            Self::Status { status, body } => write!(f, "answered HTTP {status}: {body}"),
            Self::Grpc { code, message } => write!(
                f,
                "answered gRPC status {code} ({}): {message}",
                grpc_health::code_name(*code)
            ),
            Self::Protocol(what) => f.write_str(what),
            Self::TimedOut(after) => write!(f, "no answer within {after:?}"),
            Self::Stdout(error) => write!(f, "write: {error}"),
            Self::StdoutBusy => f.write_str("still blocked writing the previous batch"),
        }
    }
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "export to {}: {}", self.target, self.failure)
    }
}

impl std::error::Error for ExportError {}

/// Sends batches somewhere; what the driver holds for the config in force.
pub(crate) trait Export: Send + 'static {
    /// Where batches go, for messages: the collector's URL or `stdout`.
    fn target(&self) -> &str;

    /// Sends `spans` on behalf of `resource`.
    fn export(
        &mut self,
        spans: &[FinishedSpan],
        resource: &Resource,
    ) -> impl Future<Output = Result<Exported, ExportFailure>> + Send;
}

/// Where the stdout exporter writes; stdout itself outside tests.
pub(crate) type LineSink = Arc<Mutex<dyn Write + Send>>;

/// The exporter for one config.
pub(crate) enum Exporter {
    Otlp(OtlpClient),
    Zipkin(HttpPost),
    Stdout(StdoutWriter),
}

impl Exporter {
    /// The exporter `config` asks for (`None` when tracing is off), or why it cannot be had.
    /// `timeout` is the driver's export timeout, which the gRPC call announces.
    pub(crate) fn new(
        config: &TracingConfig,
        timeout: Duration,
    ) -> Result<Option<Exporter>, TracingConfigError> {
        config.validate()?;
        let collector = || {
            Collector::parse(&config.protocol, &config.endpoint)
                .map_err(TracingConfigError::Endpoint)
        };
        Ok(match config.protocol {
            TraceProtocol::None => None,
            TraceProtocol::Stdout => Some(Exporter::Stdout(StdoutWriter::new(Arc::new(
                Mutex::new(io::stdout()),
            )))),
            TraceProtocol::HttpProtobuf => Some(Exporter::Otlp(OtlpClient::Http(HttpPost::new(
                collector()?,
                CONTENT_TYPE_PROTOBUF,
            )))),
            TraceProtocol::Grpc => Some(Exporter::Otlp(OtlpClient::Grpc(GrpcClient::new(
                collector()?,
                timeout,
            )))),
            TraceProtocol::Zipkin => Some(Exporter::Zipkin(HttpPost::new(
                collector()?,
                CONTENT_TYPE_JSON,
            ))),
        })
    }
}

impl Export for Exporter {
    fn target(&self) -> &str {
        match self {
            Self::Otlp(client) => client.target(),
            Self::Zipkin(post) => &post.link.collector.url,
            Self::Stdout(_) => "stdout",
        }
    }

    async fn export(
        &mut self,
        spans: &[FinishedSpan],
        resource: &Resource,
    ) -> Result<Exported, ExportFailure> {
        match self {
            Self::Otlp(client) => {
                let message = encode::otlp::request(spans, resource).encode_to_vec();
                let bytes = message.len() as u64;
                let exported = client.export::<ExportTraceServiceResponse>(message).await?;
                Ok(Exported { bytes, ..exported })
            }
            Self::Zipkin(post) => {
                let body = encode::zipkin::body(spans, resource);
                let bytes = body.len() as u64;
                post.post(body).await?;
                Ok(Exported {
                    bytes,
                    ..Exported::default()
                })
            }
            Self::Stdout(writer) => {
                let lines = encode::stdout::lines(spans, resource);
                let bytes = lines.len() as u64;
                let exported = writer.write(lines).await?;
                Ok(Exported { bytes, ..exported })
            }
        }
    }
}

// === OTLP, either transport, either signal ===

/// One OTLP collector over HTTP/1.1 (`application/x-protobuf` posts) or gRPC: what the span
/// exporter and the metrics exporter both send through. The message is encoded by the caller;
/// `R` is the signal's answer, whose partial success says what was rejected.
pub(crate) enum OtlpClient {
    Http(HttpPost),
    Grpc(GrpcClient),
}

impl OtlpClient {
    /// A client for `collector` (as [`Collector::parse`] or [`Collector::parse_metrics`] read
    /// it); `timeout` is announced to a gRPC server.
    pub(crate) fn new(collector: Collector, grpc: bool, timeout: Duration) -> OtlpClient {
        if grpc {
            OtlpClient::Grpc(GrpcClient::new(collector, timeout))
        } else {
            OtlpClient::Http(HttpPost::new(collector, CONTENT_TYPE_PROTOBUF))
        }
    }

    /// The collector's URL, for messages.
    pub(crate) fn target(&self) -> &str {
        match self {
            Self::Http(post) => &post.link.collector.url,
            Self::Grpc(client) => &client.link.collector.url,
        }
    }

    /// Sends one encoded `Export…ServiceRequest` and reads the collector's answer as `R`.
    pub(crate) async fn export<R: OtlpResponse>(
        &mut self,
        message: Vec<u8>,
    ) -> Result<Exported, ExportFailure> {
        match self {
            Self::Http(post) => {
                let answer = post.post(message).await?;
                // otlp*http's clients read a protobuf answer, and fail on one that does not
                // decode; any other answer is taken as a plain success.
                if answer.body.is_empty() || content_type(&answer.headers) != CONTENT_TYPE_PROTOBUF
                {
                    return Ok(Exported::default());
                }
                partial_success::<R>(&answer.body)
            }
            Self::Grpc(client) => partial_success::<R>(&client.call(message).await?),
        }
    }
}

/// A signal's `Export…ServiceResponse`: its partial success says how many items the
/// collector rejected, and why.
pub(crate) trait OtlpResponse: Message + Default {
    fn rejected(self) -> Exported;
}

impl OtlpResponse for ExportTraceServiceResponse {
    fn rejected(self) -> Exported {
        self.partial_success
            .map(|partial| Exported {
                rejected: u64::try_from(partial.rejected_spans).unwrap_or(0),
                message: partial.error_message,
                bytes: 0,
            })
            .unwrap_or_default()
    }
}

impl OtlpResponse for ExportMetricsServiceResponse {
    fn rejected(self) -> Exported {
        self.partial_success
            .map(|partial| Exported {
                rejected: u64::try_from(partial.rejected_data_points).unwrap_or(0),
                message: partial.error_message,
                bytes: 0,
            })
            .unwrap_or_default()
    }
}

fn partial_success<R: OtlpResponse>(message: &[u8]) -> Result<Exported, ExportFailure> {
    let response = R::decode(message)
        .map_err(|error| ExportFailure::Protocol(format!("the answer does not decode: {error}")))?;
    Ok(response.rejected())
}

// === connections ===

/// A connection's sending half, and its task, which ends with it.
struct Connection<S> {
    sender: S,
    _task: AbortOnDrop,
}

/// Aborts the connection's task when the connection is let go, so a collector that never
/// answers holds no socket once its export has timed out.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What differs between an HTTP/1.1 connection and an HTTP/2 one to the exporters: how it is
/// opened. Sending and readiness are hyper's, the same for both.
trait Sender: Sized + Send {
    /// Opens the connection over `io`; the returned task drives it.
    fn handshake(
        io: TokioIo<TcpStream>,
    ) -> impl Future<Output = Result<(Self, JoinHandle<()>), hyper::Error>> + Send;
    fn is_closed(&self) -> bool;
    fn ready(&mut self) -> impl Future<Output = Result<(), hyper::Error>> + Send;
    fn send(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> impl Future<Output = Result<Response<Incoming>, hyper::Error>> + Send;
}

impl Sender for http1::SendRequest<Full<Bytes>> {
    async fn handshake(io: TokioIo<TcpStream>) -> Result<(Self, JoinHandle<()>), hyper::Error> {
        let (sender, connection) = http1::handshake(io).await?;
        // How it ended shows in the exchange that used it.
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok((sender, task))
    }

    fn is_closed(&self) -> bool {
        http1::SendRequest::is_closed(self)
    }

    async fn ready(&mut self) -> Result<(), hyper::Error> {
        http1::SendRequest::ready(self).await
    }

    fn send(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> impl Future<Output = Result<Response<Incoming>, hyper::Error>> + Send {
        self.send_request(request)
    }
}

impl Sender for http2::SendRequest<Full<Bytes>> {
    async fn handshake(io: TokioIo<TcpStream>) -> Result<(Self, JoinHandle<()>), hyper::Error> {
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .handshake(io)
            .await?;
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok((sender, task))
    }

    fn is_closed(&self) -> bool {
        http2::SendRequest::is_closed(self)
    }

    async fn ready(&mut self) -> Result<(), hyper::Error> {
        http2::SendRequest::ready(self).await
    }

    fn send(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> impl Future<Output = Result<Response<Incoming>, hyper::Error>> + Send {
        self.send_request(request)
    }
}

/// A collector's whole answer.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

/// One collector and the connection to it, kept while the collector keeps it open; a failed
/// exchange drops it and the next one dials again.
struct Link<S> {
    collector: Collector,
    connection: Option<Connection<S>>,
}

impl<S: Sender> Link<S> {
    fn new(collector: Collector) -> Self {
        Self {
            collector,
            connection: None,
        }
    }

    /// Sends `request` on the kept connection, or a new one, and reads the whole answer (at
    /// most [`RESPONSE_BODY_LIMIT`]).
    async fn exchange(&mut self, request: Request<Full<Bytes>>) -> Result<Answer, ExportFailure> {
        let mut connection = match self.connection.take() {
            Some(connection) if !connection.sender.is_closed() => connection,
            _ => {
                let io = dial(&self.collector).await?;
                let (sender, task) = S::handshake(io).await.map_err(ExportFailure::Http)?;
                Connection {
                    sender,
                    _task: AbortOnDrop(task),
                }
            }
        };
        connection
            .sender
            .ready()
            .await
            .map_err(ExportFailure::Http)?;
        let response = connection
            .sender
            .send(request)
            .await
            .map_err(ExportFailure::Http)?;
        let (parts, body) = response.into_parts();
        let (body, trailers) = read_body(body).await?;
        // The whole answer was read: the connection can carry the next export.
        self.connection = Some(connection);
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
            trailers,
        })
    }
}

async fn dial(collector: &Collector) -> Result<TokioIo<TcpStream>, ExportFailure> {
    let stream = TcpStream::connect((collector.host.as_str(), collector.port))
        .await
        .map_err(ExportFailure::Connect)?;
    // Small writes (headers, then the body) go out at once.
    stream.set_nodelay(true).map_err(ExportFailure::Connect)?;
    Ok(TokioIo::new(stream))
}

/// Reads an answer's body and trailers, at most [`RESPONSE_BODY_LIMIT`] bytes.
async fn read_body(body: Incoming) -> Result<(Bytes, Option<HeaderMap>), ExportFailure> {
    let collected = Limited::new(body, RESPONSE_BODY_LIMIT)
        .collect()
        .await
        .map_err(|error| ExportFailure::Protocol(format!("reading the answer: {error}")))?;
    let trailers = collected.trailers().cloned();
    Ok((collected.to_bytes(), trailers))
}

/// The start of an error answer, when it is text.
fn excerpt(headers: &HeaderMap, body: &[u8]) -> String {
    let textual = headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/") || value.contains("json"));
    match std::str::from_utf8(body) {
        Ok(text) if textual || headers.get(CONTENT_TYPE).is_none() => {
            text.trim().chars().take(ERROR_EXCERPT_LIMIT).collect()
        }
        _ if body.is_empty() => String::new(),
        _ => format!("({} bytes of {})", body.len(), content_type(headers)),
    }
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("no content type")
}

// === HTTP/1.1 posts: OTLP/HTTP, Zipkin ===

/// Posts bodies of one content type to one collector over HTTP/1.1.
pub(crate) struct HttpPost {
    link: Link<http1::SendRequest<Full<Bytes>>>,
    content_type: &'static str,
}

impl HttpPost {
    fn new(collector: Collector, content_type: &'static str) -> Self {
        Self {
            link: Link::new(collector),
            content_type,
        }
    }

    /// Posts `body`; a 2xx answer is a success.
    async fn post(&mut self, body: Vec<u8>) -> Result<Answer, ExportFailure> {
        let collector = &self.link.collector;
        let request = Request::post(collector.path.as_str())
            .header(HOST, collector.authority.as_str())
            .header(CONTENT_TYPE, self.content_type)
            .header(USER_AGENT, EXPORTER_USER_AGENT)
            .body(Full::new(Bytes::from(body)))
            .map_err(|error| ExportFailure::Protocol(format!("building the request: {error}")))?;
        let answer = self.link.exchange(request).await?;
        if !answer.status.is_success() {
            return Err(ExportFailure::Status {
                status: answer.status,
                body: excerpt(&answer.headers, &answer.body),
            });
        }
        Ok(answer)
    }
}

// === OTLP/gRPC ===

/// Calls a signal's `…Service/Export` on one collector over HTTP/2 with prior knowledge.
pub(crate) struct GrpcClient {
    link: Link<http2::SendRequest<Full<Bytes>>>,
    uri: Uri,
    /// `grpc-timeout`: the export timeout, in milliseconds.
    timeout: String,
}

impl GrpcClient {
    fn new(collector: Collector, timeout: Duration) -> Self {
        // Collector::parse checked the authority and the method's path is a constant.
        let uri = Uri::try_from(format!("http://{}{}", collector.authority, collector.path))
            .expect("collector URI is valid");
        // At most 8 digits (the gRPC spec); 99999999 ms is over a day.
        let millis = timeout.as_millis().clamp(1, 99_999_999);
        Self {
            link: Link::new(collector),
            uri,
            timeout: format!("{millis}m"),
        }
    }

    /// Calls the method with `message`; the answer's message when the status is OK.
    async fn call(&mut self, message: Vec<u8>) -> Result<Bytes, ExportFailure> {
        let request = Request::post(self.uri.clone())
            .header(CONTENT_TYPE, grpc_health::CONTENT_TYPE)
            .header(TE, grpc_health::TRAILERS)
            .header("grpc-timeout", self.timeout.as_str())
            .header(USER_AGENT, EXPORTER_USER_AGENT)
            .body(Full::new(grpc_frame(&message)))
            .map_err(|error| ExportFailure::Protocol(format!("building the request: {error}")))?;
        let answer = self.link.exchange(request).await?;
        if answer.status != StatusCode::OK {
            return Err(ExportFailure::Status {
                status: answer.status,
                body: String::new(),
            });
        }
        // A trailers-only answer carries its status in the headers, and no message.
        if let Some(status) = grpc_status(&answer.headers)? {
            return status.map(|()| Bytes::new());
        }
        let status = answer
            .trailers
            .as_ref()
            .map(grpc_status)
            .transpose()?
            .flatten()
            .ok_or_else(|| {
                ExportFailure::Protocol("the gRPC answer ended without grpc-status".to_owned())
            })?;
        status?;
        grpc_message(answer.body)
    }
}

/// gRPC's length-prefixed message: not compressed, 4 bytes of length, the message.
fn grpc_frame(message: &[u8]) -> Bytes {
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.push(0);
    // Batches are at most a few hundred kilobytes: far below 4 GiB.
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    Bytes::from(frame)
}

/// The one message of a unary answer (an empty body is an empty message).
fn grpc_message(mut body: Bytes) -> Result<Bytes, ExportFailure> {
    if body.is_empty() {
        return Ok(body);
    }
    if body.len() < 5 {
        return Err(ExportFailure::Protocol(format!(
            "a gRPC message prefix of {} bytes",
            body.len()
        )));
    }
    let compressed = body.get_u8();
    let len = body.get_u32() as usize;
    if compressed != 0 {
        return Err(ExportFailure::Protocol(
            "a compressed gRPC answer, though none was offered".to_owned(),
        ));
    }
    if body.len() != len {
        return Err(ExportFailure::Protocol(format!(
            "a gRPC message of {} bytes announced as {len}",
            body.len()
        )));
    }
    Ok(body)
}

/// `grpc-status` (and `grpc-message`) from `headers`: `None` when absent, `Some(Ok)` for
/// OK, `Some(Err)` for any other status.
fn grpc_status(headers: &HeaderMap) -> Result<Option<Result<(), ExportFailure>>, ExportFailure> {
    let Some(value) = headers.get(grpc_health::STATUS) else {
        return Ok(None);
    };
    let code = grpc_health::parse_status(value.as_bytes())
        .ok_or_else(|| ExportFailure::Protocol(format!("grpc-status {value:?}")))?;
    if code == 0 {
        return Ok(Some(Ok(())));
    }
    let message = headers
        .get(grpc_health::MESSAGE)
        .map(|value| percent_decode(value.as_bytes()))
        .unwrap_or_default();
    Ok(Some(Err(ExportFailure::Grpc { code, message })))
}

/// `grpc-message` is percent-encoded UTF-8.
fn percent_decode(value: &[u8]) -> String {
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (value[i], value.get(i + 1), value.get(i + 2)) {
            (b'%', Some(&high), Some(&low)) if hex(high).is_some() && hex(low).is_some() => {
                let (Some(high), Some(low)) = (hex(high), hex(low)) else {
                    unreachable!("checked above")
                };
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

// === stdout ===

/// Writes lines to stdout on the blocking pool, so a stdout that blocks never stalls the
/// control thread; while one batch is still being written the next fails at once, so at most
/// one batch waits on stdout.
pub(crate) struct StdoutWriter {
    sink: LineSink,
    writing: Option<JoinHandle<io::Result<()>>>,
}

impl StdoutWriter {
    pub(crate) fn new(sink: LineSink) -> Self {
        Self {
            sink,
            writing: None,
        }
    }

    async fn write(&mut self, lines: Vec<u8>) -> Result<Exported, ExportFailure> {
        if self
            .writing
            .as_ref()
            .is_some_and(|write| !write.is_finished())
        {
            return Err(ExportFailure::StdoutBusy);
        }
        let sink = Arc::clone(&self.sink);
        let write = self.writing.insert(tokio::task::spawn_blocking(move || {
            let mut sink = sink.lock().unwrap_or_else(PoisonError::into_inner);
            sink.write_all(&lines)?;
            sink.flush()
        }));
        let written = write.await;
        // Reached only when the write ended; a timeout leaves `writing` set for the check above.
        self.writing = None;
        match written {
            Ok(Ok(())) => Ok(Exported::default()),
            Ok(Err(error)) => Err(ExportFailure::Stdout(error)),
            Err(join) => Err(ExportFailure::Stdout(io::Error::other(join))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::fixtures;

    #[test]
    fn grpc_frames_carry_a_five_byte_prefix() {
        let frame = grpc_frame(b"abc");
        assert_eq!(&frame[..], b"\0\0\0\0\x03abc");
        assert_eq!(grpc_message(frame).unwrap(), Bytes::from_static(b"abc"));
        assert_eq!(grpc_message(Bytes::new()).unwrap(), Bytes::new());
        assert!(grpc_message(Bytes::from_static(b"\0\0\0\0\x09abc")).is_err());
        assert!(grpc_message(Bytes::from_static(b"\x01\0\0\0\x03abc")).is_err());
    }

    #[test]
    fn grpc_status_and_message_are_read_from_headers() {
        let mut headers = HeaderMap::new();
        assert!(grpc_status(&headers).unwrap().is_none());
        headers.insert("grpc-status", "0".parse().unwrap());
        assert!(matches!(grpc_status(&headers), Ok(Some(Ok(())))));
        headers.insert("grpc-status", "14".parse().unwrap());
        headers.insert(
            "grpc-message",
            "collector%20is%20down%3A 100%25".parse().unwrap(),
        );
        let failure = grpc_status(&headers).unwrap().unwrap().unwrap_err();
        assert_eq!(
            failure.to_string(),
            "answered gRPC status 14 (UNAVAILABLE): collector is down: 100%"
        );
        headers.insert("grpc-status", "OK".parse().unwrap());
        assert!(grpc_status(&headers).is_err());
    }

    #[test]
    fn partial_success_counts_rejected_spans_and_data_points() {
        use crate::proto::collector::ExportTracePartialSuccess;
        use crate::proto::metrics_collector::ExportMetricsPartialSuccess;
        let answer = ExportTraceServiceResponse {
            partial_success: Some(ExportTracePartialSuccess {
                rejected_spans: 2,
                error_message: "too old".into(),
            }),
        };
        let exported =
            partial_success::<ExportTraceServiceResponse>(&answer.encode_to_vec()).unwrap();
        assert_eq!(exported.rejected, 2);
        assert_eq!(exported.message, "too old");
        let answer = ExportMetricsServiceResponse {
            partial_success: Some(ExportMetricsPartialSuccess {
                rejected_data_points: 3,
                error_message: "unknown unit".into(),
            }),
        };
        let exported =
            partial_success::<ExportMetricsServiceResponse>(&answer.encode_to_vec()).unwrap();
        assert_eq!(exported.rejected, 3);
        assert_eq!(exported.message, "unknown unit");
        assert_eq!(
            partial_success::<ExportTraceServiceResponse>(&[]).unwrap(),
            Exported::default()
        );
        assert!(partial_success::<ExportMetricsServiceResponse>(&[0xff, 0xff]).is_err());
    }

    #[test]
    fn https_and_bare_host_port_endpoints_are_refused_when_applied() {
        let config = TracingConfig {
            protocol: TraceProtocol::Grpc,
            endpoint: "https://collector:4317".into(),
            sampling_rate: 1.0,
        };
        let error = Exporter::new(&config, Duration::from_secs(10))
            .err()
            .unwrap();
        assert!(matches!(
            error,
            TracingConfigError::Endpoint(crate::EndpointError::Tls { .. })
        ));
    }

    #[tokio::test]
    async fn stdout_lines_reach_the_sink() {
        let sink = Arc::new(Mutex::new(Vec::<u8>::new()));
        let mut writer = StdoutWriter::new(sink.clone());
        let lines = encode::stdout::lines(&fixtures::spans(), &fixtures::resource());
        writer.write(lines.clone()).await.unwrap();
        assert_eq!(*sink.lock().unwrap(), lines);
    }
}
