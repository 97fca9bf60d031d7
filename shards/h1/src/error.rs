//! Typed failures of head parsing and body decoding, with the status a server should answer.

use std::fmt;

/// Why a head could not be accepted.
///
/// The framing variants encode deliberate anti-request-smuggling choices: whenever two hops
/// could disagree about where a request body ends, the request is refused rather than guessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// The head is longer than [`crate::MAX_HEAD_BYTES`].
    TooLarge,
    /// The head has more than [`crate::MAX_HEADERS`] fields.
    TooManyHeaders,
    /// The head is syntactically wrong; the text says where.
    Malformed(&'static str),
    /// A well-formed version that is not HTTP/1.0 or HTTP/1.1, such as `HTTP/2.0`.
    UnsupportedVersion,
    /// Content-Length is not a plain decimal number, overflows u64, or repeated values differ.
    InvalidContentLength,
    /// A request carries both Content-Length and Transfer-Encoding.
    ConflictingFraming,
    /// Transfer-Encoding that cannot be framed at all: an empty or malformed coding list, any
    /// message that applies chunked more than once, Transfer-Encoding on an HTTP/1.0 message
    /// (RFC 9112 §6.1 calls that faulty framing), or a request whose final coding is not a bare
    /// `chunked` (`gzip`, `chunked, identity`: RFC 9112 §6.3 makes that a 400).
    UnsupportedTransferEncoding,
    /// A well-formed request coding list that ends in `chunked` but applies another coding
    /// first, such as `gzip, chunked`: RFC 9112 §6.1 answers a coding the server does not
    /// implement with 501. Only chunked is implemented; a proxy that decoded nothing else and
    /// forwarded the rest could not promise the pod what it received.
    UnknownTransferCoding,
    /// An HTTP/1.1 request without a Host field (RFC 9112 §3.2).
    MissingHost,
    /// A request with more than one Host field, even with equal values (RFC 9112 §3.2): the
    /// routing key is ambiguous, so the request is never forwarded.
    DuplicateHost,
}

impl HeadError {
    /// The status a server should answer a request that failed this way with.
    ///
    /// For a response from upstream every variant means a bad gateway; the proxy decides that.
    pub fn status(&self) -> u16 {
        match self {
            HeadError::TooLarge | HeadError::TooManyHeaders => 431,
            HeadError::UnsupportedVersion => 505,
            HeadError::UnknownTransferCoding => 501,
            HeadError::Malformed(_)
            | HeadError::InvalidContentLength
            | HeadError::ConflictingFraming
            | HeadError::UnsupportedTransferEncoding
            | HeadError::MissingHost
            | HeadError::DuplicateHost => 400,
        }
    }
}

impl fmt::Display for HeadError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeadError::TooLarge => formatter.write_str("message head too large"),
            HeadError::TooManyHeaders => formatter.write_str("too many header fields"),
            HeadError::Malformed(what) => formatter.write_str(what),
            HeadError::UnsupportedVersion => formatter.write_str("unsupported HTTP version"),
            HeadError::InvalidContentLength => formatter.write_str("invalid content-length"),
            HeadError::ConflictingFraming => {
                formatter.write_str("both content-length and transfer-encoding present")
            }
            HeadError::UnsupportedTransferEncoding => {
                formatter.write_str("unsupported transfer-encoding")
            }
            HeadError::UnknownTransferCoding => {
                formatter.write_str("unknown transfer coding (only chunked is implemented)")
            }
            // Go's net/http wording.
            HeadError::MissingHost => formatter.write_str("missing required Host header"),
            HeadError::DuplicateHost => formatter.write_str("too many Host headers"),
        }
    }
}

impl std::error::Error for HeadError {}

/// Why a body could not be decoded. Every variant leaves the connection unusable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyError {
    /// The chunk-size line is not hex digits optionally followed by extensions, or overflows.
    InvalidChunkSize,
    /// Chunk data is not followed by CRLF.
    InvalidChunkTerminator,
    /// A chunk-size line, extensions included, exceeds [`crate::MAX_CHUNK_HEAD_BYTES`].
    ChunkHeadTooLong,
    /// The trailer section exceeds [`crate::MAX_TRAILER_BYTES`] or [`crate::MAX_HEADERS`] fields.
    TrailersTooLarge,
    /// The trailer section is not a valid list of field lines ending in CRLF.
    InvalidTrailers,
    /// The peer closed the connection before the body was complete.
    PrematureEnd,
}

impl fmt::Display for BodyError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            BodyError::InvalidChunkSize => "invalid chunk size",
            BodyError::InvalidChunkTerminator => "invalid chunk terminator",
            BodyError::ChunkHeadTooLong => "chunk size line too long",
            BodyError::TrailersTooLarge => "trailer section too large",
            BodyError::InvalidTrailers => "invalid trailer section",
            BodyError::PrematureEnd => "connection closed before the body was complete",
        })
    }
}

impl std::error::Error for BodyError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        assert_eq!(HeadError::TooLarge.status(), 431);
        assert_eq!(HeadError::TooManyHeaders.status(), 431);
        assert_eq!(HeadError::UnsupportedVersion.status(), 505);
        assert_eq!(HeadError::Malformed("x").status(), 400);
        assert_eq!(HeadError::ConflictingFraming.status(), 400);
        assert_eq!(HeadError::UnsupportedTransferEncoding.status(), 400);
        assert_eq!(HeadError::InvalidContentLength.status(), 400);
        assert_eq!(HeadError::UnknownTransferCoding.status(), 501);
        assert_eq!(HeadError::MissingHost.status(), 400);
        assert_eq!(HeadError::DuplicateHost.status(), 400);
    }

    #[test]
    fn messages() {
        assert_eq!(
            HeadError::Malformed("invalid header name").to_string(),
            "invalid header name"
        );
        assert_eq!(
            BodyError::InvalidChunkSize.to_string(),
            "invalid chunk size"
        );
        assert_eq!(HeadError::TooLarge.to_string(), "message head too large");
    }
}
