//! A blocking HTTP/1.1 client that shows exactly what went over the wire (chunked or not,
//! trailers, connection close), which a full client would hide: testkit's raw HTTP/1 client
//! with request helpers, failing the test on any error.

#![allow(dead_code)] // each test binary uses a different subset

use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use kactivator_testkit::raw_http1;

/// Upper bound on any single read, so a broken backend fails a test instead of hanging it.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A response as testkit's raw HTTP/1 client reads it.
pub use raw_http1::Response;

/// One client connection: testkit's raw HTTP/1 client, whose errors fail the test.
pub struct Connection {
    inner: raw_http1::Connection<TcpStream>,
}

impl Connection {
    pub fn open(addr: SocketAddr) -> Self {
        let inner = raw_http1::Connection::connect_with_timeout(addr, READ_TIMEOUT)
            .unwrap_or_else(|error| panic!("connect to backend {addr}: {error}"));
        Self { inner }
    }

    /// Writes raw bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        self.inner
            .send(bytes)
            .unwrap_or_else(|error| panic!("write to backend: {error}"));
    }

    /// Sends a request with a Content-Length body (omitted when empty and bodyless).
    pub fn send(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: backend\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if !body.is_empty() || method == "POST" || method == "PUT" {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        self.write(head.as_bytes());
        self.write(body);
    }

    /// Sends a request and reads its response.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        self.send(method, path, headers, body);
        self.read_response(method == "HEAD")
    }

    pub fn get(&mut self, path: &str) -> Response {
        self.request("GET", path, &[], &[])
    }

    /// Reads the status line and headers, leaving the body unread.
    pub fn read_head(&mut self) -> (u16, Vec<(String, String)>) {
        let head = self
            .inner
            .read_head()
            .unwrap_or_else(|error| panic!("{error}"));
        (head.status, head.headers)
    }

    pub fn read_response(&mut self, head_request: bool) -> Response {
        let method = if head_request { "HEAD" } else { "GET" };
        self.inner
            .read_response_to(method)
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// The next chunk's data, or `None` at the terminating zero-size chunk (whose
    /// trailers are left unread).
    pub fn read_chunk(&mut self) -> Option<Vec<u8>> {
        self.inner
            .read_chunk()
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// Reads the trailer section that follows the terminating chunk.
    pub fn read_trailers(&mut self) -> Vec<(String, String)> {
        self.inner
            .read_trailers()
            .unwrap_or_else(|error| panic!("{error}"))
    }

    pub fn read_exact_bytes(&mut self, length: usize) -> Vec<u8> {
        self.inner
            .read_exact_bytes(length)
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// Reads until the peer closes its write side.
    pub fn read_to_end(&mut self) -> Vec<u8> {
        self.inner
            .read_to_close()
            .unwrap_or_else(|error| panic!("{error}"))
    }

    pub fn shutdown_write(&mut self) {
        self.inner.stream().shutdown(Shutdown::Write).unwrap();
    }
}

/// A plain GET on a fresh connection.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    Connection::open(addr).get(path)
}
