//! The queue-proxy registration endpoint on the data port (`POST /api/v1/pod-registration`):
//! checks the caller, reads a bounded body, hands it to the control thread and answers with
//! what the state worker made of it.

use std::rc::Rc;
use std::time::Duration;

use kactivator_api::{headers, registration};
use kactivator_h1::{BodyDecoder, BodyEvent, BodyKind};
use monoio::time::Instant;

use super::client::{answer_error, answer_locally, ClientConn, RequestMeta};
use super::rewrite::{ClientSide, LocalResponse};
use crate::request::outcome::{keeps_connection_after_answer, Next};
use crate::runtime::race::{race, Either};
use crate::runtime::shard::Shard;

pub(super) fn is_registration_path(target: &[u8]) -> bool {
    let path = target
        .iter()
        .position(|&byte| byte == b'?')
        .map_or(target, |query| &target[..query]);
    path == registration::PATH.as_bytes()
}

/// Longest wait for the rest of a registration body.
const REGISTRATION_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// `POST /api/v1/pod-registration` from a queue-proxy: check the caller, read the body (at most
/// 64 KiB), hand it to the control thread and answer with what it says once the state worker
/// has applied it. Other methods on the path are proxied like any request, as upstream does.
pub(super) async fn register_pod(
    shard: &Rc<Shard>,
    conn: &mut ClientConn,
    meta: RequestMeta,
) -> Next {
    let buf = conn.inbuf.data();
    let user_agent = registration::check_user_agent(conn.head.header(buf, headers::USER_AGENT));
    let relayed = conn.head.header(buf, headers::RELAYED).is_some();
    conn.inbuf.consume(conn.head.len);
    shard.stats().local_responses.increment();
    if let Err(error) = user_agent {
        return refuse(conn, meta, error).await;
    }
    let body = match read_small_body(shard, conn, meta.body, registration::MAX_BODY).await {
        Ok(body) => body,
        Err(SmallBodyError::TooLarge) => {
            return refuse(conn, meta, registration::RegistrationError::BodyTooLarge).await;
        }
        Err(SmallBodyError::Invalid) => {
            return refuse(conn, meta, registration::RegistrationError::InvalidBody).await;
        }
        Err(SmallBodyError::Gone) => return Next::Close,
    };
    let reply = shard.control.register(body, relayed).await;
    answer_locally(
        conn,
        &LocalResponse {
            status: reply.status,
            body: &reply.body,
            extra_header: reply.json.then_some((
                "Content-Type",
                registration::ACCEPTED_CONTENT_TYPE.as_bytes(),
            )),
            error_style: !reply.json,
        },
        ClientSide {
            version: meta.version,
            keep_alive: meta.keep_alive && !shard.draining.is_set(),
            head_only: false,
        },
    )
    .await
}

/// Refuses a registration with the fork's status and message; the body, unread, closes the
/// connection unless there was none.
async fn refuse(
    conn: &mut ClientConn,
    meta: RequestMeta,
    error: registration::RegistrationError,
) -> Next {
    let keep_alive = keeps_connection_after_answer(meta.shape(), false);
    answer_error(
        conn,
        meta,
        error.status(),
        error.body().as_bytes(),
        true,
        keep_alive,
    )
    .await
}

enum SmallBodyError {
    TooLarge,
    Invalid,
    Gone,
}

/// Reads a whole request body of at most `limit` bytes into memory.
async fn read_small_body(
    shard: &Shard,
    conn: &mut ClientConn,
    kind: BodyKind,
    limit: usize,
) -> Result<Vec<u8>, SmallBodyError> {
    if let BodyKind::Length(length) = kind {
        if length > limit as u64 {
            return Err(SmallBodyError::TooLarge);
        }
    }
    let deadline = Instant::now() + REGISTRATION_BODY_TIMEOUT;
    let mut decoder = BodyDecoder::new(kind);
    let mut body = Vec::new();
    loop {
        let (consumed, event) = decoder
            .decode(conn.inbuf.data())
            .map_err(|_| SmallBodyError::Invalid)?;
        let need_more = match event {
            Some(BodyEvent::Data(data)) => {
                if body.len() + data.len() > limit {
                    return Err(SmallBodyError::TooLarge);
                }
                body.extend_from_slice(data);
                false
            }
            Some(BodyEvent::End) => {
                conn.inbuf.consume(consumed);
                return Ok(body);
            }
            Some(BodyEvent::Trailers(_)) => false,
            None => true,
        };
        conn.inbuf.consume(consumed);
        if need_more {
            match race(conn.inbuf.fill(&mut conn.reader), shard.alarms.at(deadline)).await {
                Either::Left(Ok(read)) if read > 0 => {}
                _ => return Err(SmallBodyError::Gone),
            }
        }
    }
}
