//! One raw HTTP/1 client for tests and benchmarks: it writes the bytes it is given exactly as
//! given, so a test can send a malformed or unusual request, and reads responses back one at a
//! time, as they came over the wire.
//!
//! A response is read whole: its head (status, reason, headers in order with their names as
//! sent), then its body as RFC 9112 §6.3 frames it: none for a HEAD request, a 1xx, 204 or 304;
//! chunked when the last transfer coding is `chunked` (trailers kept); read until the peer
//! closes for any other transfer coding or when there is no `Content-Length`. Interim 1xx
//! responses before the final one are kept in [`Response::interim`]; `101 Switching Protocols`
//! is final, and what follows it is the new protocol's. Bytes after the response stay buffered
//! for the next one (pipelining), and a read that fails takes nothing off the buffer.
//!
//! Heads are parsed with `httparse` and chunk-size lines with its `parse_chunk_size`, not with
//! kactivator's own HTTP/1 code, so a bug there cannot hide behind the same bug here.
//!
//! Nothing blocks for ever: a connection reads under the stream's read timeout, and gives a
//! stream that has none [`DEFAULT_IDLE_TIMEOUT`]. Every failure is an [`Error`] that says what
//! was being read, what went wrong, and how the bytes received so far begin.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The longest a read waits for the next byte when the stream has no read timeout of its own.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// A response head longer than this is an error rather than more to wait for.
const MAX_HEAD_BYTES: usize = 1 << 20;
/// Bytes asked of the stream per read.
const READ_SIZE: usize = 64 * 1024;
/// Header slots `httparse` starts with; more are given when a head has more fields.
const FIRST_HEADER_SLOTS: usize = 64;
const MAX_HEADER_SLOTS: usize = 64 * 1024;
/// How much of the bytes received an error message shows.
const PREVIEW_BYTES: usize = 300;

/// A byte stream responses are read from: a socket, or bytes already in memory.
pub trait Source: Read {
    /// The longest one read may block: `None` when it may block for ever.
    fn read_limit(&self) -> io::Result<Option<Duration>>;
    /// Bounds every later read to `limit`.
    fn set_read_limit(&mut self, limit: Duration) -> io::Result<()>;
}

impl Source for TcpStream {
    fn read_limit(&self) -> io::Result<Option<Duration>> {
        self.read_timeout()
    }

    fn set_read_limit(&mut self, limit: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(limit))
    }
}

impl Source for &TcpStream {
    fn read_limit(&self) -> io::Result<Option<Duration>> {
        self.read_timeout()
    }

    fn set_read_limit(&mut self, limit: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(limit))
    }
}

impl<S: Source + ?Sized> Source for &mut S {
    fn read_limit(&self) -> io::Result<Option<Duration>> {
        (**self).read_limit()
    }

    fn set_read_limit(&mut self, limit: Duration) -> io::Result<()> {
        (**self).set_read_limit(limit)
    }
}

/// Bytes in memory: a read never waits, and the end of the bytes is the peer's close.
impl Source for &[u8] {
    fn read_limit(&self) -> io::Result<Option<Duration>> {
        Ok(Some(Duration::ZERO))
    }

    fn set_read_limit(&mut self, _limit: Duration) -> io::Result<()> {
        Ok(())
    }
}

/// A response head: its status line and header fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The minor version of `HTTP/1.x`: 0 or 1.
    pub version: u8,
    pub status: u16,
    pub reason: String,
    /// The fields in the order they came, names spelled as they came.
    pub headers: Vec<(String, String)>,
    /// The head's bytes as received, the empty line that ends it included.
    pub raw: Vec<u8>,
}

impl Head {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        first_value(&self.headers, name)
    }
}

/// How a response's body was delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body: a response to HEAD, a 1xx, 204 or 304.
    None,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding` ending in `chunked`.
    Chunked,
    /// Everything until the peer closed.
    Close,
}

/// One final response, read whole.
#[derive(Debug, Clone)]
pub struct Response {
    /// The minor version of `HTTP/1.x`: 0 or 1.
    pub version: u8,
    pub status: u16,
    pub reason: String,
    /// The fields in the order they came, names spelled as they came.
    pub headers: Vec<(String, String)>,
    /// The head's bytes as received, the empty line that ends it included.
    pub raw_head: Vec<u8>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
    /// The trailer fields of a chunked body, in order.
    pub trailers: Vec<(String, String)>,
    pub framing: Framing,
    /// The interim (1xx other than 101) responses that came before this one, in order.
    pub interim: Vec<Head>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        first_value(&self.headers, name)
    }

    /// The first value of trailer `name` (case-insensitive).
    pub fn trailer(&self, name: &str) -> Option<&str> {
        first_value(&self.trailers, name)
    }

    /// The body as text, with invalid UTF-8 replaced.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics, showing the body, when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "the body of a {} response is not JSON ({error}): {:?}",
                self.status,
                preview(&self.body)
            )
        })
    }

    /// Whether the body was chunked.
    pub fn chunked(&self) -> bool {
        self.framing == Framing::Chunked
    }

    /// Whether the connection can carry no further response: `Connection: close`, HTTP/1.0
    /// without `Connection: keep-alive`, or a body that ended with the connection.
    pub fn closes_connection(&self) -> bool {
        let has_token = |token: &str| {
            self.headers
                .iter()
                .filter(|(name, _)| name.eq_ignore_ascii_case("connection"))
                .flat_map(|(_, value)| value.split(','))
                .any(|item| item.trim().eq_ignore_ascii_case(token))
        };
        self.framing == Framing::Close
            || has_token("close")
            || (self.version == 0 && !has_token("keep-alive"))
    }
}

fn first_value<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(field, _)| field.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

/// What was being read when something went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Nothing yet: connecting or sending.
    Request,
    Head,
    Body,
    ChunkSize,
    ChunkData,
    Trailers,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Part::Request => "the request",
            Part::Head => "the response head",
            Part::Body => "the response body",
            Part::ChunkSize => "a chunk-size line",
            Part::ChunkData => "a chunk's data",
            Part::Trailers => "the trailer section",
        })
    }
}

/// What went wrong.
#[derive(Debug)]
pub enum ErrorKind {
    Connect(io::Error),
    Send(io::Error),
    /// No byte came within the read timeout (`None`: unknown).
    Timeout(Option<Duration>),
    /// The peer closed (or the bytes in memory ended) before the part was whole.
    Closed,
    /// The bytes are not what HTTP/1 allows there.
    Malformed(String),
    /// Any other read error (a reset, for one).
    Read(io::Error),
}

/// A failed exchange: what went wrong, while reading what, and what had come so far.
#[derive(Debug)]
pub struct Error {
    pub kind: ErrorKind,
    pub reading: Part,
    /// Bytes received and not yet taken off the connection (those of this response when
    /// reading a whole one).
    pub received: usize,
    /// How those bytes begin, escaped.
    pub preview: String,
}

impl Error {
    fn new(kind: ErrorKind, reading: Part, received: &[u8]) -> Error {
        Error {
            kind,
            reading,
            received: received.len(),
            preview: preview(received),
        }
    }

    pub fn is_timeout(&self) -> bool {
        matches!(self.kind, ErrorKind::Timeout(_))
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.kind, ErrorKind::Closed)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::Connect(error) => return write!(f, "could not connect: {error}"),
            ErrorKind::Send(error) => return write!(f, "could not send the request: {error}"),
            ErrorKind::Timeout(Some(limit)) => write!(
                f,
                "no byte came for {limit:?} while reading {}",
                self.reading
            )?,
            ErrorKind::Timeout(None) => write!(f, "timed out reading {}", self.reading)?,
            ErrorKind::Closed if self.received == 0 && self.reading == Part::Head => {
                return f.write_str("the connection closed before any byte of a response")
            }
            ErrorKind::Closed => write!(f, "the connection closed inside {}", self.reading)?,
            ErrorKind::Malformed(why) => write!(f, "malformed {}: {why}", self.reading)?,
            ErrorKind::Read(error) => write!(f, "reading {} failed: {error}", self.reading)?,
        }
        if self.received == 0 {
            f.write_str(" (nothing received)")
        } else {
            write!(
                f,
                " ({} bytes received, starting \"{}\")",
                self.received, self.preview
            )
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Connect(error) | ErrorKind::Send(error) | ErrorKind::Read(error) => {
                Some(error)
            }
            _ => None,
        }
    }
}

fn preview(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(PREVIEW_BYTES)];
    let mut text = shown.escape_ascii().to_string();
    if shown.len() < bytes.len() {
        text.push('…');
    }
    text
}

/// One connection: the stream, and the bytes read off it that no response has taken yet.
pub struct Connection<S = TcpStream> {
    stream: S,
    /// Bytes read and not yet taken are `buffer[start..end]`; what lies before `start` is
    /// moved out of the way before the next read, and the buffer's length only grows, so a read
    /// does not write zeros over space it already had.
    buffer: Vec<u8>,
    start: usize,
    end: usize,
    idle_timeout: Option<Duration>,
}

impl Connection<TcpStream> {
    /// Connects to `addr` with [`DEFAULT_IDLE_TIMEOUT`] for connecting, reading and writing.
    pub fn connect(addr: SocketAddr) -> Result<Self, Error> {
        Connection::connect_with_timeout(addr, DEFAULT_IDLE_TIMEOUT)
    }

    /// Connects to `addr`; `timeout` bounds the connect, and then every read and write.
    pub fn connect_with_timeout(addr: SocketAddr, timeout: Duration) -> Result<Self, Error> {
        let failed = |error| Error::new(ErrorKind::Connect(error), Part::Request, &[]);
        let stream = TcpStream::connect_timeout(&addr, timeout).map_err(failed)?;
        stream.set_nodelay(true).map_err(failed)?;
        stream.set_write_timeout(Some(timeout)).map_err(failed)?;
        let mut connection = Connection::new(stream).map_err(failed)?;
        connection.set_idle_timeout(timeout).map_err(failed)?;
        Ok(connection)
    }
}

impl<S: Write> Connection<S> {
    /// Writes `raw` exactly as given.
    pub fn send(&mut self, raw: &[u8]) -> Result<(), Error> {
        self.stream
            .write_all(raw)
            .and_then(|()| self.stream.flush())
            .map_err(|error| Error::new(ErrorKind::Send(error), Part::Request, &[]))
    }
}

impl<S: Source> Connection<S> {
    /// Reads responses off `stream`. A stream with no read timeout gets
    /// [`DEFAULT_IDLE_TIMEOUT`]; one with a timeout keeps it.
    pub fn new(stream: S) -> io::Result<Self> {
        Connection::resume(stream, Vec::new())
    }

    /// Like [`Connection::new`], for a stream whose `buffered` bytes were already read off it
    /// (what [`Connection::into_parts`] gave back).
    pub fn resume(mut stream: S, buffered: Vec<u8>) -> io::Result<Self> {
        let idle_timeout = match stream.read_limit()? {
            Some(limit) => limit,
            None => {
                stream.set_read_limit(DEFAULT_IDLE_TIMEOUT)?;
                DEFAULT_IDLE_TIMEOUT
            }
        };
        Ok(Connection {
            stream,
            end: buffered.len(),
            buffer: buffered,
            start: 0,
            idle_timeout: Some(idle_timeout),
        })
    }

    /// How long each later read may wait for its first byte.
    pub fn set_idle_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        self.stream.set_read_limit(timeout)?;
        self.idle_timeout = Some(timeout);
        Ok(())
    }

    pub fn stream(&self) -> &S {
        &self.stream
    }

    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// Bytes read off the stream that nothing has taken yet.
    pub fn buffered(&self) -> &[u8] {
        &self.buffer[self.start..self.end]
    }

    /// The stream and the bytes read off it that nothing has taken yet.
    pub fn into_parts(mut self) -> (S, Vec<u8>) {
        self.buffer.truncate(self.end);
        self.buffer.drain(..self.start);
        (self.stream, self.buffer)
    }

    /// Reads the final response to a request that was not HEAD.
    pub fn read_response(&mut self) -> Result<Response, Error> {
        self.read_response_to("GET")
    }

    /// Reads the final response to a request with `method` (HEAD's has no body, nor has a 2xx
    /// to CONNECT), with the interim responses before it. On an error nothing is taken off the
    /// buffer.
    pub fn read_response_to(&mut self, method: &str) -> Result<Response, Error> {
        let mut at = 0;
        let mut interim = Vec::new();
        let head = loop {
            let (head, end) = self.head_at(at, false)?;
            at = end;
            if (100..200).contains(&head.status) && head.status != 101 {
                interim.push(head);
                continue;
            }
            break head;
        };
        let framing = framing(&head, method)
            .map_err(|why| self.error(ErrorKind::Malformed(why), Part::Head))?;
        let mut body = Vec::new();
        let mut trailers = Vec::new();
        match framing {
            Framing::None => {}
            Framing::Length(length) => {
                let length = usize::try_from(length).map_err(|_| {
                    self.error(
                        ErrorKind::Malformed(format!("Content-Length {length} is too large")),
                        Part::Body,
                    )
                })?;
                self.need(at, length, Part::Body)?;
                body = self.buffered()[at..at + length].to_vec();
                at += length;
            }
            Framing::Chunked => loop {
                let (size, data_at) = self.chunk_size_at(at)?;
                if size == 0 {
                    let (fields, end) = self.trailers_at(data_at)?;
                    trailers = fields;
                    at = end;
                    break;
                }
                let end = self.chunk_data_at(data_at, size)?;
                body.extend_from_slice(&self.buffered()[data_at..data_at + size]);
                at = end;
            },
            Framing::Close => {
                self.fill_until_close(Part::Body)?;
                body = self.buffered()[at..].to_vec();
                at = self.buffered().len();
            }
        }
        self.start += at;
        Ok(Response {
            version: head.version,
            status: head.status,
            reason: head.reason,
            headers: head.headers,
            raw_head: head.raw,
            body,
            trailers,
            framing,
            interim,
        })
    }

    /// Reads one head, interim or final, and leaves its body unread.
    pub fn read_head(&mut self) -> Result<Head, Error> {
        let (head, end) = self.head_at(0, false)?;
        self.start += end;
        Ok(head)
    }

    /// Reads one head a byte at a time, so that nothing after it is taken off the stream: for
    /// a `101` whose stream a test then uses as it is. Bytes buffered before are used first.
    pub fn read_head_alone(&mut self) -> Result<Head, Error> {
        let (head, end) = self.head_at(0, true)?;
        self.start += end;
        Ok(head)
    }

    /// The next chunk's data, or `None` at the last (zero-size) chunk, whose trailer section
    /// is left for [`Connection::read_trailers`].
    pub fn read_chunk(&mut self) -> Result<Option<Vec<u8>>, Error> {
        let (size, data_at) = self.chunk_size_at(0)?;
        if size == 0 {
            self.start += data_at;
            return Ok(None);
        }
        let end = self.chunk_data_at(data_at, size)?;
        let data = self.buffered()[data_at..data_at + size].to_vec();
        self.start += end;
        Ok(Some(data))
    }

    /// The trailer section after the last chunk, up to and with its empty line.
    pub fn read_trailers(&mut self) -> Result<Vec<(String, String)>, Error> {
        let (fields, end) = self.trailers_at(0)?;
        self.start += end;
        Ok(fields)
    }

    /// Exactly `length` bytes.
    pub fn read_exact_bytes(&mut self, length: usize) -> Result<Vec<u8>, Error> {
        self.need(0, length, Part::Body)?;
        let data = self.buffered()[..length].to_vec();
        self.start += length;
        Ok(data)
    }

    /// Every byte until the peer closes.
    pub fn read_to_close(&mut self) -> Result<Vec<u8>, Error> {
        self.fill_until_close(Part::Body)?;
        let data = self.buffered().to_vec();
        self.start = self.end;
        Ok(data)
    }

    /// A head starting `at` bytes into the buffer: the head and the offset just after it.
    fn head_at(&mut self, at: usize, byte_at_a_time: bool) -> Result<(Head, usize), Error> {
        loop {
            let pending = &self.buffered()[at..];
            match parse_head(pending) {
                Ok(Some((head, length))) => return Ok((head, at + length)),
                Ok(None) if pending.len() > MAX_HEAD_BYTES => {
                    let why = format!("longer than {MAX_HEAD_BYTES} bytes");
                    return Err(self.error(ErrorKind::Malformed(why), Part::Head));
                }
                Ok(None) => self.fill(Part::Head, byte_at_a_time)?,
                Err(why) => return Err(self.error(ErrorKind::Malformed(why), Part::Head)),
            }
        }
    }

    /// A chunk-size line starting `at`: the size and the offset of the chunk's data.
    fn chunk_size_at(&mut self, at: usize) -> Result<(usize, usize), Error> {
        loop {
            let pending = &self.buffered()[at..];
            if pending
                .first()
                .is_some_and(|byte| !byte.is_ascii_hexdigit())
            {
                let why = "it does not start with a hex digit".to_string();
                return Err(self.error(ErrorKind::Malformed(why), Part::ChunkSize));
            }
            match httparse::parse_chunk_size(pending) {
                Ok(httparse::Status::Complete((length, size))) => {
                    let size = usize::try_from(size).map_err(|_| {
                        let why = format!("chunk of {size} bytes is too large");
                        self.error(ErrorKind::Malformed(why), Part::ChunkSize)
                    })?;
                    return Ok((size, at + length));
                }
                Ok(httparse::Status::Partial) => self.fill(Part::ChunkSize, false)?,
                Err(httparse::InvalidChunkSize) => {
                    let why = "not a hex size with optional extensions".to_string();
                    return Err(self.error(ErrorKind::Malformed(why), Part::ChunkSize));
                }
            }
        }
    }

    /// A chunk's `size` data bytes at `at` and the CRLF after them: the offset after the CRLF.
    fn chunk_data_at(&mut self, at: usize, size: usize) -> Result<usize, Error> {
        self.need(at, size + 2, Part::ChunkData)?;
        if &self.buffered()[at + size..at + size + 2] != b"\r\n" {
            let why = format!("{size} bytes of data are not followed by CRLF");
            return Err(self.error(ErrorKind::Malformed(why), Part::ChunkData));
        }
        Ok(at + size + 2)
    }

    /// The trailer section starting `at`: its fields and the offset after its empty line.
    fn trailers_at(&mut self, at: usize) -> Result<(Fields, usize), Error> {
        loop {
            let pending = &self.buffered()[at..];
            match parse_fields(pending) {
                Ok(Some((fields, length))) => return Ok((fields, at + length)),
                Ok(None) if pending.len() > MAX_HEAD_BYTES => {
                    let why = format!("longer than {MAX_HEAD_BYTES} bytes");
                    return Err(self.error(ErrorKind::Malformed(why), Part::Trailers));
                }
                Ok(None) => self.fill(Part::Trailers, false)?,
                Err(why) => return Err(self.error(ErrorKind::Malformed(why), Part::Trailers)),
            }
        }
    }

    /// Reads until `length` bytes are buffered from offset `at`.
    fn need(&mut self, at: usize, length: usize, part: Part) -> Result<(), Error> {
        while self.buffered().len() - at < length {
            self.fill(part, false)?;
        }
        Ok(())
    }

    fn fill_until_close(&mut self, part: Part) -> Result<(), Error> {
        loop {
            match self.fill(part, false) {
                Ok(()) => {}
                Err(error) if error.is_closed() => return Ok(()),
                Err(error) => return Err(error),
            }
        }
    }

    /// One read onto the end of the buffer.
    fn fill(&mut self, part: Part, one_byte: bool) -> Result<(), Error> {
        if self.start > 0 {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let want = if one_byte { 1 } else { READ_SIZE };
        if self.buffer.len() < self.end + want {
            self.buffer.resize(self.end + want, 0);
        }
        let result = loop {
            match self
                .stream
                .read(&mut self.buffer[self.end..self.end + want])
            {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        match result {
            Ok(0) => Err(self.error(ErrorKind::Closed, part)),
            Ok(read) => {
                self.end += read;
                Ok(())
            }
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(self.error(ErrorKind::Timeout(self.idle_timeout), part))
            }
            Err(error) => Err(self.error(ErrorKind::Read(error), part)),
        }
    }

    fn error(&self, kind: ErrorKind, part: Part) -> Error {
        Error::new(kind, part, self.buffered())
    }
}

/// Reads one response out of `raw`, the whole of what a peer sent (its end is the peer's
/// close). Bytes after that response are ignored.
pub fn parse_response(raw: &[u8]) -> Result<Response, Error> {
    let mut connection = Connection::new(raw).expect("bytes in memory take any read limit");
    connection.read_response()
}

/// Sends `raw` on a new connection to `addr` and reads the response.
pub fn exchange(addr: SocketAddr, raw: &[u8]) -> Result<Response, Error> {
    let mut connection = Connection::connect(addr)?;
    connection.send(raw)?;
    connection.read_response()
}

/// A head at the start of `bytes` and its length, `None` when it is not whole yet.
fn parse_head(bytes: &[u8]) -> Result<Option<(Head, usize)>, String> {
    let mut slots = FIRST_HEADER_SLOTS;
    loop {
        let mut headers = vec![httparse::EMPTY_HEADER; slots];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(bytes) {
            Ok(httparse::Status::Complete(length)) => {
                return Ok(Some((
                    Head {
                        version: response.version.unwrap_or(1),
                        status: response.code.unwrap_or(0),
                        reason: response.reason.unwrap_or("").to_string(),
                        headers: owned_fields(response.headers),
                        raw: bytes[..length].to_vec(),
                    },
                    length,
                )))
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) if slots < MAX_HEADER_SLOTS => slots *= 8,
            Err(error) => return Err(format!("not an HTTP/1 response head ({error})")),
        }
    }
}

/// A field section (a trailer section) at the start of `bytes`, `None` when it is not whole.
fn parse_fields(bytes: &[u8]) -> Result<Option<(Fields, usize)>, String> {
    let mut slots = FIRST_HEADER_SLOTS;
    loop {
        let mut headers = vec![httparse::EMPTY_HEADER; slots];
        match httparse::parse_headers(bytes, &mut headers) {
            Ok(httparse::Status::Complete((length, fields))) => {
                return Ok(Some((owned_fields(fields), length)))
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) if slots < MAX_HEADER_SLOTS => slots *= 8,
            Err(error) => return Err(format!("not a field section ({error})")),
        }
    }
}

/// Header or trailer fields: (name as sent, value), in order.
type Fields = Vec<(String, String)>;

fn owned_fields(fields: &[httparse::Header<'_>]) -> Fields {
    fields
        .iter()
        .map(|field| {
            (
                field.name.to_string(),
                String::from_utf8_lossy(field.value).into_owned(),
            )
        })
        .collect()
}

/// How the body after `head` is delimited, for a request with `method` (RFC 9112 §6.3).
fn framing(head: &Head, method: &str) -> Result<Framing, String> {
    let status = head.status;
    if method.eq_ignore_ascii_case("HEAD")
        || (100..200).contains(&status)
        || status == 204
        || status == 304
        || (method.eq_ignore_ascii_case("CONNECT") && (200..300).contains(&status))
    {
        return Ok(Framing::None);
    }
    let values = |name: &str| -> Vec<String> {
        head.headers
            .iter()
            .filter(|(field, _)| field.eq_ignore_ascii_case(name))
            .flat_map(|(_, value)| value.split(','))
            .map(|item| item.trim().to_string())
            .collect()
    };
    let codings = values("transfer-encoding");
    if !codings.is_empty() {
        let chunked = codings
            .last()
            .is_some_and(|coding| coding.eq_ignore_ascii_case("chunked"));
        return Ok(if chunked {
            Framing::Chunked
        } else {
            Framing::Close
        });
    }
    let lengths = values("content-length");
    let Some(first) = lengths.first() else {
        return Ok(Framing::Close);
    };
    if lengths.iter().any(|length| length != first) {
        return Err(format!("Content-Length values disagree: {lengths:?}"));
    }
    if first.is_empty() || !first.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(format!("Content-Length {first:?} is not a number"));
    }
    first
        .parse()
        .map(Framing::Length)
        .map_err(|_| format!("Content-Length {first:?} is too large"))
}

#[cfg(test)]
mod tests;
