//! Response body types: generated pattern streams, paced streams, and the wrapper that
//! keeps a request counted as in flight until its body is finished.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use tokio::time::{Instant, Sleep};

use super::stats::InFlightGuard;
use crate::pattern::{pattern_frame, FRAME_SIZE};

/// Error type of every response body.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Type-erased body produced by the routes; one type lets every route share the handler.
pub(crate) type RouteBody = UnsyncBoxBody<Bytes, BoxError>;

/// A `text/plain` response with this status and body.
pub(crate) fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<RouteBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A body consisting of `data`, sent with a Content-Length.
pub(crate) fn full(data: impl Into<Bytes>) -> RouteBody {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A body with no bytes at all.
pub(crate) fn empty() -> RouteBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// The body hyper actually sends: a route body plus the guard that keeps the request in
/// `in_flight`.
///
/// The guard is released when the inner body reports its end, fails, or when hyper drops
/// the body (finished, or the connection died). Hyper drops or exhausts the body before it
/// flushes the final bytes, so once a client has read a complete response the request is
/// no longer counted.
pub(crate) struct InFlightBody {
    inner: RouteBody,
    guard: Option<InFlightGuard>,
}

impl InFlightBody {
    pub(crate) fn new(inner: RouteBody, guard: InFlightGuard) -> Self {
        Self {
            inner,
            guard: Some(guard),
        }
    }

    /// A body that counts nothing: for the queue-proxy's own probe answers, which never
    /// reach the user container.
    pub(crate) fn untracked(inner: RouteBody) -> Self {
        Self { inner, guard: None }
    }
}

impl Body for InFlightBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(context);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Pattern bytes generated on the fly in [`FRAME_SIZE`] frames, never held in full.
pub(crate) struct PatternBody {
    offset: u64,
    remaining: u64,
    /// Whether the length is advertised; without it hyper falls back to chunked encoding.
    advertise_length: bool,
}

impl PatternBody {
    /// `length` pattern bytes with a Content-Length.
    pub(crate) fn sized(length: u64) -> Self {
        Self {
            offset: 0,
            remaining: length,
            advertise_length: true,
        }
    }

    /// `length` pattern bytes without a Content-Length (chunked on the wire).
    pub(crate) fn chunked(length: u64) -> Self {
        Self {
            offset: 0,
            remaining: length,
            advertise_length: false,
        }
    }
}

impl Body for PatternBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let length = self.remaining.min(FRAME_SIZE as u64) as usize;
        let frame = pattern_frame(self.offset, length);
        self.offset += length as u64;
        self.remaining -= length as u64;
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        // In chunked mode never claim the end up front: for an empty body hyper would
        // otherwise write `Content-Length: 0` instead of the chunked encoding asked for.
        self.advertise_length && self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        if self.advertise_length {
            SizeHint::with_exact(self.remaining)
        } else {
            SizeHint::default()
        }
    }
}

/// Size of each frame of a [`SlowBody`].
pub(crate) const SLOW_FRAME_SIZE: usize = 1024;

/// Pattern bytes in 1 KiB frames with a pause between frames, for timeout and
/// disconnect tests.
pub(crate) struct SlowBody {
    frames_left: u64,
    offset: u64,
    interval: Duration,
    /// Armed after each frame; the next frame waits for it.
    pause: Option<Pin<Box<Sleep>>>,
}

impl SlowBody {
    pub(crate) fn new(frames: u64, interval: Duration) -> Self {
        Self {
            frames_left: frames,
            offset: 0,
            interval,
            pause: None,
        }
    }
}

impl Body for SlowBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.frames_left == 0 {
            return Poll::Ready(None);
        }
        if let Some(pause) = self.pause.as_mut() {
            ready!(pause.as_mut().poll(context));
        }
        let frame = pattern_frame(self.offset, SLOW_FRAME_SIZE);
        self.offset += SLOW_FRAME_SIZE as u64;
        self.frames_left -= 1;
        if self.frames_left > 0 {
            let deadline = Instant::now() + self.interval;
            match self.pause.as_mut() {
                Some(pause) => pause.as_mut().reset(deadline),
                None => self.pause = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.frames_left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.frames_left * SLOW_FRAME_SIZE as u64)
    }
}
