//! A deliberately small blocking HTTP/1.1 client that shows exactly what went over the
//! wire (chunked or not, trailers, connection close), which a full client would hide.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

/// Upper bound on any single read, so a broken backend fails a test instead of hanging it.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A parsed response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub trailers: Vec<(String, String)>,
    pub chunked: bool,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }

    /// The first value of trailer `name` (case-insensitive).
    pub fn trailer(&self, name: &str) -> Option<&str> {
        find(&self.trailers, name)
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("utf-8 body")
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("json body")
    }
}

fn find<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(field, _)| field.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

/// One client connection.
pub struct Connection {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Connection {
    pub fn open(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).expect("connect to backend");
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Self {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
        }
    }

    /// Writes raw bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("write to backend");
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
        let status_line = self.read_line();
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        (status, self.read_fields())
    }

    pub fn read_response(&mut self, head_request: bool) -> Response {
        let (status, headers) = self.read_head();
        let mut response = Response {
            status,
            headers,
            body: Vec::new(),
            trailers: Vec::new(),
            chunked: false,
        };
        let bodyless = head_request || status < 200 || status == 204 || status == 304;
        if bodyless {
            return response;
        }
        let transfer_encoding = response.header("transfer-encoding").map(str::to_owned);
        let content_length = response.header("content-length").map(str::to_owned);
        if transfer_encoding.is_some_and(|coding| coding.eq_ignore_ascii_case("chunked")) {
            response.chunked = true;
            while let Some(chunk) = self.read_chunk() {
                response.body.extend_from_slice(&chunk);
            }
            response.trailers = self.read_fields();
        } else if let Some(length) = content_length {
            let length: usize = length.parse().expect("numeric content-length");
            response.body = self.read_exact_bytes(length);
        } else {
            self.reader.read_to_end(&mut response.body).unwrap();
        }
        response
    }

    /// The next chunk's data, or `None` at the terminating zero-size chunk (whose
    /// trailers are left unread).
    pub fn read_chunk(&mut self) -> Option<Vec<u8>> {
        let size_line = self.read_line();
        let size_text = size_line.split(';').next().unwrap().trim();
        let size = usize::from_str_radix(size_text, 16)
            .unwrap_or_else(|_| panic!("bad chunk size line {size_line:?}"));
        if size == 0 {
            return None;
        }
        let data = self.read_exact_bytes(size);
        assert_eq!(self.read_line(), "", "chunk data must end with CRLF");
        Some(data)
    }

    /// Reads the trailer section that follows the terminating chunk.
    pub fn read_trailers(&mut self) -> Vec<(String, String)> {
        self.read_fields()
    }

    pub fn read_exact_bytes(&mut self, length: usize) -> Vec<u8> {
        let mut data = vec![0; length];
        self.reader.read_exact(&mut data).expect("read body bytes");
        data
    }

    /// Reads until the peer closes its write side.
    pub fn read_to_end(&mut self) -> Vec<u8> {
        let mut data = Vec::new();
        self.reader.read_to_end(&mut data).expect("read to end");
        data
    }

    pub fn shutdown_write(&mut self) {
        self.writer.shutdown(Shutdown::Write).unwrap();
    }

    fn read_line(&mut self) -> String {
        let mut line = String::new();
        let read = self.reader.read_line(&mut line).expect("read line");
        assert!(read > 0, "connection closed while a line was expected");
        line.trim_end_matches(['\r', '\n']).to_owned()
    }

    fn read_fields(&mut self) -> Vec<(String, String)> {
        let mut fields = Vec::new();
        loop {
            let line = self.read_line();
            if line.is_empty() {
                return fields;
            }
            let (name, value) = line.split_once(':').expect("field line has a colon");
            fields.push((name.trim().to_owned(), value.trim().to_owned()));
        }
    }
}

/// A plain GET on a fresh connection.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    Connection::open(addr).get(path)
}
