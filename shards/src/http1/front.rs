//! HTTP/1's leaves of the request path (`lifecycle::Front`): the request's fields read
//! in place in the connection's buffer, the activator's answers written as HTTP/1 responses, a
//! queued client watched for readability, the head rewritten for a pod (`rewrite`), and an
//! attempt: a pooled or new connection to the pod and the exchange (`exchange`).

use std::rc::Rc;

use kactivator_api::{headers, registration};
use kactivator_h1::{BodyDecoder, BodyEvent, BodyKind, Method, Version};
use kactivator_template::Proto;
use monoio::io::OwnedReadHalf;
use monoio::time::Instant;

use super::client::{answer_locally, ClientConn, RequestMeta};
use super::exchange::{exchange, WATCH_LIMIT};
use super::rewrite::{self, ClientSide, H1Headers};
use super::to_h2;
use crate::lifecycle::admission::{ClientWatch, Held};
use crate::lifecycle::{Attempt, Front, Shape, SmallBody};
use crate::request::answer::Answer;
use crate::request::deadlines::Deadlines;
use crate::request::headers::RequestHeaders;
use crate::request::log::{Captured, RequestLine, RequestLog};
use crate::request::outcome::Next;
use crate::request::policy::{self, Edits, WaitNote};
use crate::request::trace::Decider;
use crate::routing::replica::LocalPod;
use crate::runtime::buffer::InBuf;
use crate::runtime::race::{race, Either};
use crate::runtime::stream::ByteStream;
use crate::runtime::tls::UpstreamTls;
use crate::shard::{PodStream, Shard};
use crate::upstream::error::UpstreamError;
use crate::upstream::pool::UpstreamConn;

/// One request on an HTTP/1 connection, as the request path sees it.
pub(super) struct H1Front<'c, S: ByteStream> {
    conn: &'c mut ClientConn<S>,
    meta: RequestMeta,
    shape: Shape,
    /// The head is still in the read buffer (the local answers read it).
    head_in_buffer: bool,
    /// Where the pod's `Host` line goes in the rewritten head; `None` when the head has its
    /// own (the queue-proxy's edits).
    host_at: Option<usize>,
}

impl<'c, S: ByteStream> H1Front<'c, S> {
    pub(super) fn new(conn: &'c mut ClientConn<S>) -> H1Front<'c, S> {
        let mut meta = RequestMeta::of(&conn.head);
        // Told to close while idle, just as this request arrived: it is the connection's last.
        meta.keep_alive &= !conn.close_after;
        let registration = meta.method == Method::Post
            && is_registration_path(conn.head.target.of(conn.inbuf.data()));
        H1Front {
            shape: Shape {
                connect: meta.method == Method::Connect,
                registration,
                head_only: meta.method == Method::Head,
                request: meta.shape(),
            },
            conn,
            meta,
            head_in_buffer: true,
            host_at: None,
        }
    }

    fn consume_head(&mut self) {
        if std::mem::take(&mut self.head_in_buffer) {
            self.conn.inbuf.consume(self.conn.head.len);
        }
    }
}

impl<S: ByteStream> Front for H1Front<'_, S> {
    type Headers<'h>
        = H1Headers<'h, S>
    where
        Self: 'h;
    type Watch<'w>
        = Watch<'w, S>
    where
        Self: 'w;

    #[inline]
    fn headers(&self) -> H1Headers<'_, S> {
        H1Headers::new(&self.conn.head, self.conn.inbuf.data())
    }

    #[inline]
    fn shape(&self) -> Shape {
        self.shape
    }

    fn capture_for_log(&self, log: &RequestLog) -> Option<Captured> {
        let head = &self.conn.head;
        let buf = self.conn.inbuf.data();
        let line = RequestLine {
            method: head.method_span.of(buf),
            target: head.target.of(buf),
            proto: match head.version {
                Version::Http10 => Proto::Http10,
                Version::Http11 => Proto::Http11,
            },
            content_length: match head.body {
                BodyKind::Length(length) => i64::try_from(length).unwrap_or(i64::MAX),
                BodyKind::Chunked | BodyKind::UntilClose => -1,
                BodyKind::Empty => 0,
            },
            peer: &self.conn.peer,
        };
        log.capture(&self.headers(), line, |visit| {
            for (name, value) in head.headers(buf) {
                visit(name, value);
            }
        })
    }

    async fn answer(&mut self, _shard: &Shard, answer: &Answer<'_>, keep_alive: bool) -> Next {
        self.consume_head();
        let client = ClientSide {
            version: self.meta.version,
            keep_alive,
            head_only: self.shape.head_only,
        };
        answer_locally(self.conn, answer, client).await
    }

    async fn read_small_body(
        &mut self,
        shard: &Shard,
        limit: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>, SmallBody> {
        self.consume_head();
        read_small_body(shard, self.conn, self.meta.body, limit, deadline).await
    }

    fn prepare(&mut self, edits: Edits, trace: Option<&mut Decider<'_>>) {
        let conn = &mut *self.conn;
        let buf = conn.inbuf.data();
        let fields = H1Headers::<S>::new(&conn.head, buf);
        conn.request_id.clear();
        if let Some(id) = policy::run_id(&fields).or_else(|| fields.get(headers::REQUEST_ID)) {
            conn.request_id.push_str(&String::from_utf8_lossy(id));
        }
        conn.request_out.clear();
        self.host_at = rewrite::write_request_head::<S>(
            &conn.head,
            buf,
            &conn.peer.ip,
            conn.peer.tls,
            edits,
            &mut conn.request_out,
            trace,
        );
        self.consume_head();
    }

    fn request_id(&self) -> &str {
        &self.conn.request_id
    }

    fn method_and_path(&self) -> (&str, &str) {
        // The head going out starts with the request line: `METHOD SP target SP HTTP/1.1`.
        let line = self
            .conn
            .request_out
            .split(|&b| b == b'\r')
            .next()
            .unwrap_or_default();
        let mut parts = line.splitn(3, |&b| b == b' ');
        let method = parts.next().unwrap_or_default();
        let target = parts.next().unwrap_or_default();
        let path = target.split(|&b| b == b'?').next().unwrap_or_default();
        fn text(bytes: &[u8]) -> &str {
            std::str::from_utf8(bytes).unwrap_or_default()
        }
        (text(method), text(path))
    }

    fn watch(&mut self) -> Watch<'_, S> {
        Watch {
            reader: &mut self.conn.reader,
            inbuf: &mut self.conn.inbuf,
        }
    }

    async fn attempt(
        &mut self,
        shard: &Rc<Shard>,
        pod: &Rc<LocalPod>,
        deadlines: &Deadlines,
        held: &mut Option<Held<'_>>,
        note: Option<&WaitNote>,
    ) -> Attempt {
        if pod.takes_http1_in_h2c() && !self.meta.upgrade {
            // Out of line and boxed, as the TLS path below.
            return Box::pin(attempt_in_h2(self, shard, pod, deadlines, held, note)).await;
        }
        let addr = pod.tracker.addr;
        let conn = &mut *self.conn;
        let meta = RequestMeta {
            note: note.copied(),
            ..self.meta
        };
        // The activator's edits leave the Host line to the pod's address; the queue-proxy's
        // wrote the client's.
        let host_line = self.host_at.map(|host_at| {
            let len =
                rewrite::insert_host(&mut conn.request_out, host_at, pod.authority().as_bytes());
            (host_at, len)
        });
        match pod.tls(conn.peer.tls) {
            None => {
                let upstream = shard
                    .pool
                    .checkout::<S>(&pod.idle_plain, addr, &(), shard.stats())
                    .await;
                exchange_on(shard, conn, pod, upstream, host_line, meta, deadlines, held).await
            }
            // Boxed and out of line: the plain path's future and code stay as they were
            // (BENCHMARKS.md, issue 38).
            Some(tls) => {
                Box::pin(attempt_tls(
                    shard, conn, pod, tls, host_line, meta, deadlines, held,
                ))
                .await
            }
        }
    }
}

/// An attempt on a pod that takes HTTP/1 clients' requests in HTTP/2
/// (`LocalPod::takes_http1_in_h2c`; not an upgrade, which HTTP/2 cannot carry as asked).
#[inline(never)]
async fn attempt_in_h2<S: ByteStream>(
    front: &mut H1Front<'_, S>,
    shard: &Rc<Shard>,
    pod: &Rc<LocalPod>,
    deadlines: &Deadlines,
    held: &mut Option<Held<'_>>,
    note: Option<&WaitNote>,
) -> Attempt {
    let conn = &mut *front.conn;
    let meta = RequestMeta {
        note: note.copied(),
        ..front.meta
    };
    let host_line = front.host_at.map(|host_at| {
        let len = rewrite::insert_host(&mut conn.request_out, host_at, pod.authority().as_bytes());
        (host_at, len)
    });
    let attempt = to_h2::attempt(shard, conn, pod, meta, deadlines, held).await;
    if let (Attempt::Unreached(_) | Attempt::NotTaken { .. }, Some((host_at, len))) =
        (&attempt, host_line)
    {
        // Nothing reached the pod: the head goes back as it was before this pod's Host.
        rewrite::remove_host(&mut conn.request_out, host_at, len)
    }
    attempt
}

/// An attempt on a pod reached over TLS.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
async fn attempt_tls<S: ByteStream>(
    shard: &Rc<Shard>,
    conn: &mut ClientConn<S>,
    pod: &LocalPod,
    tls: Rc<UpstreamTls>,
    host_line: Option<(usize, usize)>,
    meta: RequestMeta,
    deadlines: &Deadlines,
    held: &mut Option<Held<'_>>,
) -> Attempt {
    let upstream = shard
        .tls_pool
        .checkout::<S>(&pod.idle_tls, pod.tracker.addr, &tls, shard.stats())
        .await;
    exchange_on(shard, conn, pod, upstream, host_line, meta, deadlines, held).await
}

/// The exchange over a pod connection checked out of the pool of its kind (plain or TLS), or
/// the attempt unreached when none could be had.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
async fn exchange_on<S: ByteStream, U: PodStream>(
    shard: &Rc<Shard>,
    conn: &mut ClientConn<S>,
    pod: &LocalPod,
    upstream: Result<UpstreamConn<U>, UpstreamError>,
    host_line: Option<(usize, usize)>,
    meta: RequestMeta,
    deadlines: &Deadlines,
    held: &mut Option<Held<'_>>,
) -> Attempt {
    let upstream = match upstream {
        Ok(upstream) => upstream,
        Err(error) => {
            // Nothing reached the pod: the head goes back as it was before this pod's Host.
            if let Some((host_at, len)) = host_line {
                rewrite::remove_host(&mut conn.request_out, host_at, len)
            }
            return Attempt::Unreached(error);
        }
    };
    let fresh = !upstream.reused;
    // The exchange is the largest state a connection goes through; it runs in a block of its
    // own so that waiting and idle connections do not carry its size (see `blocks`).
    let ended = shard
        .exchanges
        .place(exchange(
            shard,
            conn,
            U::idle(pod),
            upstream,
            meta,
            *deadlines,
            held,
        ))
        .await;
    Attempt::Ended { ended, fresh }
}

/// The client of an HTTP/1 request waiting for a slot: readable when bytes, a FIN or a reset
/// arrive; bytes (a body, a pipelined request) are kept, up to [`WATCH_LIMIT`].
pub(super) struct Watch<'a, S: ByteStream> {
    reader: &'a mut OwnedReadHalf<S>,
    inbuf: &'a mut InBuf,
}

impl<S: ByteStream> ClientWatch for Watch<'_, S> {
    fn parked(&mut self) {
        // Nothing is read while the request waits, so an empty read buffer goes back.
        self.inbuf.release_if_empty();
    }

    async fn readable(&self) {
        if self.inbuf.len() >= WATCH_LIMIT {
            // Enough is buffered; reading on would buffer without bound.
            std::future::pending::<()>().await;
        }
        let _ = S::readable(self.reader).await;
    }

    async fn absorb(&mut self) -> bool {
        matches!(self.inbuf.fill(self.reader).await, Ok(read) if read > 0)
    }
}

/// Whether a request target is the queue-proxy registration endpoint (query ignored).
fn is_registration_path(target: &[u8]) -> bool {
    let path = target
        .iter()
        .position(|&byte| byte == b'?')
        .map_or(target, |query| &target[..query]);
    path == registration::PATH.as_bytes()
}

/// Reads a whole request body of at most `limit` bytes into memory.
async fn read_small_body<S: ByteStream>(
    shard: &Shard,
    conn: &mut ClientConn<S>,
    kind: BodyKind,
    limit: usize,
    deadline: Instant,
) -> Result<Vec<u8>, SmallBody> {
    if let BodyKind::Length(length) = kind {
        if length > limit as u64 {
            return Err(SmallBody::TooLarge);
        }
    }
    let mut decoder = BodyDecoder::new(kind);
    let mut body = Vec::new();
    loop {
        let (consumed, event) = decoder
            .decode(conn.inbuf.data())
            .map_err(|_| SmallBody::Invalid)?;
        let need_more = match event {
            Some(BodyEvent::Data(data)) => {
                if body.len() + data.len() > limit {
                    return Err(SmallBody::TooLarge);
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
                _ => return Err(SmallBody::Gone),
            }
        }
    }
}
