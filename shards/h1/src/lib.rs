//! Sans-IO HTTP/1.x framing: request and response heads, body decoding and encoding.
//!
//! Nothing here reads or writes a socket. Callers hand in the bytes they have and get back
//! either a parsed head (as byte spans into their own buffer), a request for more bytes, or a
//! typed error. Body bytes are never copied by the decoder: data events borrow from the input.
//!
//! Head parsing rules worth knowing (RFC 9112):
//! * Empty lines (CRLF or bare LF) before a request line or status line are skipped, in any
//!   number; they count towards [`RequestHead::len`] and [`MAX_HEAD_BYTES`].
//! * Bare LF is accepted as a line terminator in heads (RFC 9112 §2.2 allows it, and the
//!   upstreams a proxy talks to accept it too); a bare CR is rejected. Chunked framing lines and
//!   trailers are stricter and demand CRLF, because those bytes are forwarded verbatim.
//! * Obsolete line folding is rejected, header names must be tokens, whitespace between a field
//!   name and the colon is rejected.
//! * Request framing follows §6.3 with the anti-smuggling choices documented on [`HeadError`];
//!   a request whose final coding is not `chunked` is a 400 (§6.3), and of the transfer codings
//!   only a single `chunked` is implemented, so `gzip, chunked` is a 501.
//! * An HTTP/1.1 request needs exactly one Host field, any request at most one; the authority
//!   of an absolute-form target wins over it ([`RequestHead::authority`]).
//! * `HTTP/1.2` to `HTTP/1.9` request lines are read as HTTP/1.1 (RFC 9110 §2.5); other
//!   well-formed versions are [`HeadError::UnsupportedVersion`].
//!
//! The decode loop a connection runs, here over bytes that are all present already:
//!
//! ```
//! use kactivator_h1::{parse_request, BodyDecoder, BodyEvent, BodyKind, Parsed, RequestHead};
//!
//! let mut buffer = b"POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n\
//!                    5\r\nhello\r\n0\r\n\r\nGET /next HTTP/1.1\r\nHost: h\r\n\r\n"
//!     .to_vec();
//! let mut head = RequestHead::default();
//! assert_eq!(parse_request(&buffer, &mut head), Ok(Parsed::Complete));
//! assert_eq!(head.body, BodyKind::Chunked);
//! buffer.drain(..head.len);
//!
//! let mut decoder = BodyDecoder::new(head.body);
//! let mut body = Vec::new();
//! loop {
//!     let (consumed, event) = decoder.decode(&buffer)?;
//!     let idle = consumed == 0 && event.is_none();
//!     let ended = event == Some(BodyEvent::End);
//!     match event {
//!         Some(BodyEvent::Data(data)) => body.extend_from_slice(data),
//!         Some(BodyEvent::Trailers(_)) | Some(BodyEvent::End) | None => {}
//!     }
//!     // End may come with consumed framing (the last chunk), so drain before stopping.
//!     buffer.drain(..consumed);
//!     if ended {
//!         break;
//!     }
//!     if idle {
//!         unreachable!("a real connection would read more bytes here");
//!     }
//! }
//! assert_eq!(body, b"hello");
//! // The decoder left the pipelined request alone.
//! assert!(buffer.starts_with(b"GET /next"));
//! # Ok::<(), kactivator_h1::BodyError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod date;
mod decode;
mod encode;
mod error;
mod fields;
mod head;
mod request;
mod response;
mod span;

pub use decode::{BodyDecoder, BodyEvent, MAX_CHUNK_HEAD_BYTES, MAX_TRAILER_BYTES};
pub use encode::{
    chunk_size_line, encode_chunk, encode_chunk_end, encode_chunk_header, encode_last_chunk,
    ChunkSizeLine, CRLF,
};
pub use error::{BodyError, HeadError};
pub use fields::list_has_element;
pub use head::{BodyKind, ConnectionTokens, Method, Parsed, Version};
pub use request::{parse_request, RequestHead};
pub use response::{parse_response, ResponseHead};
pub use span::{name_eq, HeaderSpan, Span};

/// A head larger than this is refused with [`HeadError::TooLarge`].
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// A head with more header fields than this is refused with [`HeadError::TooManyHeaders`].
pub const MAX_HEADERS: usize = 128;
