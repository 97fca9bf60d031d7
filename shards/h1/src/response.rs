//! Response heads: parsing a status line and fields, and deciding how the response body is framed.

use std::mem::MaybeUninit;

use crate::error::HeadError;
use crate::fields::{summarize, ContentLength, FieldSummary};
use crate::head::{
    head_window, partial, translate_error, BodyKind, ConnectionTokens, Method, Parsed, Version,
};
use crate::request::{collect_headers, find_header, iterate_headers};
use crate::span::{HeaderSpan, Span};
use crate::MAX_HEADERS;

/// A parsed response head. Every span points into the buffer given to [`parse_response`].
///
/// Reused like [`crate::RequestHead`]: parsing clears and refills `headers`.
#[derive(Debug, Default)]
pub struct ResponseHead {
    /// Bytes of the head including the final empty line (and any skipped leading empty lines).
    pub len: usize,
    /// The protocol version.
    pub version: Version,
    /// Status code, 100..=999.
    pub status: u16,
    /// Reason phrase as sent, possibly empty, including any obs-text bytes.
    pub reason: Span,
    /// Every header field in order.
    pub headers: Vec<HeaderSpan>,
    /// How the body is delimited, per RFC 9112 §6.3 given the request method.
    ///
    /// When the response carried both Transfer-Encoding and Content-Length this is Chunked (or
    /// UntilClose), and RFC 9112 §6.3 requires an intermediary to drop the Content-Length
    /// field before forwarding.
    pub body: BodyKind,
    /// Connection header tokens. `close` is also set when the response carried both
    /// Transfer-Encoding and Content-Length, so that connection is never reused.
    pub connection: ConnectionTokens,
}

impl ResponseHead {
    /// Whether the connection may carry another exchange after this response: the version and
    /// Connection rules of [`crate::RequestHead::keep_alive`], and never when the body is
    /// delimited by the close itself.
    pub fn keep_alive(&self) -> bool {
        self.body != BodyKind::UntilClose && self.connection.persistent(self.version)
    }

    /// First header with this name (ASCII case-insensitive), value bytes.
    pub fn header<'b>(&self, buf: &'b [u8], name: &str) -> Option<&'b [u8]> {
        find_header(&self.headers, buf, name)
    }

    /// All headers as (name, value) in order.
    pub fn headers<'a, 'b>(
        &'a self,
        buf: &'b [u8],
    ) -> impl Iterator<Item = (&'b [u8], &'b [u8])> + 'a
    where
        'b: 'a,
    {
        iterate_headers(&self.headers, buf)
    }

    /// 1xx: another response head follows this one for the same request (except 101, after
    /// which the connection speaks the upgraded protocol).
    pub fn is_informational(&self) -> bool {
        (100..200).contains(&self.status)
    }

    fn reset(&mut self) {
        self.len = 0;
        self.version = Version::default();
        self.status = 0;
        self.reason = Span::default();
        self.headers.clear();
        self.body = BodyKind::Empty;
        self.connection = ConnectionTokens::default();
    }
}

/// Parse a response head at the start of `buf`.
///
/// `request_method` is needed because a response to HEAD has no body whatever its headers say,
/// and a 2xx response to CONNECT turns the connection into a tunnel (body Empty: what follows
/// is tunnel data, not a body). Status 1xx, 204 and 304 also mean Empty. Size limits and the
/// meaning of Partial are as for [`crate::parse_request`].
pub fn parse_response(
    buf: &[u8],
    request_method: Method,
    head: &mut ResponseHead,
) -> Result<Parsed, HeadError> {
    head.reset();
    let window = head_window(buf);
    // Uninitialized slots spare a 4 KiB memset per parse; httparse only reads what it wrote.
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        window,
        &mut slots,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return partial(window),
        Err(error) => return translate_error(error, window, |_| Some(0)),
    };
    let (Some(minor), Some(status)) = (response.version, response.code) else {
        return Err(HeadError::Malformed("invalid status line"));
    };
    if status < 100 {
        return Err(HeadError::Malformed("invalid status code"));
    }

    head.len = len;
    head.version = Version::from_minor(minor);
    head.status = status;
    head.reason = reason_span(window);
    collect_headers(window, response.headers, &mut head.headers);

    let fields = summarize(window, &head.headers);
    head.connection = fields.connection;
    head.body = response_body(&fields, head, request_method)?;
    if fields.transfer_encoding.present && fields.content_length != ContentLength::Absent {
        // Someone on the path may have framed by Content-Length; whatever they left on this
        // connection cannot be trusted, so it must not carry another exchange.
        head.connection.close = true;
    }
    Ok(Parsed::Complete)
}

/// RFC 9112 §6.3 for responses.
fn response_body(
    fields: &FieldSummary,
    head: &ResponseHead,
    request_method: Method,
) -> Result<BodyKind, HeadError> {
    let no_body = request_method == Method::Head
        || head.is_informational()
        || head.status == 204
        || head.status == 304
        || (request_method == Method::Connect && (200..300).contains(&head.status));
    if no_body {
        return Ok(BodyKind::Empty);
    }
    let encoding = fields.transfer_encoding;
    if encoding.present {
        // Chunked twice, a malformed coding list, or Transfer-Encoding from an HTTP/1.0 server
        // (RFC 9112 §6.1: faulty framing) leave no trustworthy way to find the body's end.
        if encoding.chunked_repeated || encoding.malformed || head.version == Version::Http10 {
            return Err(HeadError::UnsupportedTransferEncoding);
        }
        return Ok(if encoding.is_chunked() {
            BodyKind::Chunked
        } else {
            BodyKind::UntilClose
        });
    }
    match fields.content_length {
        ContentLength::Absent => Ok(BodyKind::UntilClose),
        ContentLength::Valid(length) => Ok(BodyKind::Length(length)),
        ContentLength::Invalid => Err(HeadError::InvalidContentLength),
    }
}

/// The reason phrase, taken from the status line directly: httparse replaces a reason that
/// contains obs-text with a static empty string, and a proxy should forward it unchanged.
fn reason_span(window: &[u8]) -> Span {
    // "HTTP/1.1 200 " — httparse has validated this shape with single spaces.
    const REASON_OFFSET: usize = b"HTTP/1.1 200 ".len();
    let line_start = window
        .iter()
        .position(|&byte| byte != b'\r' && byte != b'\n')
        .unwrap_or(window.len());
    let line = &window[line_start..];
    let line_end = line
        .iter()
        .position(|&byte| byte == b'\r' || byte == b'\n')
        .unwrap_or(line.len());
    if line_end <= REASON_OFFSET {
        return Span::from_range(line_start + line_end, 0);
    }
    Span::from_range(line_start + REASON_OFFSET, line_end - REASON_OFFSET)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_locations() {
        let buf = b"\r\nHTTP/1.1 200 All Good\r\n\r\n";
        assert_eq!(reason_span(buf).of(buf), b"All Good");
        let buf = b"HTTP/1.1 200\r\n\r\n";
        assert_eq!(reason_span(buf).of(buf), b"");
        let buf = b"HTTP/1.1 200 \r\n\r\n";
        assert_eq!(reason_span(buf).of(buf), b"");
        let buf = b"HTTP/1.1 200 caf\xc3\xa9\r\n\r\n";
        assert_eq!(reason_span(buf).of(buf), b"caf\xc3\xa9");
    }
}
