//! How a request ends: from what the front saw of the exchange (or of the wait before it) to
//! the status recorded, whether the activator writes an answer of its own, and whether the
//! client connection carries another request. Pure, and the same for every front.

use super::error::RequestError;

/// What happens to the client connection after a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    KeepAlive,
    Close,
}

/// What the front knows about the request from its head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestShape {
    /// The client asked to keep the connection (HTTP/1.1 default, `Connection: keep-alive`).
    pub keep_alive: bool,
    /// The request has no body at all.
    pub bodiless: bool,
    /// The request asked for a protocol upgrade.
    pub upgrade: bool,
}

/// How the exchange ended, as the front saw it.
#[derive(Debug)]
pub enum Ended {
    /// The pod's response went to the client up to its end.
    Relayed {
        status: u16,
        /// The response's framing and the drain state allow another request on the connection.
        response_keep_alive: bool,
        /// The whole request (body included) reached the pod.
        request_complete: bool,
        /// The response's last bytes were written to the client.
        tail_written: bool,
        /// The response body's payload bytes relayed (framing excluded).
        body_bytes: u64,
    },
    /// The pod switched protocols and the two-way copy has ended.
    Upgraded,
    /// The response started but could not finish: the client has a partial response.
    Truncated { status: u16, body_bytes: u64 },
    /// Nothing was written to the client. `request_complete`: the request body was read to its
    /// end (only then may the connection carry another request).
    Failed {
        error: RequestError,
        request_complete: bool,
    },
}

/// What the front does next.
#[derive(Debug)]
pub enum Concluded {
    /// Record `status`; nothing more to write. `body_bytes`: the response body the client got.
    Done {
        status: u16,
        body_bytes: u64,
        next: Next,
    },
    /// Answer with `error`'s status and body (and record it). The connection stays open for
    /// another request only if `keep_alive` and the answer was written.
    Answer {
        error: RequestError,
        keep_alive: bool,
    },
}

/// Decides the end of a request. The rules:
///
/// * a relayed response keeps the connection only if the response allows it, the whole request
///   reached the pod, the client is still there and the tail was written;
/// * an upgrade or a truncated response closes the connection (the client has what it has);
/// * a client that left is recorded and its connection closed, with nothing written;
/// * any other failure is answered by the activator; the connection stays only if the client
///   wants it, no body remains unread in it, and it was not an upgrade request.
pub fn conclude(request: RequestShape, ended: Ended) -> Concluded {
    match ended {
        Ended::Relayed {
            status,
            response_keep_alive,
            request_complete,
            tail_written,
            body_bytes,
        } => {
            // A client that left while the response was relayed ends as `Failed { ClientGone }`
            // once the pod is done (see the fronts' exchanges), never as relayed.
            let keep = response_keep_alive && request_complete && tail_written;
            Concluded::Done {
                status,
                body_bytes,
                next: if keep { Next::KeepAlive } else { Next::Close },
            }
        }
        Ended::Upgraded => Concluded::Done {
            status: 101,
            body_bytes: 0,
            next: Next::Close,
        },
        Ended::Truncated { status, body_bytes } => Concluded::Done {
            status,
            body_bytes,
            next: Next::Close,
        },
        Ended::Failed { error, .. } if !error.is_answered() => Concluded::Done {
            status: error.status(),
            body_bytes: 0,
            next: Next::Close,
        },
        Ended::Failed {
            error,
            request_complete,
        } => Concluded::Answer {
            error,
            keep_alive: keeps_connection_after_answer(request, request_complete),
        },
    }
}

/// Whether a connection may carry another request after the activator answered this one
/// itself: the client wants it, no body of this request is left unread in the connection, and
/// it was not an upgrade request (whose bytes after the head belong to another protocol).
pub fn keeps_connection_after_answer(request: RequestShape, request_complete: bool) -> bool {
    request.keep_alive && (request_complete || request.bodiless) && !request.upgrade
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::error::UpstreamError;

    const GET: RequestShape = RequestShape {
        keep_alive: true,
        bodiless: true,
        upgrade: false,
    };
    const POST: RequestShape = RequestShape {
        keep_alive: true,
        bodiless: false,
        upgrade: false,
    };
    const GET_CLOSE: RequestShape = RequestShape {
        keep_alive: false,
        bodiless: true,
        upgrade: false,
    };
    const UPGRADE: RequestShape = RequestShape {
        keep_alive: true,
        bodiless: true,
        upgrade: true,
    };

    fn relayed(response_keep_alive: bool, request_complete: bool, tail_written: bool) -> Ended {
        Ended::Relayed {
            status: 200,
            response_keep_alive,
            request_complete,
            tail_written,
            body_bytes: 0,
        }
    }

    fn failed(error: RequestError, request_complete: bool) -> Ended {
        Ended::Failed {
            error,
            request_complete,
        }
    }

    fn dial_refused() -> RequestError {
        RequestError::from(UpstreamError::Connect {
            addr: "10.0.0.1:8012".parse().unwrap(),
            cause: crate::upstream::error::TransportCause::Refused,
        })
    }

    /// What a row expects: the status recorded, whether the activator writes an answer, and
    /// whether the connection may carry another request.
    type Verdict = (u16, bool, bool);

    fn verdict(concluded: &Concluded) -> Verdict {
        match concluded {
            Concluded::Done { status, next, .. } => (*status, false, *next == Next::KeepAlive),
            Concluded::Answer { error, keep_alive } => (error.status(), true, *keep_alive),
        }
    }

    #[test]
    fn the_body_size_recorded_is_what_reached_the_client() {
        let sizes = [
            (
                Ended::Relayed {
                    status: 200,
                    response_keep_alive: true,
                    request_complete: true,
                    tail_written: true,
                    body_bytes: 1234,
                },
                1234,
            ),
            (
                Ended::Truncated {
                    status: 200,
                    body_bytes: 99,
                },
                99,
            ),
            (Ended::Upgraded, 0),
            (failed(RequestError::ClientGone, true), 0),
        ];
        for (ended, expected) in sizes {
            match conclude(GET, ended) {
                Concluded::Done { body_bytes, .. } => assert_eq!(body_bytes, expected),
                other => panic!("expected Done, got {other:?}"),
            }
        }
    }

    #[test]
    fn every_way_an_exchange_ends_has_one_status_answer_and_next_step() {
        use RequestError::*;
        let rows: Vec<(&str, RequestShape, Ended, Verdict)> = vec![
            (
                "relayed, all well",
                GET,
                relayed(true, true, true),
                (200, false, true),
            ),
            (
                "relayed, response closes",
                GET,
                relayed(false, true, true),
                (200, false, false),
            ),
            (
                "relayed before the body was all sent",
                POST,
                relayed(true, false, true),
                (200, false, false),
            ),
            (
                "relayed, tail not written",
                GET,
                relayed(true, true, false),
                (200, false, false),
            ),
            ("upgraded", UPGRADE, Ended::Upgraded, (101, false, false)),
            (
                "truncated",
                GET,
                Ended::Truncated {
                    status: 200,
                    body_bytes: 10,
                },
                (200, false, false),
            ),
            (
                "client gone",
                GET,
                failed(ClientGone, true),
                (499, false, false),
            ),
            (
                "client body invalid",
                POST,
                failed(
                    InvalidBody(kactivator_h1::BodyError::InvalidChunkSize),
                    false,
                ),
                (400, true, false),
            ),
            (
                "queue full, bodiless",
                GET,
                failed(QueueFull, false),
                (503, true, true),
            ),
            (
                "queue full, body unread",
                POST,
                failed(QueueFull, false),
                (503, true, false),
            ),
            (
                "queue full, client closes",
                GET_CLOSE,
                failed(QueueFull, false),
                (503, true, false),
            ),
            (
                "timed out waiting",
                GET,
                failed(TimedOut, false),
                (504, true, true),
            ),
            (
                "timed out after the body was sent",
                POST,
                failed(TimedOut, true),
                (504, true, true),
            ),
            (
                "revision gone",
                POST,
                failed(RevisionGone, false),
                (503, true, false),
            ),
            (
                "dial refused, bodiless",
                GET,
                failed(dial_refused(), false),
                (502, true, true),
            ),
            (
                "pod failed after the body was sent",
                POST,
                failed(dial_refused(), true),
                (502, true, true),
            ),
            (
                "pod failed with body left",
                POST,
                failed(dial_refused(), false),
                (502, true, false),
            ),
            (
                "an upgrade request is never kept",
                UPGRADE,
                failed(dial_refused(), true),
                (502, true, false),
            ),
        ];
        for (name, request, ended, expected) in rows {
            assert_eq!(verdict(&conclude(request, ended)), expected, "{name}");
        }
    }
}
