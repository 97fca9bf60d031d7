//! Whether an attempt that failed may be offered to another pod. Pure.
//!
//! A request is never replayed once any byte of it may have been taken by a pod that serves
//! it. The one exception so far: a pod that answered in the name of another revision (its IP
//! was reused) never served this request, so a request that can be sent again unchanged (no
//! body, no upgrade: its head is kept) goes to another pod.

use crate::upstream::error::UpstreamError;

/// Most further pods a request is offered to after its first attempt.
pub const MAX_RETRIES: u32 = 3;

/// Whether attempt number `attempt` (the first is 1), which failed with `error`, may be
/// followed by another. `replayable`: the request can be sent again as it was.
pub fn may_retry(attempt: u32, error: &UpstreamError, replayable: bool) -> bool {
    matches!(error, UpstreamError::IpReused { .. }) && replayable && attempt <= MAX_RETRIES
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::error::TransportCause;

    #[test]
    fn only_a_replayable_request_on_a_reused_ip_goes_to_another_pod_a_bounded_number_of_times() {
        let addr = "10.0.0.1:8012".parse().unwrap();
        let reused = UpstreamError::IpReused {
            addr,
            namespace: "ns".into(),
            revision: "other".into(),
        };
        let refused = UpstreamError::Connect {
            addr,
            cause: TransportCause::Refused,
        };
        let dropped = UpstreamError::ClosedBeforeResponse { addr };
        let rows: &[(&str, u32, &UpstreamError, bool, bool)] = &[
            ("reused, first attempt", 1, &reused, true, true),
            ("reused, third attempt", 3, &reused, true, true),
            ("reused, fourth attempt: gives up", 4, &reused, true, false),
            ("reused, with a body", 1, &reused, false, false),
            ("refused dial: not yet", 1, &refused, true, false),
            ("pod dropped the request: never", 1, &dropped, true, false),
        ];
        for &(name, attempt, error, replayable, expected) in rows {
            assert_eq!(may_retry(attempt, error, replayable), expected, "{name}");
        }
    }
}
