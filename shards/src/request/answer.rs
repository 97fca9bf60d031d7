//! The answers the activator gives itself (probes, unknown revisions, refusals, registrations,
//! errors, placeholders), as every front writes them: status, body, extra fields, and whether it
//! is an error in Go's `http.Error` style (`X-Content-Type-Options: nosniff`). Pure.

use kactivator_api::{messages, RevisionKey};

use super::error::RequestError;
use super::policy::WaitNote;

/// A response of the activator's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer<'a> {
    pub status: u16,
    pub body: &'a [u8],
    /// One more field, e.g. the echoed `K-Network-Hash` or a JSON `Content-Type`.
    pub extra_header: Option<(&'a str, &'a [u8])>,
    /// More fields of the answer's own, in order (a placeholder's, `routing::placeholder`); a
    /// `Content-Type` among them replaces the plain-text one.
    pub fields: &'a [(&'a str, &'a [u8])],
    /// An error in Go's `http.Error` style: plain text with `X-Content-Type-Options: nosniff`.
    pub error_style: bool,
    /// The revision answering (`X-Knative-Revision-Namespace`/`-Name`): a queue-proxy's
    /// health-check answers only.
    pub identity: Option<&'a RevisionKey>,
    /// The request waited in the queue first: the answer says so as a pod's response would
    /// (`policy::WaitNote`).
    pub wait: Option<&'a WaitNote>,
}

impl<'a> Answer<'a> {
    /// An error answer: plain text, Go's style.
    pub fn error(status: u16, body: &'a [u8]) -> Answer<'a> {
        Answer {
            status,
            body,
            extra_header: None,
            error_style: true,
            identity: None,
            fields: &[],
            wait: None,
        }
    }

    /// The answer to a request that failed with `error`; `body` is `error.body()`.
    pub fn of_error(error: &RequestError, body: &'a [u8]) -> Answer<'a> {
        Answer {
            status: error.status(),
            body,
            extra_header: None,
            error_style: error.go_error_style(),
            identity: None,
            fields: &[],
            wait: None,
        }
    }

    /// CONNECT refused: the activator routes by revision and is not a forward proxy.
    pub fn connect_refused() -> Answer<'static> {
        Answer {
            status: 405,
            body: messages::CONNECT_REFUSED.as_bytes(),
            extra_header: Some(("Allow", messages::CONNECT_REFUSED_ALLOW.as_bytes())),
            error_style: true,
            identity: None,
            fields: &[],
            wait: None,
        }
    }

    /// Whether the answer has a `Content-Type` of its own (else a body goes out as plain text).
    pub fn own_content_type(&self) -> bool {
        self.extra_header
            .iter()
            .chain(self.fields)
            .any(|(name, _)| name.eq_ignore_ascii_case("content-type"))
    }

    /// A request a panic ended before any of its answer was written.
    pub fn internal_error() -> Answer<'static> {
        Answer::error(500, messages::INTERNAL_ERROR.as_bytes())
    }
}
