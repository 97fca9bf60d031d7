//! The control thread's HTTP/1.1 client (hyper), for the requests it makes itself over hyper:
//! the relay of a registration to a peer activator, and the queue-proxy's push of its own
//! (`queue_proxy::push`). (Probes do not use it: they speak
//! the revision's protocol through `sources::probe`, HTTP/1 over `kactivator-h1` or h2c over
//! `h2`.) One request per connection, everything under one timeout, the answer's body read up
//! to a limit.

use std::net::SocketAddr;
use std::pin::pin;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderMap, HeaderValue, CONNECTION, HOST};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Largest response head accepted, in bytes (hyper's smallest allowed read buffer).
const HEAD_LIMIT: usize = 8 * 1024;

/// A request to send.
#[derive(Clone, Debug)]
pub struct Call<'a> {
    pub method: Method,
    pub path: &'a str,
    /// The `Host` header; `None`: the peer's address.
    pub authority: Option<&'a str>,
    /// Headers besides `Host` and `Connection: close`, which are always sent.
    pub headers: &'a [(&'static str, &'a str)],
    pub body: Bytes,
}

/// What came back.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    /// The first `body_limit` bytes of the body.
    pub body: Vec<u8>,
    /// The body was longer than the limit and the rest was not read.
    pub body_truncated: bool,
}

/// Sends `call` to `addr` on a fresh connection and reads the answer, at most `body_limit`
/// bytes of its body. Connecting, writing and reading all count against `timeout`; the
/// connection is closed afterwards whatever happened. The error is the reason, for a log line
/// (`connect: Connection refused (os error 111)`, `timed out after 2s`, …).
pub async fn send(
    addr: SocketAddr,
    call: Call<'_>,
    body_limit: usize,
    timeout: Duration,
) -> Result<Answer, String> {
    match tokio::time::timeout(timeout, exchange(addr, call, body_limit)).await {
        Err(_elapsed) => Err(format!("timed out after {timeout:?}")),
        Ok(result) => result,
    }
}

async fn exchange(addr: SocketAddr, call: Call<'_>, body_limit: usize) -> Result<Answer, String> {
    let request = request(addr, call)?;
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|error| format!("connect: {error}"))?;
    // A request is one small write; Nagle would only delay it.
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(HEAD_LIMIT)
        .title_case_headers(true)
        .handshake::<_, Full<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|error| format!("handshake: {}", chain(&error)))?;
    let answer = async move {
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| format!("response: {}", chain(&error)))?;
        read_answer(response, body_limit).await
    };

    // The connection future moves the bytes; it is driven here rather than spawned so that
    // dropping this future (on timeout) closes the socket at once.
    let mut connection = pin!(connection);
    let mut answer = pin!(answer);
    tokio::select! {
        biased;
        answer = &mut answer => answer,
        _ended = &mut connection => {
            // Whatever the connection read is already queued for `answer`, and an error it hit
            // is delivered to `answer` as well, so nothing further needs driving.
            answer.await
        }
    }
}

fn request(addr: SocketAddr, call: Call<'_>) -> Result<Request<Full<Bytes>>, String> {
    let host = match call.authority {
        Some(authority) => HeaderValue::try_from(authority)
            .map_err(|error| format!("host {authority:?}: {error}"))?,
        None => HeaderValue::try_from(addr.to_string())
            .expect("a socket address is printable ASCII without control characters"),
    };
    let mut builder = Request::builder()
        .method(call.method)
        .uri(call.path)
        .header(HOST, host);
    for (name, value) in call.headers {
        builder = builder.header(*name, *value);
    }
    builder
        .header(CONNECTION, "close")
        .body(Full::new(call.body))
        .map_err(|error| format!("request: {error}"))
}

/// Reads the status, the headers and at most `body_limit` bytes of the body.
async fn read_answer(
    response: Response<hyper::body::Incoming>,
    body_limit: usize,
) -> Result<Answer, String> {
    let (parts, mut body) = response.into_parts();
    let mut answer = Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: Vec::new(),
        body_truncated: false,
    };
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| format!("body: {}", chain(&error)))?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        let room = body_limit - answer.body.len();
        if data.len() > room {
            answer.body.extend_from_slice(&data[..room]);
            answer.body_truncated = true;
            break;
        }
        answer.body.extend_from_slice(data);
    }
    Ok(answer)
}

/// An error and its causes, `outer: inner: innermost`; hyper's own message is often only the
/// outer layer ("error reading a body from connection").
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
