//! The queue-proxy registration request (`POST /api/v1/pod-registration`): parsing and
//! validation of its JSON body, and the encoding used to relay an event to peer activators.
//!
//! Sans-IO: the data port reads at most [`MAX_BODY`] bytes, checks the user agent with
//! [`check_user_agent`], hands the body to [`parse`] and answers with either
//! [`ACCEPTED_BODY`] or the error's [`RegistrationError::status`] and
//! [`RegistrationError::body`].
//!
//! The checks run in the fork's order (decode, required fields, event type, pod IP) and fail
//! with the fork's messages, so a queue-proxy or a test written against the fork sees the same
//! answers. Where this module is stricter than the fork's `encoding/json` decoding, the
//! difference is listed on [`parse`].

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The request path, on the data port.
pub const PATH: &str = "/api/v1/pod-registration";

/// The only user agent allowed to register pods; anything else gets a 401.
pub const USER_AGENT: &str = "knative-queue-proxy";

/// Largest body accepted, in bytes. A queue-proxy's body is about 250 bytes; the fork had no
/// limit at all.
pub const MAX_BODY: usize = 64 * 1024;

/// Body of the 200 answer, byte for byte what the fork's `json.Encoder` writes (note the
/// trailing newline).
pub const ACCEPTED_BODY: &str = "{\"status\":\"accepted\"}\n";

/// Content type of [`ACCEPTED_BODY`].
pub const ACCEPTED_CONTENT_TYPE: &str = "application/json";

/// Content type of an error body, as Go's `http.Error` sends it.
pub use crate::messages::ERROR_CONTENT_TYPE;

/// What a queue-proxy pushes (`event_type` of the registration body).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueProxyEvent {
    /// The container started; not ready yet. No longer sent by the fork's QP, still accepted.
    Startup,
    /// The readiness probe started passing.
    Ready,
    /// The readiness probe started failing.
    NotReady,
    /// The pod got SIGTERM and is shutting down.
    Draining,
}

impl QueueProxyEvent {
    /// The `event_type` string on the wire, also the log label.
    pub fn wire_name(self) -> &'static str {
        match self {
            QueueProxyEvent::Startup => "startup",
            QueueProxyEvent::Ready => "ready",
            QueueProxyEvent::NotReady => "not-ready",
            QueueProxyEvent::Draining => "draining",
        }
    }

    /// Parses an `event_type`; exact match, as the fork's handler (anything else is a 400).
    pub fn from_wire_name(name: &str) -> Option<QueueProxyEvent> {
        match name {
            "startup" => Some(QueueProxyEvent::Startup),
            "ready" => Some(QueueProxyEvent::Ready),
            "not-ready" => Some(QueueProxyEvent::NotReady),
            "draining" => Some(QueueProxyEvent::Draining),
            _ => None,
        }
    }
}

/// One queue-proxy event about one pod, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The pod's name; only logged.
    pub pod_name: String,
    /// The pod's address without a port. An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) is
    /// stored as the IPv4 address, so it meets the informer's key for the same pod.
    pub pod_ip: IpAddr,
    /// Namespace of the revision.
    pub namespace: String,
    /// Name of the revision.
    pub revision: String,
    /// What happened.
    pub event: QueueProxyEvent,
    /// When the queue-proxy sent it (RFC 3339, as sent, not validated); only logged.
    pub timestamp: Option<String>,
}

/// Why a registration request is refused. Each variant is the fork's answer to the same
/// mistake, except [`RegistrationError::BodyTooLarge`], which the fork never gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegistrationError {
    /// The user agent is not exactly [`USER_AGENT`].
    InvalidUserAgent,
    /// The body is longer than [`MAX_BODY`].
    BodyTooLarge,
    /// Not a JSON object of strings (or empty, or not UTF-8, or with a duplicated key).
    InvalidBody,
    /// One of the five required fields is absent, `null` or empty.
    MissingFields,
    /// `event_type` is not one of the four known events.
    InvalidEventType,
    /// `pod_ip` is not a bare IP address a pod can have.
    InvalidPodIp,
}

impl RegistrationError {
    /// The HTTP status to answer with.
    pub fn status(self) -> u16 {
        match self {
            RegistrationError::InvalidUserAgent => 401,
            // 400 like every other refusal of the body. 413 is the textbook code, but a
            // queue-proxy treats every non-200 alike, so one code for "bad body" is simpler.
            RegistrationError::BodyTooLarge
            | RegistrationError::InvalidBody
            | RegistrationError::MissingFields
            | RegistrationError::InvalidEventType
            | RegistrationError::InvalidPodIp => 400,
        }
    }

    /// The fork's message, without a line end.
    pub fn message(self) -> &'static str {
        match self {
            RegistrationError::InvalidUserAgent => "Invalid User-Agent for pod registration",
            RegistrationError::BodyTooLarge => "Request body too large",
            RegistrationError::InvalidBody => "Invalid request body",
            RegistrationError::MissingFields => "Missing required fields",
            RegistrationError::InvalidEventType => {
                "Invalid event_type: must be 'startup', 'ready', 'not-ready', or 'draining'"
            }
            RegistrationError::InvalidPodIp => "Invalid pod_ip: must be a valid IP address",
        }
    }

    /// The response body: the message and a newline, as Go's `http.Error` writes it. Send it
    /// with [`ERROR_CONTENT_TYPE`].
    pub fn body(self) -> String {
        format!("{}\n", self.message())
    }
}

impl fmt::Display for RegistrationError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.message())
    }
}

impl std::error::Error for RegistrationError {}

/// Checks the `User-Agent` header (its first value, `None` when absent). The fork compares
/// the whole value, case-sensitively.
pub fn check_user_agent(value: Option<&[u8]>) -> Result<(), RegistrationError> {
    match value {
        Some(value) if value == USER_AGENT.as_bytes() => Ok(()),
        _ => Err(RegistrationError::InvalidUserAgent),
    }
}

/// The body as the queue-proxy sends it. Absent and `null` fields both become `None`, which
/// is what Go's decoder does for a string field (it stays empty).
#[derive(Deserialize)]
struct WireIn {
    pod_name: Option<String>,
    pod_ip: Option<String>,
    namespace: Option<String>,
    revision: Option<String>,
    event_type: Option<String>,
    timestamp: Option<String>,
}

/// The body we send to peers, fields in the queue-proxy's order.
#[derive(Serialize)]
struct WireOut<'a> {
    pod_name: &'a str,
    pod_ip: String,
    namespace: &'a str,
    revision: &'a str,
    event_type: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<&'a str>,
}

/// Parses and validates a registration body.
///
/// Accepts what the fork accepts, with these deliberate differences (all answered with
/// "Invalid request body" unless noted):
/// * a body over [`MAX_BODY`] bytes → [`RegistrationError::BodyTooLarge`] (400, "Request body too large");
/// * a duplicated key (Go keeps the last value; two parsers reading one body differently is
///   how smuggling starts, and we relay bodies to peers);
/// * bytes after the JSON value (Go's streaming decoder ignores them);
/// * invalid UTF-8 (Go substitutes U+FFFD);
/// * a control character in any string (no Kubernetes name or timestamp has one, and names
///   end up in logs and metric labels);
/// * a `/` in `namespace` or `revision` (no Kubernetes name has one, and a revision is keyed
///   `namespace/name`);
/// * a `pod_ip` no pod can have — unspecified (`0.0.0.0`, `::`), multicast or broadcast —
///   → [`RegistrationError::InvalidPodIp`]. Loopback stays valid: tests run pods on it.
///
/// `pod_ip` must be a bare address, as Go's `net.ParseIP` wants it: `10.0.0.1:8012`,
/// `[::1]` and `fe80::1%eth0` are invalid. The caller adds the revision's serving port.
///
/// Nesting costs no stack: a known field takes only a string, so anything nested there is
/// refused at its first byte, and serde_json skips an unknown field's value without
/// recursing. Nothing here panics, whatever the input.
pub fn parse(body: &[u8]) -> Result<Registration, RegistrationError> {
    if body.len() > MAX_BODY {
        return Err(RegistrationError::BodyTooLarge);
    }
    // serde's derived struct decoding also takes a JSON array, matching its elements to the
    // fields by position; Go only takes an object. A JSON value's kind is fixed by its first
    // non-whitespace byte, so looking at that byte is enough.
    let first = body
        .iter()
        .find(|&&byte| !matches!(byte, b' ' | b'\t' | b'\n' | b'\r'));
    if first == Some(&b'[') {
        return Err(RegistrationError::InvalidBody);
    }
    // `null` as the whole body decodes, in Go, to a struct of empty strings.
    let wire: Option<WireIn> =
        serde_json::from_slice(body).map_err(|_| RegistrationError::InvalidBody)?;
    let Some(wire) = wire else {
        return Err(RegistrationError::MissingFields);
    };
    let strings = [
        &wire.pod_name,
        &wire.pod_ip,
        &wire.namespace,
        &wire.revision,
        &wire.event_type,
        &wire.timestamp,
    ];
    if strings
        .iter()
        .any(|value| value.as_deref().is_some_and(has_control_character))
    {
        return Err(RegistrationError::InvalidBody);
    }

    let (Some(pod_name), Some(pod_ip), Some(namespace), Some(revision), Some(event_type)) = (
        non_empty(wire.pod_name),
        non_empty(wire.pod_ip),
        non_empty(wire.namespace),
        non_empty(wire.revision),
        non_empty(wire.event_type),
    ) else {
        return Err(RegistrationError::MissingFields);
    };
    if namespace.contains('/') || revision.contains('/') {
        return Err(RegistrationError::InvalidBody);
    }
    let event =
        QueueProxyEvent::from_wire_name(&event_type).ok_or(RegistrationError::InvalidEventType)?;
    let pod_ip = parse_pod_ip(&pod_ip).ok_or(RegistrationError::InvalidPodIp)?;
    Ok(Registration {
        pod_name,
        pod_ip,
        namespace,
        revision,
        event,
        timestamp: wire.timestamp,
    })
}

/// The JSON body for `registration`, in the shape [`parse`] reads (and a queue-proxy sends);
/// used to relay an event to peer activators.
pub fn encode(registration: &Registration) -> Vec<u8> {
    let wire = WireOut {
        pod_name: &registration.pod_name,
        pod_ip: registration.pod_ip.to_string(),
        namespace: &registration.namespace,
        revision: &registration.revision,
        event_type: registration.event.wire_name(),
        timestamp: registration.timestamp.as_deref(),
    };
    // Serialising a struct of strings into a Vec cannot fail: no I/O, no map with non-string
    // keys, no custom Serialize impl.
    serde_json::to_vec(&wire).expect("a struct of strings always serialises")
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|value| !value.is_empty())
}

fn has_control_character(value: &str) -> bool {
    value.chars().any(char::is_control)
}

fn parse_pod_ip(text: &str) -> Option<IpAddr> {
    let ip = text.parse::<IpAddr>().ok()?.to_canonical();
    let impossible = ip.is_unspecified()
        || ip.is_multicast()
        || matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    (!impossible).then_some(ip)
}

#[cfg(test)]
mod tests;
