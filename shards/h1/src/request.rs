//! Request heads: parsing a request line and fields, and deciding how the request body is framed.

use std::mem::MaybeUninit;

use crate::error::HeadError;
use crate::fields::{list_elements, summarize, ContentLength};
use crate::head::{
    head_window, newer_minor_at, partial, translate_error, BodyKind, ConnectionTokens, Method,
    Parsed, Version,
};
use crate::span::{name_eq, HeaderSpan, Span};
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
    /// Where the client addressed the request: the authority of an absolute-form target
    /// (`http://host:port/path`, RFC 9112 §3.2.2: it wins over the Host field), else the Host
    /// field. None only for a request without Host that may go without one (HTTP/1.0,
    /// CONNECT); a Host field with an empty value gives an empty span.
    pub authority: Option<Span>,
    /// The protocol version. A request line with `HTTP/1.2` to `HTTP/1.9` is read as
    /// HTTP/1.1 (RFC 9110 §2.5).
    pub version: Version,
    /// Every header field in order.
    pub headers: Vec<HeaderSpan>,
    /// How the body is delimited: Empty, Length or Chunked, never UntilClose.
    pub body: BodyKind,
    /// Connection header tokens.
    pub connection: ConnectionTokens,
    /// Value of the Upgrade header, only when Connection lists `upgrade` and the request is
    /// HTTP/1.1 (an HTTP/1.0 request cannot upgrade).
    ///
    /// An offer of `h2c` is ignored, as RFC 9113 §3.1 lets a server do: when it is the only
    /// protocol offered this is None and the request is an ordinary HTTP/1.1 request;
    /// [`RequestHead::h2c_offered`] says the list named it, so a proxy drops it from what it
    /// forwards.
    pub upgrade: Option<Span>,
    /// The Upgrade field that asked for an upgrade listed `h2c`.
    pub h2c_offered: bool,
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
        self.authority = None;
        self.version = Version::default();
        self.headers.clear();
        self.body = BodyKind::Empty;
        self.connection = ConnectionTokens::default();
        self.upgrade = None;
        self.h2c_offered = false;
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
    // The span's length first: most fields differ in length from the one sought, and that
    // rejects them before any slicing.
    headers
        .iter()
        .find(|header| {
            header.name.len() == name.len() && name_eq(header.name.of(buf), name.as_bytes())
        })
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
    parse_window(head_window(buf), head, true)
}

fn parse_window(
    window: &[u8],
    head: &mut RequestHead,
    may_reread: bool,
) -> Result<Parsed, HeadError> {
    head.reset();
    // Uninitialized slots spare a 4 KiB memset per parse; httparse only reads what it wrote.
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let len = match request.parse_with_uninit_headers(window, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return partial(window),
        Err(httparse::Error::Version) if may_reread => {
            return match newer_minor_at(window, request_version_start) {
                Some(minor_at) => reread_as_http11(window, minor_at, head),
                None => translate_error(httparse::Error::Version, window, request_version_start),
            };
        }
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
    if let Some(upgrade) = head.upgrade {
        ignore_h2c(upgrade.of(window), head);
    }
    head.expect_continue = fields.expect_continue && head.version == Version::Http11;
    head.te_trailers = fields.te_trailers;
    head.body = request_body(&fields, head.version)?;
    // RFC 9112 §3.2: exactly one Host in HTTP/1.1 (Go exempts CONNECT, which has its
    // authority in the target), at most one in HTTP/1.0.
    if fields.host_count > 1 {
        return Err(HeadError::DuplicateHost);
    }
    if fields.host_count == 0 && head.version == Version::Http11 && head.method != Method::Connect {
        return Err(HeadError::MissingHost);
    }
    head.authority = fields.host;
    // Origin form (`/path`) is all but every request; only a target that is not needs a look.
    if target.as_bytes().first() != Some(&b'/') {
        if let Some(authority) = absolute_form_authority(target.as_bytes())? {
            head.authority = Some(Span::within(window, authority));
        }
    }
    Ok(Parsed::Complete)
}

/// Parses a copy of `window` whose request line says `HTTP/1.1` where it said `HTTP/1.x`
/// (x from 2 to 9, at `minor_at`). The copy has the same length, so every span also fits the
/// caller's buffer.
#[cold]
#[inline(never)]
fn reread_as_http11(
    window: &[u8],
    minor_at: usize,
    head: &mut RequestHead,
) -> Result<Parsed, HeadError> {
    let mut copy = window.to_vec();
    copy[minor_at] = b'1';
    parse_window(&copy, head, false)
}

/// RFC 9113 §3.1: a server may ignore an `h2c` upgrade offer. Only when h2c is all that is
/// offered does the request stop being an upgrade.
#[cold]
fn ignore_h2c(offered: &[u8], head: &mut RequestHead) {
    let is_h2c = |protocol: &[u8]| protocol.eq_ignore_ascii_case(b"h2c");
    if list_elements(offered).any(is_h2c) {
        head.h2c_offered = true;
        if list_elements(offered).all(is_h2c) {
            head.upgrade = None;
        }
    }
}

/// The authority of an absolute-form target (`http://authority/path?query`, RFC 9112
/// §3.2.2), None for the other forms (`*`, CONNECT's authority form).
///
/// An empty authority or one with userinfo (`http://user@host/`, which RFC 9110 §4.2.4
/// forbids senders to send) is refused: no routing key can be trusted from it.
fn absolute_form_authority(target: &[u8]) -> Result<Option<&[u8]>, HeadError> {
    let scheme_len = if target.len() >= 7 && target[..7].eq_ignore_ascii_case(b"http://") {
        7
    } else if target.len() >= 8 && target[..8].eq_ignore_ascii_case(b"https://") {
        8
    } else {
        return Ok(None);
    };
    let rest = &target[scheme_len..];
    let end = rest
        .iter()
        .position(|&byte| matches!(byte, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.is_empty() || authority.contains(&b'@') {
        return Err(HeadError::Malformed("invalid request target"));
    }
    Ok(Some(authority))
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
        // has no length anyone can agree on (RFC 9112 §6.1); nor has a list that cannot be
        // read.
        if version == Version::Http10
            || encoding.malformed
            || encoding.chunked_repeated
            || encoding.codings == 0
        {
            return Err(HeadError::UnsupportedTransferEncoding);
        }
        // RFC 9112 §6.3: a request whose final coding is not `chunked` has no length anyone
        // can determine, a MUST 400 that comes before "a coding we do not implement".
        if !encoding.chunked_last {
            return Err(HeadError::UnsupportedTransferEncoding);
        }
        // Only a single bare `chunked` is implemented (RFC 9112 §6.1: 501 for the rest).
        if encoding.codings != 1 {
            return Err(HeadError::UnknownTransferCoding);
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
    fn absolute_form_authorities() {
        let ok = |target: &str| {
            absolute_form_authority(target.as_bytes()).map(|a| a.map(<[u8]>::to_vec))
        };
        assert_eq!(ok("http://h:80/p"), Ok(Some(b"h:80".to_vec())));
        assert_eq!(ok("HTTPS://h?q"), Ok(Some(b"h".to_vec())));
        assert_eq!(ok("http://h"), Ok(Some(b"h".to_vec())));
        assert_eq!(ok("*"), Ok(None));
        assert_eq!(ok("h:443"), Ok(None));
        let invalid = Err(HeadError::Malformed("invalid request target"));
        assert_eq!(ok("http:///p"), invalid);
        assert_eq!(ok("http://u@h/"), invalid);
    }

    #[test]
    fn reuse_clears_previous_state() {
        let mut head = RequestHead::default();
        let first =
            b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc";
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
