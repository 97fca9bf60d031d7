//! A minimal blocking HTTP/1.1 keep-alive client for the scenarios: one request in flight per
//! connection, responses framed by `Content-Length` (what both test backends send and kactivator
//! relays). Anything else is an error, so a scenario never counts a response it misread.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Largest response head accepted.
const MAX_HEAD: usize = 16 * 1024;

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
    stream: TcpStream,
    buf: Vec<u8>,
}

/// A response read off a connection; the body is discarded.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// The first line of the body, for error messages.
    pub body_start: String,
}

impl Conn {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(4096),
        })
    }

    /// Sends `request` and reads the whole response.
    pub fn roundtrip(&mut self, request: &[u8]) -> io::Result<Response> {
        self.send(request)?;
        self.read_response()
    }

    /// Writes `request` without waiting for its response ([`Conn::read_response`] reads it).
    pub fn send(&mut self, request: &[u8]) -> io::Result<()> {
        self.stream.write_all(request)
    }

    /// Reads one whole response.
    pub fn read_response(&mut self) -> io::Result<Response> {
        let head_end = loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                break end + 4;
            }
            if self.buf.len() > MAX_HEAD {
                return Err(io::Error::other("response head too large"));
            }
            self.fill()?;
        };
        let head = std::str::from_utf8(&self.buf[..head_end])
            .map_err(|_| io::Error::other("response head is not UTF-8"))?;
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| io::Error::other(format!("bad status line: {:.60}", head)))?;
        let mut length = None;
        for line in head.split("\r\n").skip(1) {
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse::<usize>().ok();
                } else if name.eq_ignore_ascii_case("transfer-encoding") {
                    return Err(io::Error::other(
                        "chunked response (the scenario client reads Content-Length only)",
                    ));
                }
            }
        }
        let length = length.ok_or_else(|| io::Error::other("response without Content-Length"))?;
        while self.buf.len() < head_end + length {
            self.fill()?;
        }
        let body = &self.buf[head_end..head_end + length];
        let body_start = String::from_utf8_lossy(body)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        self.buf.drain(..head_end + length);
        Ok(Response { status, body_start })
    }

    fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 4096];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed mid-response",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
