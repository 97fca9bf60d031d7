//! Whether an attempt that failed may be offered to another pod. Pure.
//!
//! A request is never replayed once any byte of it may have been taken by a pod that serves
//! it. Two failures are not that:
//!
//! * ★ **The connection to the pod could not be made** (refused, unreachable, connect timeout):
//!   nothing was sent anywhere, body included (it is still with the client), so the request goes
//!   back to admission whatever its shape. `UpstreamError::Connect` and `ConnectTimeout` come
//!   only from a dial, before any byte is written (`upstream::pool::Pool::dial`). Not a TLS
//!   handshake the pod and we could not agree on (`TransportCause::TlsHandshake`: a certificate
//!   not trusted or for another name, no common version): the pod answered, and would answer
//!   the next attempt alike, so the client hears it at once, as upstream's activator answers 502
//!   without a retry (its `ReverseProxy` has none).
//! * **A pod's HTTP/2 connection refused the stream** (GOAWAY before it, REFUSED_STREAM): the
//!   pod processed none of it (RFC 9113 §8.7), so a request whose body the activator has not
//!   started to forward goes to another pod, or to a new connection to the same one.

use crate::upstream::error::{TransportCause, UpstreamError};

/// Most further pods a request is offered to after its first attempt.
pub const MAX_RETRIES: u32 = 3;

/// Whether attempt number `attempt` (the first is 1), which failed with `error`, may be
/// followed by another. `replayable`: the request can be sent again as it was.
pub fn may_retry(attempt: u32, error: &UpstreamError, replayable: bool) -> bool {
    let reached_no_pod = match error {
        UpstreamError::Connect { cause, .. } => *cause != TransportCause::TlsHandshake,
        UpstreamError::ConnectTimeout { .. } => true,
        UpstreamError::StreamRefused { .. } => replayable,
        _ => false,
    };
    reached_no_pod && attempt <= MAX_RETRIES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_that_reached_no_pod_goes_to_another_a_bounded_number_of_times() {
        let addr = "10.0.0.1:8012".parse().unwrap();
        let refused_stream = UpstreamError::StreamRefused {
            addr,
            detail: "stream refused".into(),
        };
        let refused = UpstreamError::Connect {
            addr,
            cause: TransportCause::Refused,
        };
        let timed_out = UpstreamError::ConnectTimeout {
            addr,
            after_ms: 5000,
        };
        let dropped = UpstreamError::ClosedBeforeResponse { addr };
        let tls_refused = UpstreamError::Connect {
            addr,
            cause: TransportCause::TlsHandshake,
        };
        let reset_while_sending = UpstreamError::Send {
            addr,
            cause: TransportCause::Reset,
        };
        let rows: &[(&str, u32, &UpstreamError, bool, bool)] = &[
            (
                "refused stream, first attempt",
                1,
                &refused_stream,
                true,
                true,
            ),
            (
                "refused stream, third attempt",
                3,
                &refused_stream,
                true,
                true,
            ),
            (
                "refused stream, fourth attempt: gives up",
                4,
                &refused_stream,
                true,
                false,
            ),
            (
                "refused stream, its body partly forwarded",
                1,
                &refused_stream,
                false,
                false,
            ),
            ("refused dial", 1, &refused, true, true),
            (
                "refused dial, with a body: nothing of it was sent",
                1,
                &refused,
                false,
                true,
            ),
            (
                "refused dial, fourth attempt: gives up",
                4,
                &refused,
                true,
                false,
            ),
            ("dial timed out", 3, &timed_out, false, true),
            ("pod dropped the request: never", 1, &dropped, true, false),
            (
                "TLS handshake refused: the pod would refuse again",
                1,
                &tls_refused,
                true,
                false,
            ),
            (
                "reset while sending: never",
                1,
                &reset_while_sending,
                true,
                false,
            ),
        ];
        for &(name, attempt, error, replayable, expected) in rows {
            assert_eq!(may_retry(attempt, error, replayable), expected, "{name}");
        }
    }
}
