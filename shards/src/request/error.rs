//! Why a request was not served by a pod, in one type that says whose fault it was. The status
//! and the body of the activator's own answer follow from it (pingora's
//! `ErrorSource::{Upstream, Downstream, Internal}`: 502 / 4xx / the activator's limits).

use std::borrow::Cow;
use std::fmt;

use kactivator_api::messages;
use kactivator_h1::BodyError;

use crate::upstream::error::UpstreamError;

/// Status recorded for requests whose client went away (nginx's convention); nothing is sent.
pub const CLIENT_CLOSED: u16 = 499;

/// Who a failed request is down to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The client: it left, or sent a body that cannot be decoded.
    Client,
    /// The pod: it could not be reached, failed mid-exchange, or is another revision now.
    Pod,
    /// The activator's own limits: a full queue, a timer, a revision no longer served.
    Activator,
}

impl Fault {
    /// The log label.
    pub fn label(self) -> &'static str {
        match self {
            Fault::Client => "client",
            Fault::Pod => "pod",
            Fault::Activator => "activator",
        }
    }
}

/// Why a request ended without a response from a pod (or with a broken one).
#[derive(Debug)]
pub enum RequestError {
    /// The client closed or reset its connection (or stream).
    ClientGone,
    /// The client's body framing was invalid. Answered with a 400 naming the fault while
    /// nothing of the pod's response has reached the client.
    InvalidBody(BodyError),
    /// The revision's queue, or the process-wide cap on waiting requests, is full.
    QueueFull,
    /// A request timer fired before anything was written to the client.
    TimedOut,
    /// The revision left routing while the request waited for it.
    RevisionGone,
    /// Talking to the pod failed. Boxed: errors are rare, and a small error keeps every
    /// request's outcome small (it is moved through the exchange's return on every request).
    Upstream(Box<UpstreamError>),
}

impl RequestError {
    pub fn fault(&self) -> Fault {
        match self {
            RequestError::ClientGone | RequestError::InvalidBody(_) => Fault::Client,
            RequestError::QueueFull | RequestError::TimedOut | RequestError::RevisionGone => {
                Fault::Activator
            }
            RequestError::Upstream(_) => Fault::Pod,
        }
    }

    /// The status recorded, and answered when nothing was written to the client yet.
    pub fn status(&self) -> u16 {
        match self {
            RequestError::ClientGone => CLIENT_CLOSED,
            RequestError::InvalidBody(_) => 400,
            RequestError::QueueFull | RequestError::RevisionGone => 503,
            RequestError::TimedOut => 504,
            RequestError::Upstream(_) => 502,
        }
    }

    /// Whether the client is sent an answer at all (not when it is gone).
    pub fn is_answered(&self) -> bool {
        !matches!(self, RequestError::ClientGone)
    }

    /// The body of the activator's answer: upstream's text for its own errors, the cause for a
    /// pod's.
    pub fn body(&self) -> Cow<'static, [u8]> {
        match self {
            RequestError::QueueFull => Cow::Borrowed(messages::QUEUE_FULL.as_bytes()),
            RequestError::TimedOut => Cow::Borrowed(messages::TIMEOUT.as_bytes()),
            RequestError::RevisionGone => Cow::Borrowed(messages::REVISION_GONE.as_bytes()),
            RequestError::ClientGone => Cow::Borrowed(b""),
            // As the answer to a broken head: status, reason, what is wrong.
            RequestError::InvalidBody(error) => {
                Cow::Owned(format!("400 Bad Request: {error}\n").into_bytes())
            }
            RequestError::Upstream(error) => Cow::Owned(format!("{error}\n").into_bytes()),
        }
    }

    /// Whether the answer is written as Go's `http.Error` writes it (upstream's timeout handler
    /// writes its 504 without `X-Content-Type-Options`).
    pub fn go_error_style(&self) -> bool {
        !matches!(self, RequestError::TimedOut)
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::ClientGone => f.write_str("the client went away"),
            RequestError::InvalidBody(error) => {
                write!(f, "the client's body framing is invalid: {error}")
            }
            RequestError::QueueFull => f.write_str("pending request queue full"),
            RequestError::TimedOut => f.write_str("activator request timeout"),
            RequestError::RevisionGone => f.write_str("revision is no longer served"),
            RequestError::Upstream(error) => error.fmt(f),
        }
    }
}

impl From<UpstreamError> for RequestError {
    fn from(error: UpstreamError) -> RequestError {
        RequestError::Upstream(Box::new(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::error::TransportCause;

    #[test]
    fn each_error_names_its_fault_status_and_body() {
        let addr = "10.0.3.7:8012".parse().unwrap();
        let refused = UpstreamError::Connect {
            addr,
            cause: TransportCause::Refused,
        };
        let rows: Vec<(RequestError, Fault, u16, bool, &[u8])> = vec![
            (RequestError::ClientGone, Fault::Client, 499, false, b""),
            (
                RequestError::InvalidBody(BodyError::InvalidChunkSize),
                Fault::Client,
                400,
                true,
                b"400 Bad Request: invalid chunk size\n",
            ),
            (
                RequestError::QueueFull,
                Fault::Activator,
                503,
                true,
                b"pending request queue full\n",
            ),
            (
                RequestError::TimedOut,
                Fault::Activator,
                504,
                true,
                b"activator request timeout",
            ),
            (
                RequestError::RevisionGone,
                Fault::Activator,
                503,
                true,
                b"revision is no longer served\n",
            ),
            (
                RequestError::from(refused),
                Fault::Pod,
                502,
                true,
                b"dial 10.0.3.7:8012: connection refused\n",
            ),
        ];
        for (error, fault, status, answered, body) in rows {
            assert_eq!(error.fault(), fault, "{error}");
            assert_eq!(error.status(), status, "{error}");
            assert_eq!(error.is_answered(), answered, "{error}");
            assert_eq!(&*error.body(), body, "{error}");
        }
        assert!(!RequestError::TimedOut.go_error_style());
        assert!(RequestError::QueueFull.go_error_style());
    }
}
