//! What can go wrong talking to a pod (every one of them a 502 when nothing was written to the
//! client yet), classified so that an operator can act on the message. Pure.

use std::fmt;
use std::io;
use std::net::SocketAddr;

/// What went wrong talking to a pod, phrased so an operator can act on it.
#[derive(Clone, Debug)]
pub enum UpstreamError {
    /// The TCP connection could not be made.
    Connect {
        addr: SocketAddr,
        cause: TransportCause,
    },
    /// Dialing did not finish in time.
    ConnectTimeout { addr: SocketAddr, after_ms: u64 },
    /// Sending the request failed.
    Send {
        addr: SocketAddr,
        cause: TransportCause,
    },
    /// The pod closed the connection before any response byte.
    ClosedBeforeResponse { addr: SocketAddr },
    /// Reading the response failed.
    Receive {
        addr: SocketAddr,
        cause: TransportCause,
    },
    /// The response head was not valid HTTP/1.
    MalformedResponse { addr: SocketAddr, reason: String },
    /// The pod answered 101 to a request that did not ask for an upgrade, or switched to a
    /// protocol other than the one requested.
    UnexpectedSwitch { addr: SocketAddr },
    /// The pod's HTTP/2 connection or stream failed without an I/O error: it reset the stream,
    /// went away (GOAWAY) or broke the protocol. `detail` is the `h2` crate's description.
    Http2 { addr: SocketAddr, detail: String },
    /// The pod's HTTP/2 connection did not take the stream (GOAWAY before it, or
    /// REFUSED_STREAM): by RFC 9113 §8.7 the pod did not process any of it.
    StreamRefused { addr: SocketAddr, detail: String },
}

impl UpstreamError {
    /// Whether this says something about the pod's health (it refused, reset or dropped us),
    /// as opposed to a protocol mix-up.
    pub fn is_pod_failure(&self) -> bool {
        match self {
            UpstreamError::Connect { .. }
            | UpstreamError::ConnectTimeout { .. }
            | UpstreamError::ClosedBeforeResponse { .. } => true,
            UpstreamError::Send { cause, .. } | UpstreamError::Receive { cause, .. } => {
                matches!(cause, TransportCause::Reset | TransportCause::Refused)
            }
            UpstreamError::MalformedResponse { .. }
            | UpstreamError::UnexpectedSwitch { .. }
            | UpstreamError::Http2 { .. }
            | UpstreamError::StreamRefused { .. } => false,
        }
    }
}

/// A transport failure, classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportCause {
    Refused,
    Reset,
    Unreachable,
    TimedOut,
    BrokenPipe,
    /// A TLS handshake one side refused (a certificate without the name asked for, an issuer
    /// not trusted, no common version): the cause is in the log, with the address dialled.
    TlsHandshake,
    Other(io::ErrorKind),
}

impl TransportCause {
    pub fn of(error: &io::Error) -> TransportCause {
        match error.kind() {
            io::ErrorKind::ConnectionRefused => TransportCause::Refused,
            io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => {
                TransportCause::Reset
            }
            io::ErrorKind::TimedOut => TransportCause::TimedOut,
            io::ErrorKind::BrokenPipe => TransportCause::BrokenPipe,
            io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable
            | io::ErrorKind::AddrNotAvailable => TransportCause::Unreachable,
            kind => match error.raw_os_error() {
                Some(libc::EHOSTUNREACH | libc::ENETUNREACH) => TransportCause::Unreachable,
                _ => TransportCause::Other(kind),
            },
        }
    }
}

impl fmt::Display for TransportCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportCause::Refused => f.write_str("connection refused"),
            TransportCause::Reset => f.write_str("connection reset by peer"),
            TransportCause::Unreachable => f.write_str("host unreachable"),
            TransportCause::TimedOut => f.write_str("timed out"),
            TransportCause::BrokenPipe => f.write_str("broken pipe"),
            TransportCause::TlsHandshake => f.write_str("TLS handshake failed (the log says why)"),
            TransportCause::Other(kind) => write!(f, "{kind}"),
        }
    }
}

impl UpstreamError {
    /// The pod's address refused the connection: nothing listens there.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            UpstreamError::Connect {
                cause: TransportCause::Refused,
                ..
            }
        )
    }

    /// A short label for metrics and logs.
    pub fn class(&self) -> &'static str {
        match self {
            UpstreamError::Connect {
                cause: TransportCause::Refused,
                ..
            } => "connect_refused",
            UpstreamError::Connect {
                cause: TransportCause::Unreachable,
                ..
            } => "connect_unreachable",
            UpstreamError::Connect { .. } => "connect_error",
            UpstreamError::ConnectTimeout { .. } => "connect_timeout",
            UpstreamError::Send { .. } => "send_error",
            UpstreamError::ClosedBeforeResponse { .. } => "closed_before_response",
            UpstreamError::Receive {
                cause: TransportCause::Reset,
                ..
            } => "reset",
            UpstreamError::Receive { .. } => "receive_error",
            UpstreamError::MalformedResponse { .. } => "malformed_response",
            UpstreamError::UnexpectedSwitch { .. } => "unexpected_switch",
            UpstreamError::Http2 { .. } => "http2_error",
            UpstreamError::StreamRefused { .. } => "stream_refused",
        }
    }
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamError::Connect { addr, cause } => write!(f, "dial {addr}: {cause}"),
            UpstreamError::ConnectTimeout { addr, after_ms } => {
                write!(f, "dial {addr}: timed out after {after_ms} ms")
            }
            UpstreamError::Send { addr, cause } => write!(f, "sending request to {addr}: {cause}"),
            UpstreamError::ClosedBeforeResponse { addr } => {
                write!(f, "reading response from {addr}: connection closed before a response was received")
            }
            UpstreamError::Receive { addr, cause } => {
                write!(f, "reading response from {addr}: {cause}")
            }
            UpstreamError::MalformedResponse { addr, reason } => {
                write!(f, "malformed response from {addr}: {reason}")
            }
            UpstreamError::UnexpectedSwitch { addr } => {
                write!(f, "{addr} switched protocols without being asked to")
            }
            UpstreamError::Http2 { addr, detail } => write!(f, "HTTP/2 with {addr}: {detail}"),
            UpstreamError::StreamRefused { addr, detail } => {
                write!(f, "{addr} refused the HTTP/2 stream: {detail}")
            }
        }
    }
}

impl std::error::Error for UpstreamError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_pod_and_the_cause() {
        let addr: SocketAddr = "10.0.3.7:8012".parse().unwrap();
        let refused = UpstreamError::Connect {
            addr,
            cause: TransportCause::of(&io::Error::from(io::ErrorKind::ConnectionRefused)),
        };
        assert_eq!(
            refused.to_string(),
            "dial 10.0.3.7:8012: connection refused"
        );
        assert_eq!(refused.class(), "connect_refused");
        let unreachable = io::Error::from_raw_os_error(libc::EHOSTUNREACH);
        assert_eq!(
            TransportCause::of(&unreachable),
            TransportCause::Unreachable
        );
        let closed = UpstreamError::ClosedBeforeResponse { addr };
        assert_eq!(
            closed.to_string(),
            "reading response from 10.0.3.7:8012: connection closed before a response was received"
        );
    }
}
