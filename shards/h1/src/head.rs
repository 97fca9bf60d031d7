//! Vocabulary shared by request and response heads, and the glue that drives httparse.

use crate::error::HeadError;
use crate::MAX_HEAD_BYTES;

/// Protocol version of a message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Version {
    /// HTTP/1.0
    Http10,
    /// HTTP/1.1
    #[default]
    Http11,
}

impl Version {
    pub(crate) fn from_minor(minor: u8) -> Version {
        if minor == 0 {
            Version::Http10
        } else {
            Version::Http11
        }
    }

    /// The version as it appears on the wire, e.g. `HTTP/1.1`.
    pub fn as_bytes(&self) -> &'static [u8] {
        match self {
            Version::Http10 => b"HTTP/1.0",
            Version::Http11 => b"HTTP/1.1",
        }
    }
}

/// Request method. Methods are case-sensitive, so `get` is [`Method::Other`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Method {
    /// GET
    #[default]
    Get,
    /// HEAD
    Head,
    /// POST
    Post,
    /// PUT
    Put,
    /// DELETE
    Delete,
    /// OPTIONS
    Options,
    /// PATCH
    Patch,
    /// CONNECT
    Connect,
    /// TRACE
    Trace,
    /// Any other token; the raw bytes are in [`crate::RequestHead::method_span`].
    Other,
}

impl Method {
    /// Classify raw method bytes.
    pub fn from_bytes(bytes: &[u8]) -> Method {
        match bytes {
            b"GET" => Method::Get,
            b"HEAD" => Method::Head,
            b"POST" => Method::Post,
            b"PUT" => Method::Put,
            b"DELETE" => Method::Delete,
            b"OPTIONS" => Method::Options,
            b"PATCH" => Method::Patch,
            b"CONNECT" => Method::Connect,
            b"TRACE" => Method::Trace,
            _ => Method::Other,
        }
    }
}

/// How the body that follows a head is delimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BodyKind {
    /// No body bytes follow the head.
    #[default]
    Empty,
    /// Exactly this many bytes follow.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Response body delimited by the connection closing (never for requests).
    UntilClose,
}

/// Tokens of the Connection header that matter to a proxy (case-insensitive, comma lists,
/// repeated headers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionTokens {
    /// `close` was listed.
    pub close: bool,
    /// `keep-alive` was listed.
    pub keep_alive: bool,
    /// `upgrade` was listed.
    pub upgrade: bool,
}

impl ConnectionTokens {
    /// Whether a connection that carried a message of `version` with these tokens may carry
    /// another message: HTTP/1.1 persists unless `close`; HTTP/1.0 only with `keep-alive`.
    pub fn persistent(&self, version: Version) -> bool {
        if self.close {
            return false;
        }
        match version {
            Version::Http11 => true,
            Version::Http10 => self.keep_alive,
        }
    }
}

/// Outcome of a head parse that found nothing wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole head was parsed; its length is in the head's `len`.
    Complete,
    /// The bytes so far are a valid beginning of a head; read more and parse again.
    Partial,
}

/// The part of the buffer httparse is allowed to look at.
///
/// Capping the input rather than checking the result keeps the work per parse bounded even
/// when a peer streams megabytes of header bytes.
pub(crate) fn head_window(buf: &[u8]) -> &[u8] {
    &buf[..buf.len().min(MAX_HEAD_BYTES)]
}

/// What to answer when httparse says "not yet" on `window`.
pub(crate) fn partial(window: &[u8]) -> Result<Parsed, HeadError> {
    if window.len() >= MAX_HEAD_BYTES {
        Err(HeadError::TooLarge)
    } else {
        Ok(Parsed::Partial)
    }
}

/// Translate an httparse failure, looking at the version token when httparse blamed it.
///
/// httparse reports every unknown version as the same error; a proxy must answer 505 to a
/// well-formed `HTTP/2.0` but 400 to garbage, so the token is inspected here.
/// `version_token_start` is where the version token starts in the first non-empty line.
pub(crate) fn translate_error(
    error: httparse::Error,
    window: &[u8],
    version_token_start: impl Fn(&[u8]) -> Option<usize>,
) -> Result<Parsed, HeadError> {
    let message = match error {
        httparse::Error::TooManyHeaders => return Err(HeadError::TooManyHeaders),
        httparse::Error::Version => {
            let line = first_line(window);
            return match version_token_start(line.bytes) {
                Some(start) => classify_version(&line.bytes[start..], line.terminated, window),
                None => Err(HeadError::Malformed("invalid HTTP version")),
            };
        }
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Status => "invalid status line",
        httparse::Error::Token => "invalid request line",
    };
    Err(HeadError::Malformed(message))
}

struct Line<'a> {
    /// Where the line starts in the window.
    start: usize,
    bytes: &'a [u8],
    terminated: bool,
}

/// Where the minor digit of the request line's version sits in `window`, when that version is
/// `HTTP/1.2` to `HTTP/1.9` and the line is complete.
///
/// RFC 9110 §2.5: a server reads a later 1.x minor as the highest minor it implements, 1.1.
/// httparse refuses them, so the caller re-parses a copy with the digit replaced; only on
/// that rare path is anything copied.
pub(crate) fn newer_minor_at(
    window: &[u8],
    version_token_start: impl Fn(&[u8]) -> Option<usize>,
) -> Option<usize> {
    let line = first_line(window);
    if !line.terminated {
        return None;
    }
    let start = version_token_start(line.bytes)?;
    match line.bytes.get(start..)? {
        [b'H', b'T', b'T', b'P', b'/', b'1', b'.', b'2'..=b'9'] => {
            Some(line.start + start + b"HTTP/1.".len())
        }
        _ => None,
    }
}

/// The first line that is not empty, without its terminator.
fn first_line(window: &[u8]) -> Line<'_> {
    let start = window
        .iter()
        .position(|&byte| byte != b'\r' && byte != b'\n')
        .unwrap_or(window.len());
    let rest = &window[start..];
    match rest.iter().position(|&byte| byte == b'\r' || byte == b'\n') {
        Some(end) => Line {
            start,
            bytes: &rest[..end],
            terminated: true,
        },
        None => Line {
            start,
            bytes: rest,
            terminated: false,
        },
    }
}

/// `token` is everything from the start of the version to the end of the line (or of the
/// buffer when `terminated` is false). `token` may extend past the version for responses; the
/// version ends at the first space.
fn classify_version(token: &[u8], terminated: bool, window: &[u8]) -> Result<Parsed, HeadError> {
    let (token, ended) = match token.iter().position(|&byte| byte == b' ') {
        Some(space) => (&token[..space], true),
        None => (token, terminated),
    };
    const PATTERN_LEN: usize = b"HTTP/1.1".len();
    let matches_prefix = token.len() <= PATTERN_LEN
        && token.iter().enumerate().all(|(index, &byte)| match index {
            0..=4 => byte == b"HTTP/"[index],
            5 | 7 => byte.is_ascii_digit(),
            _ => byte == b'.',
        });
    if !matches_prefix {
        return Err(HeadError::Malformed("invalid HTTP version"));
    }
    if token.len() == PATTERN_LEN && ended {
        return Err(HeadError::UnsupportedVersion);
    }
    if ended {
        return Err(HeadError::Malformed("invalid HTTP version"));
    }
    // Still a plausible `HTTP/x.y`: wait for the rest so that the verdict does not depend on
    // how the bytes were split across reads.
    partial(window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_case_sensitive() {
        assert_eq!(Method::from_bytes(b"GET"), Method::Get);
        assert_eq!(Method::from_bytes(b"get"), Method::Other);
        assert_eq!(Method::from_bytes(b"CONNECT"), Method::Connect);
        assert_eq!(Method::from_bytes(b"PROPFIND"), Method::Other);
    }

    #[test]
    fn version_classification() {
        let window = b"whatever";
        let cases: &[(&[u8], bool, Result<Parsed, HeadError>)] = &[
            (b"HTTP/2.0", true, Err(HeadError::UnsupportedVersion)),
            (
                b"HTTP/2.0 200 OK",
                false,
                Err(HeadError::UnsupportedVersion),
            ),
            (b"HTTP/2", false, Ok(Parsed::Partial)),
            (
                b"HTTP/2",
                true,
                Err(HeadError::Malformed("invalid HTTP version")),
            ),
            (b"HTTP/2.", false, Ok(Parsed::Partial)),
            (
                b"HTTP/22",
                false,
                Err(HeadError::Malformed("invalid HTTP version")),
            ),
            (
                b"HTTP/1.10",
                true,
                Err(HeadError::Malformed("invalid HTTP version")),
            ),
            (
                b"http/2.0",
                true,
                Err(HeadError::Malformed("invalid HTTP version")),
            ),
            (b"", false, Ok(Parsed::Partial)),
        ];
        for (token, terminated, expected) in cases {
            assert_eq!(
                classify_version(token, *terminated, window),
                *expected,
                "token {:?}",
                String::from_utf8_lossy(token)
            );
        }
    }

    #[test]
    fn persistence_rules() {
        let none = ConnectionTokens::default();
        let close = ConnectionTokens {
            close: true,
            ..ConnectionTokens::default()
        };
        let keep = ConnectionTokens {
            keep_alive: true,
            ..ConnectionTokens::default()
        };
        assert!(none.persistent(Version::Http11));
        assert!(!none.persistent(Version::Http10));
        assert!(!close.persistent(Version::Http11));
        assert!(keep.persistent(Version::Http10));
        let both = ConnectionTokens {
            close: true,
            keep_alive: true,
            upgrade: false,
        };
        assert!(!both.persistent(Version::Http10));
    }
}
