//! The h2c mode (`--h2`): HTTP/2 over cleartext TCP with prior knowledge, `--connections C`
//! connections each carrying up to `--streams M` requests at once, a GET or a gRPC unary call.
//!
//! One thread runs a current-thread tokio runtime (the `h2` crate needs tokio's I/O traits), so
//! the generator costs one core at most, as `h2load -t1` does, and the caller pins it. Every
//! stream slot is a closed loop: it sends a request, waits for the whole response (body and
//! trailers), records the round trip and sends the next. A connection's slots share its request
//! budget, so a fast slot takes more of it than a slow one, and when the connection breaks the
//! slots end, the connection is opened again and new slots start while budget is left.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST, TE};
use http::{HeaderMap, Method, Request, StatusCode, Uri};
use tokio::net::TcpStream;
use tokio::task::{spawn_local, LocalSet};

use crate::{Limit, Tally, Target};

/// The body `--grpc` sends without `--data`: a gRPC frame (flag 0, length 0) holding the empty
/// message, which every protobuf request type accepts.
const EMPTY_GRPC_FRAME: [u8; 5] = [0; 5];

/// The receive window of every stream and of the connection, in bytes: 2^30 - 1, as
/// `h2load`'s default (`-w 30 -W 30`), so the server never waits for a WINDOW_UPDATE and the
/// client sends almost none.
const RECEIVE_WINDOW: u32 = (1 << 30) - 1;

/// Request headers HTTP/2 forbids (RFC 9113 §8.2.2); the `h2` crate refuses a request that
/// carries one, so they are refused when the arguments are read instead.
const CONNECTION_SPECIFIC: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// What `--h2` adds to the arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2Options {
    /// Requests in flight at once on each connection (`--streams`, default 1).
    pub streams: usize,
    /// The request body (`--data FILE`), sent as is with a POST; `None` sends a GET without
    /// body (or, with `grpc`, the empty gRPC message).
    pub body: Option<Vec<u8>>,
    /// `--grpc`: send a gRPC unary call (POST, `content-type: application/grpc`,
    /// `te: trailers`) and count it a success only when it ends with `grpc-status: 0`.
    pub grpc: bool,
}

/// One request, built once and copied for every stream.
#[derive(Debug)]
pub struct Exchange {
    method: Method,
    /// Absolute, so the `h2` crate can fill in `:scheme` and `:authority`.
    uri: Uri,
    headers: HeaderMap,
    body: Option<Bytes>,
    grpc: bool,
}

impl Exchange {
    /// Builds the request from the URL, the `--header` lines and the h2 options. A `Host`
    /// header becomes the `:authority` (HTTP/2 has no Host line, and a proxy that routes on
    /// the authority would not see it); names are lower-cased as HTTP/2 requires.
    pub fn new(
        target: &Target,
        header_lines: &[String],
        options: &H2Options,
    ) -> Result<Self, String> {
        let mut authority = target.authority.clone();
        let mut headers = HeaderMap::new();
        let body = match (&options.body, options.grpc) {
            (Some(body), _) => Some(Bytes::from(body.clone())),
            (None, true) => Some(Bytes::from_static(&EMPTY_GRPC_FRAME)),
            (None, false) => None,
        };
        if options.grpc {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert(TE, HeaderValue::from_static("trailers"));
        }
        for line in header_lines {
            // parse_args only lets `Name: value` lines through.
            let (name, value) = line.split_once(':').unwrap_or((line, ""));
            let (name, value) = (name.trim(), value.trim());
            let name = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                .map_err(|_| format!("--header {line:?}: not a valid header name"))?;
            if name == HOST {
                authority = value.to_string();
                continue;
            }
            if CONNECTION_SPECIFIC.contains(&name.as_str()) || (name == TE && value != "trailers") {
                return Err(format!(
                    "--header {line:?}: HTTP/2 forbids this connection-specific header"
                ));
            }
            let value = HeaderValue::from_str(value)
                .map_err(|_| format!("--header {line:?}: not a valid header value"))?;
            headers.insert(name, value);
        }
        let uri = Uri::try_from(format!("http://{authority}{}", target.path))
            .map_err(|e| format!("request URI http://{authority}{}: {e}", target.path))?;
        Ok(Self {
            method: if body.is_some() {
                Method::POST
            } else {
                Method::GET
            },
            uri,
            headers,
            body,
            grpc: options.grpc,
        })
    }

    /// A fresh copy of the request head (`http::Request` is not `Clone`).
    fn request(&self) -> Request<()> {
        let mut request = Request::new(());
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();
        request
    }

    /// Sends one request on `sender` and reads the whole response.
    async fn send(&self, sender: &mut SendRequest<Bytes>) -> Result<(), Failure> {
        std::future::poll_fn(|cx| sender.poll_ready(cx))
            .await
            .map_err(|e| Failure::Connection(format!("connection: {e}")))?;
        let (response, mut request_body) = sender
            .send_request(self.request(), self.body.is_none())
            .map_err(|e| Failure::Connection(format!("sending the request: {e}")))?;
        if let Some(body) = &self.body {
            request_body
                .send_data(body.clone(), true)
                .map_err(|e| Failure::Stream(format!("sending the body: {e}")))?;
        }
        let response = response
            .await
            .map_err(|e| Failure::Stream(format!("waiting for the response: {e}")))?;
        let (head, mut body) = response.into_parts();
        if head.status != StatusCode::OK {
            return Err(Failure::Stream(format!(
                "answered status {}",
                head.status.as_u16()
            )));
        }
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| Failure::Stream(format!("reading the body: {e}")))?;
            // Hand the window back, or a body longer than the window would stall the stream.
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        let trailers = body
            .trailers()
            .await
            .map_err(|e| Failure::Stream(format!("reading the trailers: {e}")))?;
        if self.grpc {
            // A call that fails before any message may answer "trailers-only": grpc-status in
            // the response head.
            let fields = trailers.as_ref().unwrap_or(&head.headers);
            match fields.get("grpc-status") {
                Some(status) if status == "0" => {}
                Some(status) => {
                    let message = fields
                        .get("grpc-message")
                        .and_then(|m| m.to_str().ok())
                        .unwrap_or("");
                    return Err(Failure::Stream(format!(
                        "grpc-status {} {message:?}",
                        String::from_utf8_lossy(status.as_bytes())
                    )));
                }
                None => return Err(Failure::Stream("no grpc-status in the trailers".into())),
            }
        }
        Ok(())
    }
}

/// Why a request failed, and whether its connection is still usable.
enum Failure {
    /// This stream failed (a status other than 200, a reset, a bad gRPC status); the connection
    /// carries on.
    Stream(String),
    /// The connection is gone (closed, GOAWAY, a protocol error): open another.
    Connection(String),
}

/// The request budget one connection's stream slots share.
enum Share {
    /// This many requests left to send.
    Count(Cell<u64>),
    /// Send until this moment.
    Until(Instant),
}

impl Share {
    fn new(limit: Limit) -> Self {
        match limit {
            Limit::Count(count) => Share::Count(Cell::new(count)),
            Limit::Until(deadline) => Share::Until(deadline),
        }
    }

    /// Whether another request may be sent.
    fn more(&self) -> bool {
        match self {
            Share::Count(left) => left.get() > 0,
            Share::Until(deadline) => Instant::now() < *deadline,
        }
    }

    /// Claims one request; false when the budget is spent.
    fn take(&self) -> bool {
        match self {
            Share::Count(left) => match left.get() {
                0 => false,
                n => {
                    left.set(n - 1);
                    true
                }
            },
            Share::Until(deadline) => Instant::now() < *deadline,
        }
    }
}

/// Runs every connection of the h2c mode to the end of its budget on one thread and returns
/// what they saw together.
pub fn run(
    addr: SocketAddr,
    exchange: Exchange,
    limits: Vec<Limit>,
    streams: usize,
    timeout: Duration,
    latency: bool,
) -> Tally {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            let mut tally = Tally::default();
            tally.record_error(format!("starting the tokio runtime: {e}"));
            return tally;
        }
    };
    let exchange = Rc::new(exchange);
    LocalSet::new().block_on(&runtime, async move {
        let connections: Vec<_> = limits
            .into_iter()
            .map(|limit| {
                let slot = Slot {
                    addr,
                    exchange: Rc::clone(&exchange),
                    share: Rc::new(Share::new(limit)),
                    timeout,
                    latency,
                };
                spawn_local(run_connection(slot, streams))
            })
            .collect();
        let mut total = Tally::default();
        for connection in connections {
            match connection.await {
                Ok(tally) => total.merge(tally),
                Err(e) => total.record_error(format!("connection task: {e}")),
            }
        }
        total
    })
}

/// What every stream slot of one connection shares.
#[derive(Clone)]
struct Slot {
    addr: SocketAddr,
    exchange: Rc<Exchange>,
    share: Rc<Share>,
    timeout: Duration,
    latency: bool,
}

/// Opens the connection, runs `streams` slots on it until the budget is spent, and opens it
/// again whenever it breaks with budget left. A failed connect counts as one failed request,
/// as in the HTTP/1 mode.
async fn run_connection(slot: Slot, streams: usize) -> Tally {
    let mut tally = Tally::default();
    while slot.share.more() {
        let sender = match connect(slot.addr, slot.timeout).await {
            Ok(sender) => sender,
            Err(message) => {
                slot.share.take();
                tally.record_error(format!("{}: {message}", slot.addr));
                continue;
            }
        };
        let slots: Vec<_> = (0..streams)
            .map(|_| spawn_local(run_stream(slot.clone(), sender.clone())))
            .collect();
        // Once the slots drop theirs, the connection task sends GOAWAY and ends.
        drop(sender);
        for handle in slots {
            match handle.await {
                Ok(slot_tally) => tally.merge(slot_tally),
                Err(e) => tally.record_error(format!("stream task: {e}")),
            }
        }
    }
    tally
}

/// One stream slot: requests one after another until the budget is spent or the connection
/// breaks.
async fn run_stream(slot: Slot, mut sender: SendRequest<Bytes>) -> Tally {
    let mut tally = Tally::default();
    while slot.share.take() {
        let started = Instant::now();
        match tokio::time::timeout(slot.timeout, slot.exchange.send(&mut sender)).await {
            Ok(Ok(())) => {
                tally.ok += 1;
                if slot.latency {
                    let nanos = started.elapsed().as_nanos();
                    tally.latencies.record(nanos);
                }
            }
            Ok(Err(Failure::Stream(message))) => {
                tally.record_error(format!("{}: {message}", slot.addr));
            }
            Ok(Err(Failure::Connection(message))) => {
                tally.record_error(format!("{}: {message}", slot.addr));
                break;
            }
            // Dropping the exchange resets the stream; the connection may still be fine.
            Err(_) => tally.record_error(format!(
                "{}: no whole response within {:?}",
                slot.addr, slot.timeout
            )),
        }
    }
    tally
}

/// Connects, sends the HTTP/2 preface and starts the task that drives the connection.
async fn connect(addr: SocketAddr, timeout: Duration) -> Result<SendRequest<Bytes>, String> {
    let tcp = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| format!("connect: no answer within {timeout:?}"))?
        .map_err(|e| format!("connect: {e}"))?;
    tcp.set_nodelay(true)
        .map_err(|e| format!("setting TCP_NODELAY: {e}"))?;
    let (sender, connection) = tokio::time::timeout(
        timeout,
        h2::client::Builder::new()
            .enable_push(false)
            .initial_window_size(RECEIVE_WINDOW)
            .initial_connection_window_size(RECEIVE_WINDOW)
            .handshake::<_, Bytes>(tcp),
    )
    .await
    .map_err(|_| format!("HTTP/2 handshake: no answer within {timeout:?}"))?
    .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    // Its error, if any, reaches the slots through their next request.
    spawn_local(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

#[cfg(test)]
mod tests;
