//! Request heads: parsing a request line and fields, and deciding how the request body is framed.

use std::mem::MaybeUninit;

use crate::error::HeadError;
use crate::fields::{summarize, ContentLength};
use crate::head::{
    head_window, partial, translate_error, BodyKind, ConnectionTokens, Method, Parsed, Version,
};
use crate::span::{HeaderSpan, Span};
use crate::MAX_HEADERS;

/// A parsed request head. Every span points into the buffer given to [`parse_request`].
///
/// Meant to be kept per connection and reused: parsing clears and refills `headers`, so once
/// the vector has grown to the largest head seen, parsing allocates nothing.
#[derive(Debug, Default)]
pub struct RequestHead {
    /// Bytes of the head including the final empty line (and any skipped leading empty lines).
    pub len: usize,
    /// The method, [`Method::Other`] for anything not named there.
    pub method: Method,
    /// Raw method bytes, needed for [`Method::Other`].
    pub method_span: Span,
    /// The request target, as sent.
    pub target: Span,
    /// The protocol version.
    pub version: Version,
    /// Every header field in order.
    pub headers: Vec<HeaderSpan>,
    /// How the body is delimited: Empty, Length or Chunked, never UntilClose.
    pub body: BodyKind,
    /// Connection header tokens.
    pub connection: ConnectionTokens,
    /// Value of the Upgrade header, only when Connection lists `upgrade` and the request is
    /// HTTP/1.1 (an HTTP/1.0 request cannot upgrade).
    pub upgrade: Option<Span>,
    /// `Expect: 100-continue` on an HTTP/1.1 request. HTTP/1.0 requests never set it, because
    /// RFC 9110 §10.1.1 says a server must ignore that expectation from a 1.0 client.
    pub expect_continue: bool,
    /// The TE header lists `trailers`: the client accepts trailer fields in a chunked response.
    pub te_trailers: bool,
}

impl RequestHead {
    /// Whether the connection may carry another request after this one (1.1 default
    /// keep-alive unless close; 1.0 only with keep-alive token).
    pub fn keep_alive(&self) -> bool {
        self.connection.persistent(self.version)
    }

    /// First header with this name (ASCII case-insensitive), value bytes.
    #[inline]
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

    fn reset(&mut self) {
        self.len = 0;
        self.method = Method::default();
        self.method_span = Span::default();
        self.target = Span::default();
        self.version = Version::default();
        self.headers.clear();
        self.body = BodyKind::Empty;
        self.connection = ConnectionTokens::default();
        self.upgrade = None;
        self.expect_continue = false;
        self.te_trailers = false;
    }
}

#[inline]
pub(crate) fn find_header<'b>(
    headers: &[HeaderSpan],
    buf: &'b [u8],
    name: &str,
) -> Option<&'b [u8]> {
    headers
        .iter()
        .find(|header| header.name.of(buf).eq_ignore_ascii_case(name.as_bytes()))
        .map(|header| header.value.of(buf))
}

pub(crate) fn iterate_headers<'a, 'b: 'a>(
    headers: &'a [HeaderSpan],
    buf: &'b [u8],
) -> impl Iterator<Item = (&'b [u8], &'b [u8])> + 'a {
    headers
        .iter()
        .map(move |header| (header.name.of(buf), header.value.of(buf)))
}

pub(crate) fn collect_headers(
    window: &[u8],
    parsed: &[httparse::Header<'_>],
    out: &mut Vec<HeaderSpan>,
) {
    out.extend(parsed.iter().map(|header| HeaderSpan {
        name: Span::within(window, header.name.as_bytes()),
        value: Span::within(window, header.value),
    }));
}

/// Parse a request head at the start of `buf`. On Complete, `head` is filled (head.len = bytes
/// consumed).
///
/// Partial means more bytes are needed; once `buf` holds [`crate::MAX_HEAD_BYTES`] bytes or
/// more without a complete head, the answer is `Err(TooLarge)`. After Partial or an error the
/// contents of `head` are unspecified. Empty lines before the request line are skipped (any
/// number, within the size limit).
pub fn parse_request(buf: &[u8], head: &mut RequestHead) -> Result<Parsed, HeadError> {
    head.reset();
    let window = head_window(buf);
    // Uninitialized slots spare a 4 KiB memset per parse; httparse only reads what it wrote.
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let len = match request.parse_with_uninit_headers(window, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return partial(window),
        Err(error) => return translate_error(error, window, request_version_start),
    };
    let (Some(method), Some(target), Some(minor)) = (request.method, request.path, request.version)
    else {
        return Err(HeadError::Malformed("invalid request line"));
    };

    head.len = len;
    head.method_span = Span::within(window, method.as_bytes());
    head.method = Method::from_bytes(method.as_bytes());
    head.target = Span::within(window, target.as_bytes());
    head.version = Version::from_minor(minor);
    collect_headers(window, request.headers, &mut head.headers);

    let fields = summarize(window, &head.headers);
    head.connection = fields.connection;
    // RFC 9110 §7.8: a server must ignore Upgrade in an HTTP/1.0 request.
    head.upgrade = fields
        .upgrade
        .filter(|_| fields.connection.upgrade && head.version == Version::Http11);
    head.expect_continue = fields.expect_continue && head.version == Version::Http11;
    head.te_trailers = fields.te_trailers;
    head.body = request_body(&fields, head.version)?;
    Ok(Parsed::Complete)
}

/// RFC 9112 §6.3 for requests, refusing every ambiguous combination instead of picking one.
fn request_body(
    fields: &crate::fields::FieldSummary,
    version: Version,
) -> Result<BodyKind, HeadError> {
    let encoding = fields.transfer_encoding;
    if encoding.present {
        if fields.content_length != ContentLength::Absent {
            return Err(HeadError::ConflictingFraming);
        }
        // An HTTP/1.0 hop may not understand chunked, so a 1.0 request with Transfer-Encoding
        // has no length anyone can agree on (RFC 9112 §6.1).
        if version == Version::Http10 || !encoding.is_chunked() {
            return Err(HeadError::UnsupportedTransferEncoding);
        }
        return Ok(BodyKind::Chunked);
    }
    match fields.content_length {
        ContentLength::Absent => Ok(BodyKind::Empty),
        ContentLength::Valid(length) => Ok(BodyKind::Length(length)),
        ContentLength::Invalid => Err(HeadError::InvalidContentLength),
    }
}

/// The version token follows the second space of the request line; httparse has already
/// checked that method and target are each followed by exactly one space.
fn request_version_start(line: &[u8]) -> Option<usize> {
    let first_space = line.iter().position(|&byte| byte == b' ')?;
    let second_space = line[first_space + 1..]
        .iter()
        .position(|&byte| byte == b' ')?;
    Some(first_space + 1 + second_space + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_token_location() {
        assert_eq!(request_version_start(b"GET / HTTP/2.0"), Some(6));
        assert_eq!(request_version_start(b"GET /"), None);
        assert_eq!(request_version_start(b"GET / "), Some(6));
    }

    #[test]
    fn reuse_clears_previous_state() {
        let mut head = RequestHead::default();
        let first = b"POST /a HTTP/1.1\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc";
        assert_eq!(parse_request(first, &mut head), Ok(Parsed::Complete));
        assert_eq!(head.body, BodyKind::Length(3));
        assert!(head.connection.close);
        let second = b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(parse_request(second, &mut head), Ok(Parsed::Complete));
        assert_eq!(head.body, BodyKind::Empty);
        assert!(!head.connection.close);
        assert_eq!(head.headers.len(), 1);
        assert_eq!(head.target.of(second), b"/b");
    }
}
