//! Knative's request log: one line per request, rendered from the operator's Go template
//! (`logging.request-log-template`, in the queue-proxy's `SERVING_REQUEST_LOG_TEMPLATE`) by
//! the `kactivator-template` crate, and written to stdout by the [`sink`]'s thread.
//!
//! As upstream's `RequestLogHandler` (`pkg/http/request_log.go`), the line is written when the
//! request has ended, with the status and body size the client got and the time from the head's
//! arrival to the end; probes (a kubelet's user agent or `K-Kubelet-Probe`, any
//! `K-Network-Probe`) are left out unless probe logs are on. What the template reads of the
//! request is copied when the request starts ([`RequestLog::capture`]), before the request is
//! rewritten for the app: the line shows the request as the client sent it.

pub mod sink;

use std::ops::Range;
use std::time::Duration;

use kactivator_template::{
    fallback_line, HeadersRead, Input, Proto, Request, Response, Revision, Template,
};

use self::sink::Sink;
use super::headers::RequestHeaders;
use super::peer::Peer;
use super::probes;
use crate::metrics::Counter;

/// The request log's settings and its way out, shared by every shard.
#[derive(Debug)]
pub struct RequestLog {
    template: Template,
    revision: Revision,
    /// Probes are logged too (`SERVING_ENABLE_PROBE_REQUEST_LOG`).
    probes: bool,
    sink: Sink,
}

impl RequestLog {
    pub fn new(template: Template, revision: Revision, probes: bool, sink: Sink) -> RequestLog {
        RequestLog {
            template,
            revision,
            probes,
            sink,
        }
    }

    /// What this request's line needs, copied from the request as it arrived; `None` for a
    /// request that is not logged (a probe, with probe logs off).
    pub(crate) fn capture<H: RequestHeaders + ?Sized>(
        &self,
        fields: &H,
        line: RequestLine<'_>,
        each_header: impl FnOnce(&mut dyn FnMut(&[u8], &[u8])),
    ) -> Option<Captured> {
        if !self.probes && probes::is_probe(fields) {
            return None;
        }
        let mut captured = Captured {
            bytes: Vec::with_capacity(256),
            method: 0..0,
            target: 0..0,
            host: 0..0,
            remote: 0..0,
            headers: Vec::new(),
            proto: line.proto,
            content_length: line.content_length,
        };
        captured.method = captured.push(line.method);
        captured.target = captured.push(line.target);
        captured.host = captured.push(fields.authority().unwrap_or_default());
        let start = captured.bytes.len();
        line.peer.write_addr(&mut captured.bytes);
        captured.remote = span(start, captured.bytes.len());
        let wanted = self.template.headers_read();
        if !matches!(wanted, HeadersRead::None) {
            // As received: the template models what Go's server keeps of them.
            each_header(&mut |name, value| {
                if wanted.wants(name) {
                    let name = captured.push(name);
                    let value = captured.push(value);
                    captured.headers.push((name, value));
                }
            });
        }
        Some(captured)
    }

    /// Renders the line of a request that ended with `status`, `body_bytes` of response body,
    /// `latency` after its head arrived, and queues it; a line the full queue refuses is counted
    /// in `dropped`, the shard's `request_log_dropped`. A template that fails on this request
    /// gives upstream's "Invalid request log template" line instead.
    ///
    /// The counter comes in, not the shard: the shard's settings hold the log, so the log must
    /// not know the shard.
    pub(crate) fn write(
        &self,
        dropped: &Counter,
        captured: &Captured,
        status: u16,
        body_bytes: u64,
        latency: Duration,
    ) {
        let headers: Vec<(&[u8], &[u8])> = captured
            .headers
            .iter()
            .map(|(name, value)| (captured.slice(name), captured.slice(value)))
            .collect();
        let input = Input {
            request: Request {
                method: captured.slice(&captured.method),
                request_uri: captured.slice(&captured.target),
                proto: captured.proto,
                content_length: captured.content_length,
                host: captured.slice(&captured.host),
                remote_addr: captured.slice(&captured.remote),
                headers: &headers,
            },
            response: Response {
                code: status,
                size: body_bytes,
                latency_seconds: latency.as_secs_f64(),
            },
            revision: &self.revision,
        };
        let mut line = Vec::with_capacity(captured.bytes.len() + 256);
        if self.template.render(&input, &mut line).is_err() {
            line.clear();
            fallback_line(&input, &mut line);
        }
        if !self.sink.send(line) {
            dropped.increment();
        }
    }
}

/// The request line's part of a log line, as a front reads it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestLine<'a> {
    pub method: &'a [u8],
    /// As sent: HTTP/1's request-target, HTTP/2's `:path`.
    pub target: &'a [u8],
    pub proto: Proto,
    /// Go's `ContentLength`: the declared length, 0 without a body, -1 when unknown (chunked,
    /// or an HTTP/2 body without `content-length`).
    pub content_length: i64,
    pub peer: &'a Peer,
}

/// A request's fields for its log line, owned: the request is rewritten for the app before the
/// line is written.
#[derive(Debug)]
pub(crate) struct Captured {
    bytes: Vec<u8>,
    method: Range<u32>,
    target: Range<u32>,
    host: Range<u32>,
    remote: Range<u32>,
    headers: Vec<(Range<u32>, Range<u32>)>,
    proto: Proto,
    content_length: i64,
}

impl Captured {
    fn push(&mut self, data: &[u8]) -> Range<u32> {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(data);
        span(start, self.bytes.len())
    }

    fn slice(&self, range: &Range<u32>) -> &[u8] {
        self.bytes
            .get(range.start as usize..range.end as usize)
            .unwrap_or_default()
    }
}

/// A request head is at most 64 KiB (HTTP/2's header list a few MiB), far below `u32`.
fn span(start: usize, end: usize) -> Range<u32> {
    let narrow = |at: usize| u32::try_from(at).unwrap_or(u32::MAX);
    narrow(start)..narrow(end)
}
