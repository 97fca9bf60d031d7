//! The standard gRPC health check as the activator sends it to the pods of an h2c revision —
//! `POST /grpc.health.v1.Health/Check` with one message asking about the server as a whole —
//! and the few facts of gRPC over HTTP/2 needed to read the answer: the message framing, the
//! `grpc-status` trailer and the status codes. Nothing here does I/O.
//!
//! The messages are `proto/health.proto`, compiled by prost at build time.

use std::fmt;

use prost::Message;

/// The generated types of `proto/health.proto` (package `grpc.health.v1`).
#[allow(clippy::all, missing_docs)]
mod wire {
    include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
}

pub use wire::health_check_response::ServingStatus;
pub use wire::{HealthCheckRequest, HealthCheckResponse};

/// The path of the health check's unary call.
pub const CHECK_PATH: &str = "/grpc.health.v1.Health/Check";

/// `content-type` of a gRPC request; a gRPC response's starts with it too (it may go on with
/// `+proto` or parameters).
pub const CONTENT_TYPE: &str = "application/grpc";

/// gRPC requires `te: trailers` on every request: it tells servers the path carries trailers,
/// where the call's status travels.
pub const TE: &str = "te";
/// The value of [`TE`].
pub const TRAILERS: &str = "trailers";

/// The call's status code, in the trailers (or in the head of a trailers-only answer).
pub const STATUS: &str = "grpc-status";
/// The status's message, percent-encoded, beside [`STATUS`].
pub const MESSAGE: &str = "grpc-message";

/// A message on the wire: one byte saying whether it is compressed, then its length as four
/// big-endian bytes, then the message.
const FRAME_PREFIX: usize = 5;

/// The gRPC status codes the activator acts on (numbering of `google.rpc.Code`).
pub mod code {
    /// The call succeeded.
    pub const OK: u32 = 0;
    /// The server has no such method: for the health check, a server without the health
    /// service.
    pub const UNIMPLEMENTED: u32 = 12;
}

/// The name of a gRPC status code, for logs (`UNAVAILABLE`); `UNKNOWN_CODE` past the last one.
pub fn code_name(code: u32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|index| NAMES.get(index))
        .copied()
        .unwrap_or("UNKNOWN_CODE")
}

/// Whether a `content-type` value is gRPC's: `application/grpc`, alone or followed by `+…` or
/// `;…` (case-insensitive, as media types are).
pub fn is_grpc_content_type(value: &[u8]) -> bool {
    let prefix = CONTENT_TYPE.as_bytes();
    value.len() >= prefix.len()
        && value[..prefix.len()].eq_ignore_ascii_case(prefix)
        && matches!(value.get(prefix.len()), None | Some(b'+' | b';'))
}

/// A `grpc-status` value as a code: decimal digits only, nothing else around them.
pub fn parse_status(value: &[u8]) -> Option<u32> {
    if value.is_empty() || value.len() > 10 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// The body of a health check of the server as a whole: one uncompressed message frame holding
/// a `HealthCheckRequest` with the empty service name.
pub fn check_request() -> Vec<u8> {
    frame(&HealthCheckRequest::default())
}

/// `message` as one uncompressed gRPC message frame.
pub fn frame(message: &impl Message) -> Vec<u8> {
    let length = message.encoded_len();
    let mut framed = Vec::with_capacity(FRAME_PREFIX + length);
    framed.push(0);
    // A message over 4 GiB cannot be built here: the only ones framed are the health check's.
    framed.extend_from_slice(&u32::try_from(length).unwrap_or(u32::MAX).to_be_bytes());
    message
        .encode(&mut framed)
        .expect("a Vec grows to hold any message");
    framed
}

/// Why a body is not one health check answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// No message at all (fewer bytes than a frame's prefix).
    Empty { bytes: usize },
    /// The message is compressed, which the check never offered to accept.
    Compressed,
    /// The prefix declares another length than the bytes that follow it.
    Length { declared: u64, actual: usize },
    /// The message is not a `HealthCheckResponse`.
    Decode(String),
}

impl fmt::Display for FrameError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Empty { bytes } => write!(formatter, "no message ({bytes} bytes)"),
            FrameError::Compressed => write!(formatter, "a compressed message"),
            FrameError::Length { declared, actual } => write!(
                formatter,
                "a message of {declared} bytes declared, {actual} bytes sent"
            ),
            FrameError::Decode(error) => write!(formatter, "not a HealthCheckResponse: {error}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// The health check's answer from a response body: exactly one uncompressed message frame
/// holding a `HealthCheckResponse` (a unary call answers one message).
pub fn decode_check_response(body: &[u8]) -> Result<HealthCheckResponse, FrameError> {
    let Some((prefix, message)) = body.split_first_chunk::<FRAME_PREFIX>() else {
        return Err(FrameError::Empty { bytes: body.len() });
    };
    if prefix[0] != 0 {
        return Err(FrameError::Compressed);
    }
    let declared = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]);
    if u64::from(declared) != message.len() as u64 {
        return Err(FrameError::Length {
            declared: declared.into(),
            actual: message.len(),
        });
    }
    HealthCheckResponse::decode(message).map_err(|error| FrameError::Decode(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes, worked out by hand from the gRPC and protobuf encoding rules, so the test
    /// checks the generated code against the wire format rather than against itself.
    #[test]
    fn the_check_request_is_one_frame_of_an_empty_message() {
        // proto3 leaves the empty service name out: a zero-length message.
        assert_eq!(check_request(), [0, 0, 0, 0, 0]);
        let named = frame(&HealthCheckRequest {
            service: "echo".into(),
        });
        assert_eq!(named, [0, 0, 0, 0, 6, 0x0a, 4, b'e', b'c', b'h', b'o']);
    }

    #[test]
    fn answers_decode_to_their_serving_status() {
        // status = SERVING: field 1, varint 1.
        let serving = decode_check_response(&[0, 0, 0, 0, 2, 0x08, 1]).unwrap();
        assert_eq!(serving.status(), ServingStatus::Serving);
        let not_serving = decode_check_response(&[0, 0, 0, 0, 2, 0x08, 2]).unwrap();
        assert_eq!(not_serving.status(), ServingStatus::NotServing);
        // UNKNOWN is the default, left out of the wire: an empty message.
        let unknown = decode_check_response(&[0, 0, 0, 0, 0]).unwrap();
        assert_eq!(unknown.status(), ServingStatus::Unknown);
        assert_eq!(
            frame(&HealthCheckResponse {
                status: ServingStatus::Serving as i32
            }),
            [0, 0, 0, 0, 2, 0x08, 1]
        );
    }

    #[test]
    fn bodies_that_are_not_one_answer_are_refused() {
        let cases: [(&[u8], FrameError); 6] = [
            (&[], FrameError::Empty { bytes: 0 }),
            (&[0, 0, 0], FrameError::Empty { bytes: 3 }),
            (&[1, 0, 0, 0, 2, 0x08, 1], FrameError::Compressed),
            (
                &[0, 0, 0, 0, 3, 0x08, 1],
                FrameError::Length {
                    declared: 3,
                    actual: 2,
                },
            ),
            // Two messages: a unary answer has one.
            (
                &[0, 0, 0, 0, 2, 0x08, 1, 0, 0, 0, 0, 2, 0x08, 1],
                FrameError::Length {
                    declared: 2,
                    actual: 9,
                },
            ),
            (
                &[0, 0, 0, 0, 0, 0, 0, 0, 0],
                FrameError::Length {
                    declared: 0,
                    actual: 4,
                },
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(decode_check_response(body), Err(expected), "{body:?}");
        }
        // Not protobuf at all (a field of wire type 7).
        assert!(matches!(
            decode_check_response(&[0, 0, 0, 0, 1, 0x0f]),
            Err(FrameError::Decode(_))
        ));
    }

    #[test]
    fn content_types_and_statuses_are_read_strictly() {
        for (value, grpc) in [
            (&b"application/grpc"[..], true),
            (b"application/grpc+proto", true),
            (b"Application/GRPC; charset=utf-8", true),
            (b"application/grpc-web", false),
            (b"application/grpcx", false),
            (b"text/plain", false),
            (b"", false),
        ] {
            assert_eq!(is_grpc_content_type(value), grpc, "{value:?}");
        }
        for (value, code) in [
            (&b"0"[..], Some(0)),
            (b"12", Some(12)),
            (b"4294967295", Some(u32::MAX)),
            (b"4294967296", None),
            (b"99999999999", None),
            (b"", None),
            (b" 0", None),
            (b"+1", None),
            (b"ok", None),
        ] {
            assert_eq!(parse_status(value), code, "{value:?}");
        }
        assert_eq!(code_name(code::UNIMPLEMENTED), "UNIMPLEMENTED");
        assert_eq!(code_name(14), "UNAVAILABLE");
        assert_eq!(code_name(17), "UNKNOWN_CODE");
        assert_eq!(code_name(u32::MAX), "UNKNOWN_CODE");
    }
}
