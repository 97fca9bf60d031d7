//! The control thread's HTTP/1.1 client (hyper), for the requests it makes itself over hyper:
//! the relay of a registration to a peer activator, and the queue-proxy's push of its own
//! (`queue_proxy::push`). (Probes do not use it: they speak
//! the revision's protocol through `sources::probe`, HTTP/1 over `kactivator-h1` or h2c over
//! `h2`.) One request per connection ([`send`]), or one connection kept for many
//! ([`KeptConnection`]: KEDA's HTTP add-on role asks each other replica for its counts ten
//! times a second); everything under one timeout, the answer's body read up to a limit.

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
    let request = request(addr, call, false)?;
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

/// A connection to one server kept open between calls (HTTP/1.1 keep-alive), so that a call
/// made ten times a second is not a connection made ten times a second. It is made again when
/// it fails, when a call timed out on it, or when an answer was longer than the limit (the rest
/// was not read, so the connection is out of step).
pub struct KeptConnection {
    addr: SocketAddr,
    sender: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
    /// Connections made so far.
    made: u64,
}

impl KeptConnection {
    pub fn new(addr: SocketAddr) -> KeptConnection {
        KeptConnection {
            addr,
            sender: None,
            made: 0,
        }
    }

    /// How many connections this has made.
    pub fn connections_made(&self) -> u64 {
        self.made
    }

    /// Sends `call` on the kept connection, or on a new one; everything under `timeout`. A
    /// kept connection the server has closed since the last call is replaced and the call made
    /// once more, within the same timeout.
    pub async fn send(
        &mut self,
        call: Call<'_>,
        body_limit: usize,
        timeout: Duration,
    ) -> Result<Answer, String> {
        let result = tokio::time::timeout(timeout, async {
            if self.sender.is_some() {
                match self.exchange(call.clone(), body_limit).await {
                    Ok(answer) => return Ok(answer),
                    // The server closed it while it was idle: once more on a new one.
                    Err(_) => self.sender = None,
                }
            }
            self.exchange(call, body_limit).await
        })
        .await;
        let result = result.unwrap_or_else(|_elapsed| Err(format!("timed out after {timeout:?}")));
        match &result {
            Ok(answer) if !answer.body_truncated => {}
            _ => self.sender = None,
        }
        result
    }

    async fn exchange(&mut self, call: Call<'_>, body_limit: usize) -> Result<Answer, String> {
        let request = request(self.addr, call, true)?;
        if self.sender.is_none() {
            let stream = TcpStream::connect(self.addr)
                .await
                .map_err(|error| format!("connect: {error}"))?;
            let _ = stream.set_nodelay(true);
            let (sender, connection) = hyper::client::conn::http1::Builder::new()
                .max_buf_size(HEAD_LIMIT)
                .title_case_headers(true)
                .handshake::<_, Full<Bytes>>(TokioIo::new(stream))
                .await
                .map_err(|error| format!("handshake: {}", chain(&error)))?;
            // Moves the bytes until the sender is dropped or the server closes; then ends.
            tokio::spawn(connection);
            self.sender = Some(sender);
            self.made += 1;
        }
        let sender = self.sender.as_mut().expect("made above");
        sender
            .ready()
            .await
            .map_err(|error| format!("connection: {}", chain(&error)))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| format!("response: {}", chain(&error)))?;
        read_answer(response, body_limit).await
    }
}

/// The request of `call` to `addr`; with `Connection: close` unless the connection is `kept`.
fn request(addr: SocketAddr, call: Call<'_>, kept: bool) -> Result<Request<Full<Bytes>>, String> {
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
    if !kept {
        builder = builder.header(CONNECTION, "close");
    }
    builder
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use hyper::service::service_fn;

    use super::*;

    /// A server that answers `/` with `body`, counting the connections it accepts; with
    /// `close`, it closes each connection after one answer.
    async fn server(body: &'static str, close: bool) -> (SocketAddr, Arc<AtomicU64>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicU64::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                counted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let service = service_fn(move |_request| async move {
                        let mut response =
                            Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                        if close {
                            response
                                .headers_mut()
                                .insert(CONNECTION, HeaderValue::from_static("close"));
                        }
                        Ok::<_, std::convert::Infallible>(response)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, accepted)
    }

    fn get() -> Call<'static> {
        Call {
            method: Method::GET,
            path: "/",
            authority: None,
            headers: &[],
            body: Bytes::new(),
        }
    }

    #[tokio::test]
    async fn a_kept_connection_serves_every_call_and_is_made_again_when_it_cannot() {
        let timeout = Duration::from_secs(5);
        let (addr, accepted) = server("counts", false).await;
        let mut kept = KeptConnection::new(addr);
        for _ in 0..10 {
            let answer = kept.send(get(), 64, timeout).await.unwrap();
            assert_eq!(
                (answer.status, answer.body.as_slice()),
                (200, &b"counts"[..])
            );
        }
        assert_eq!(kept.connections_made(), 1);
        assert_eq!(accepted.load(Ordering::Relaxed), 1);

        // An answer longer than the limit leaves the connection out of step: a new one next.
        let truncated = kept.send(get(), 3, timeout).await.unwrap();
        assert!(truncated.body_truncated);
        kept.send(get(), 64, timeout).await.unwrap();
        assert_eq!(kept.connections_made(), 2);

        // A server that closes after each answer: every call still answered, on a new one.
        let (addr, accepted) = server("once", true).await;
        let mut kept = KeptConnection::new(addr);
        for _ in 0..3 {
            let answer = kept.send(get(), 64, timeout).await.unwrap();
            assert_eq!(answer.body, b"once");
        }
        assert_eq!(accepted.load(Ordering::Relaxed), 3);

        // Nothing listening: an error naming the connect, every time.
        let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = gone.local_addr().unwrap();
        drop(gone);
        let mut kept = KeptConnection::new(addr);
        let error = kept.send(get(), 64, timeout).await.unwrap_err();
        assert!(error.starts_with("connect:"), "{error}");
    }
}
