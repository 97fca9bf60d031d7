//! A minimal blocking HTTP/1.1 keep-alive client for the scenarios: one request in flight per
//! connection, each response read whole by testkit's raw HTTP/1 client (`raw_http1`), which
//! frames bodies by `Content-Length`, chunked or close and fails on anything malformed, so a
//! scenario never counts a response it misread.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use kactivator_testkit::raw_http1;

/// `GET path` naming revision `default/<revision>` through the routing headers.
pub fn get_request(path: &str, revision: &str) -> Vec<u8> {
    get_request_with(path, revision, "")
}

/// [`get_request`] with extra header lines, each ending in `\r\n` (e.g. `"K-Tenant: a\r\n"`).
pub fn get_request_with(path: &str, revision: &str, headers: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: scenario\r\nKnative-Serving-Namespace: default\r\n\
         Knative-Serving-Revision: {revision}\r\n{headers}\r\n"
    )
    .into_bytes()
}

/// One keep-alive connection.
pub struct Conn {
    connection: raw_http1::Connection,
}

/// A response read off a connection; the body is discarded.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// The first line of the body, for error messages.
    pub body_start: String,
}

impl Conn {
    /// Connects; `timeout` bounds the connect and then every read and write.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Conn> {
        let connection =
            raw_http1::Connection::connect_with_timeout(addr, timeout).map_err(io_error)?;
        Ok(Conn { connection })
    }

    /// Sends `request` and reads the whole response.
    pub fn roundtrip(&mut self, request: &[u8]) -> io::Result<Response> {
        self.send(request)?;
        self.read_response()
    }

    /// Writes `request` without waiting for its response ([`Conn::read_response`] reads it).
    pub fn send(&mut self, request: &[u8]) -> io::Result<()> {
        self.connection.send(request).map_err(io_error)
    }

    /// Reads one whole response.
    pub fn read_response(&mut self) -> io::Result<Response> {
        let response = self.connection.read_response().map_err(io_error)?;
        let body_start = String::from_utf8_lossy(&response.body)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        Ok(Response {
            status: response.status,
            body_start,
        })
    }
}

/// The raw client's error as an I/O error of the matching kind, its message kept.
pub fn io_error(error: raw_http1::Error) -> io::Error {
    let kind = match &error.kind {
        raw_http1::ErrorKind::Connect(inner)
        | raw_http1::ErrorKind::Send(inner)
        | raw_http1::ErrorKind::Read(inner) => inner.kind(),
        raw_http1::ErrorKind::Timeout(_) => io::ErrorKind::TimedOut,
        raw_http1::ErrorKind::Closed => io::ErrorKind::UnexpectedEof,
        raw_http1::ErrorKind::Malformed(_) => io::ErrorKind::InvalidData,
    };
    io::Error::new(kind, error.to_string())
}
