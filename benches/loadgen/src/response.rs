//! Reads HTTP/1.1 responses off a byte stream: status line, headers, and a body framed by
//! `Content-Length`, `Transfer-Encoding: chunked`, or connection close. Bodies are discarded.

use std::fmt;
use std::io::{self, Read};

/// Largest response head (status line + headers) accepted, in bytes.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Initial read buffer size, in bytes.
const INITIAL_BUFFER_BYTES: usize = 16 * 1024;

/// What the client needs to know about one response once its body has been consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Body bytes received (after de-chunking).
    pub body_len: u64,
    /// The connection cannot carry another request: `Connection: close`, HTTP/1.0 without
    /// keep-alive, or a body delimited by end of stream.
    pub close: bool,
}

#[derive(Debug)]
pub enum ResponseError {
    Io(io::Error),
    /// The peer closed the stream before the response was complete.
    UnexpectedEof,
    /// The bytes received are not a valid HTTP/1.x response.
    Malformed(String),
}

impl fmt::Display for ResponseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResponseError::Io(e) => write!(f, "read: {e}"),
            ResponseError::UnexpectedEof => write!(f, "connection closed mid-response"),
            ResponseError::Malformed(why) => write!(f, "malformed response: {why}"),
        }
    }
}

impl From<io::Error> for ResponseError {
    fn from(e: io::Error) -> Self {
        ResponseError::Io(e)
    }
}

fn malformed(why: impl Into<String>) -> ResponseError {
    ResponseError::Malformed(why.into())
}

enum BodyFraming {
    None,
    Length(u64),
    Chunked,
    UntilEof,
}

/// Buffers a stream and pulls whole responses out of it, keeping any bytes that belong to the
/// next response.
pub struct ResponseReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// Unconsumed bytes are `buf[start..end]`.
    start: usize,
    end: usize,
}

// === impl ResponseReader ===

impl<R: Read> ResponseReader<R> {
    pub fn new(inner: R) -> Self {
        ResponseReader {
            inner,
            buf: vec![0; INITIAL_BUFFER_BYTES],
            start: 0,
            end: 0,
        }
    }

    /// Reads one final response (skipping interim 1xx responses) including its body.
    pub fn read_response(&mut self) -> Result<Response, ResponseError> {
        loop {
            let head_len = self.fill_head()?;
            let head = parse_head(&self.buf[self.start..self.start + head_len])?;
            self.start += head_len;
            if (100..200).contains(&head.status) && head.status != 101 {
                continue;
            }
            let body_len = match head.framing {
                BodyFraming::None => 0,
                BodyFraming::Length(n) => {
                    self.discard(n)?;
                    n
                }
                BodyFraming::Chunked => self.discard_chunked()?,
                BodyFraming::UntilEof => self.discard_until_eof()?,
            };
            let close = head.close || matches!(head.framing, BodyFraming::UntilEof);
            return Ok(Response {
                status: head.status,
                body_len,
                close,
            });
        }
    }

    /// Makes sure a complete head (ending in an empty line) is buffered; returns its length
    /// including the terminating CRLFCRLF.
    fn fill_head(&mut self) -> Result<usize, ResponseError> {
        let mut searched: usize = 0;
        loop {
            let pending = &self.buf[self.start..self.end];
            // Restart the search 3 bytes back: the terminator may straddle two reads.
            let from = searched.saturating_sub(3);
            if let Some(at) = find(&pending[from..], b"\r\n\r\n") {
                return Ok(from + at + 4);
            }
            searched = pending.len();
            if searched >= MAX_HEAD_BYTES {
                return Err(malformed(format!(
                    "response head larger than {MAX_HEAD_BYTES} bytes"
                )));
            }
            if self.fill()? == 0 {
                return Err(if searched == 0 {
                    // Closed between responses: the server dropped an idle keep-alive connection.
                    ResponseError::Io(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "connection closed before a response",
                    ))
                } else {
                    ResponseError::UnexpectedEof
                });
            }
        }
    }

    /// Reads more bytes into the buffer, compacting or growing it first if it is full.
    /// Returns the number of bytes read; 0 means end of stream.
    fn fill(&mut self) -> io::Result<usize> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                let grown = self.buf.len() * 2;
                self.buf.resize(grown, 0);
            }
        }
        loop {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(n) => {
                    self.end += n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Consumes exactly `n` body bytes.
    fn discard(&mut self, mut n: u64) -> Result<(), ResponseError> {
        loop {
            let buffered = (self.end - self.start) as u64;
            let take = buffered.min(n);
            self.start += take as usize;
            n -= take;
            if n == 0 {
                return Ok(());
            }
            // Everything buffered is consumed, so `fill` reuses the whole buffer.
            if self.fill()? == 0 {
                return Err(ResponseError::UnexpectedEof);
            }
        }
    }

    /// Consumes a line ending in CRLF and returns it without the CRLF.
    fn take_line(&mut self) -> Result<Vec<u8>, ResponseError> {
        let mut searched: usize = 0;
        loop {
            let pending = &self.buf[self.start..self.end];
            let from = searched.saturating_sub(1);
            if let Some(at) = find(&pending[from..], b"\r\n") {
                let line = pending[..from + at].to_vec();
                self.start += from + at + 2;
                return Ok(line);
            }
            searched = pending.len();
            if searched >= MAX_HEAD_BYTES {
                return Err(malformed("chunk-size or trailer line too long"));
            }
            if self.fill()? == 0 {
                return Err(ResponseError::UnexpectedEof);
            }
        }
    }

    fn discard_chunked(&mut self) -> Result<u64, ResponseError> {
        let mut total = 0u64;
        loop {
            let line = self.take_line()?;
            let size = parse_chunk_size(&line)?;
            if size == 0 {
                // Trailer fields, then the empty line that ends the message.
                while !self.take_line()?.is_empty() {}
                return Ok(total);
            }
            self.discard(size)?;
            if !self.take_line()?.is_empty() {
                return Err(malformed("chunk data not followed by CRLF"));
            }
            total += size;
        }
    }

    fn discard_until_eof(&mut self) -> Result<u64, ResponseError> {
        let mut total = 0u64;
        loop {
            total += (self.end - self.start) as u64;
            self.start = self.end;
            if self.fill()? == 0 {
                return Ok(total);
            }
        }
    }
}

struct Head {
    status: u16,
    framing: BodyFraming,
    close: bool,
}

fn parse_head(head: &[u8]) -> Result<Head, ResponseError> {
    let text = std::str::from_utf8(head).map_err(|_| malformed("head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(malformed(format!("status line {status_line:?}"))),
    };
    let status = parts
        .next()
        .filter(|code| code.len() == 3)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| malformed(format!("status line {status_line:?}")))?;

    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut close = http10;
    for line in lines.filter(|line| !line.is_empty()) {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| malformed(format!("header line {line:?}")))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n = value
                .parse::<u64>()
                .map_err(|_| malformed(format!("Content-Length {value:?}")))?;
            if content_length.is_some_and(|seen| seen != n) {
                return Err(malformed("conflicting Content-Length headers"));
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Chunked must be the last coding applied (RFC 9112 §6.3).
            chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    close = true;
                } else if token.eq_ignore_ascii_case("keep-alive") && http10 {
                    close = false;
                }
            }
        }
    }

    let framing = if status == 204 || status == 304 || (100..200).contains(&status) {
        BodyFraming::None
    } else if chunked {
        BodyFraming::Chunked
    } else if let Some(n) = content_length {
        BodyFraming::Length(n)
    } else {
        BodyFraming::UntilEof
    };
    Ok(Head {
        status,
        framing,
        close,
    })
}

fn parse_chunk_size(line: &[u8]) -> Result<u64, ResponseError> {
    let text = std::str::from_utf8(line).map_err(|_| malformed("chunk-size is not UTF-8"))?;
    let digits = text.split(';').next().unwrap_or_default().trim();
    u64::from_str_radix(digits, 16).map_err(|_| malformed(format!("chunk-size {text:?}")))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out at most `step` bytes per read, to exercise split reads.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(self.data.len()).min(out.len());
            out[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn read_all(data: &[u8]) -> Vec<Result<Response, String>> {
        let mut results = Vec::new();
        for step in [1, 2, 3, 7, data.len().max(1)] {
            let mut reader = ResponseReader::new(Trickle { data, step });
            let mut these = Vec::new();
            loop {
                match reader.read_response() {
                    Ok(r) => {
                        let close = r.close;
                        these.push(Ok(r));
                        if close {
                            break;
                        }
                    }
                    Err(ResponseError::Io(e)) if e.kind() == io::ErrorKind::ConnectionAborted => {
                        break
                    }
                    Err(e) => {
                        these.push(Err(e.to_string()));
                        break;
                    }
                }
            }
            if step == 1 {
                results = these;
            } else {
                assert_eq!(format!("{results:?}"), format!("{these:?}"), "step {step}");
            }
        }
        results
    }

    fn ok(status: u16, body_len: u64, close: bool) -> Result<Response, String> {
        Ok(Response {
            status,
            body_len,
            close,
        })
    }

    #[test]
    fn content_length_responses_on_one_connection_are_read_back_to_back() {
        let data = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok\
                     HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(read_all(data), vec![ok(200, 2, false), ok(503, 0, false)]);
    }

    #[test]
    fn chunked_body_with_extensions_and_trailers_is_consumed() {
        let data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                     5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Trailer: y\r\n\r\n\
                     HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz";
        assert_eq!(read_all(data), vec![ok(200, 31, false), ok(200, 1, false)]);
    }

    #[test]
    fn interim_100_continue_is_skipped() {
        let data = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        assert_eq!(read_all(data), vec![ok(200, 2, false)]);
    }

    #[test]
    fn no_content_has_no_body_even_with_content_length() {
        let data = b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n\
                     HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        assert_eq!(read_all(data), vec![ok(204, 0, false), ok(200, 2, false)]);
    }

    #[test]
    fn connection_close_and_http10_mark_the_connection_unusable() {
        let closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok";
        assert_eq!(read_all(closing), vec![ok(200, 2, true)]);
        let http10 = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok";
        assert_eq!(read_all(http10), vec![ok(200, 2, true)]);
        let http10_keepalive =
            b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok";
        assert_eq!(read_all(http10_keepalive), vec![ok(200, 2, false)]);
    }

    #[test]
    fn body_without_length_runs_to_end_of_stream() {
        let data = b"HTTP/1.1 200 OK\r\n\r\nall of this";
        assert_eq!(read_all(data), vec![ok(200, 11, true)]);
    }

    #[test]
    fn truncated_and_garbled_responses_are_errors() {
        let truncated = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort";
        assert_eq!(
            read_all(truncated),
            vec![Err("connection closed mid-response".to_string())]
        );
        let half_head = b"HTTP/1.1 200 OK\r\nContent-Len";
        assert_eq!(
            read_all(half_head),
            vec![Err("connection closed mid-response".to_string())]
        );
        let garbage = b"SSH-2.0-OpenSSH\r\n\r\n";
        assert!(read_all(garbage)[0].is_err());
        let bad_chunk = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert!(read_all(bad_chunk)[0].is_err());
        let conflicting = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nok";
        assert!(read_all(conflicting)[0].is_err());
    }

    #[test]
    fn large_body_spanning_many_reads_is_counted() {
        let mut data = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n".to_vec();
        data.extend(std::iter::repeat_n(b'x', 100_000));
        data.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        let mut reader = ResponseReader::new(Trickle {
            data: &data,
            step: 4096,
        });
        assert_eq!(reader.read_response().unwrap().body_len, 100_000);
        assert_eq!(reader.read_response().unwrap().body_len, 0);
    }
}
