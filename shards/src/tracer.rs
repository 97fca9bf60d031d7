//! A shard's tracing (issue 39): whether it is on and with which sampler (the control thread's
//! `ShardCommand::Tracing`), the shard's own trace and span ids, and the spans of its sampled
//! requests, buffered here and handed to the control thread in batches through a bounded
//! channel: a full buffer or a full channel drops spans and counts them, never waits. Nothing
//! here is shared with another shard, and nothing runs for a request while tracing is off but
//! one flag read.

use std::cell::{Cell, RefCell};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kactivator_api::trace::span::{FinishedSpan, SpanBatch};
use kactivator_api::trace::{IdGenerator, Sampler};

use crate::request::trace::{self, Decided, Decider, Described, SpanNames, Timeline};

/// The most spans a shard keeps before it drops new ones (its part of the exporter's queue).
pub const MAX_BUFFERED_SPANS: usize = 2048;
/// A shard sends its spans once it has this many, or at its next flush.
pub const SPANS_PER_BATCH: usize = 256;
/// How often a shard sends what spans it has (`hub`'s flush task).
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// One shard's tracing.
pub struct ShardTracer {
    /// Tracing is on: the one thing read per request while it is off.
    on: Cell<bool>,
    state: RefCell<State>,
    names: SpanNames,
    sink: Option<flume::Sender<SpanBatch>>,
}

struct State {
    sampler: Option<Sampler>,
    ids: IdGenerator,
    spans: Vec<FinishedSpan>,
    /// Spans dropped since the last batch was taken.
    dropped: u64,
}

impl ShardTracer {
    /// Off until told otherwise; spans go to `sink` (none: nowhere, so tracing stays off).
    pub fn new(names: SpanNames, sink: Option<flume::Sender<SpanBatch>>) -> Self {
        Self {
            on: Cell::new(false),
            state: RefCell::new(State {
                sampler: None,
                ids: IdGenerator::from_random_seed(),
                spans: Vec::new(),
                dropped: 0,
            }),
            names,
            sink,
        }
    }

    /// Tracing from now on: `None` off.
    pub fn set_sampler(&self, sampler: Option<Sampler>) {
        let sampler = sampler.filter(|_| self.sink.is_some());
        self.on.set(sampler.is_some());
        self.state.borrow_mut().sampler = sampler;
    }

    /// Runs `prepare` (a front's rewrite of the request for its pod) with a [`Decider`] when
    /// tracing is on, and says what it decided.
    #[inline]
    pub fn decide(&self, prepare: impl FnOnce(Option<&mut Decider<'_>>)) -> Option<Decided> {
        if !self.on.get() {
            prepare(None);
            return None;
        }
        let mut state = self.state.borrow_mut();
        let State { sampler, ids, .. } = &mut *state;
        let Some(sampler) = *sampler else {
            prepare(None);
            return None;
        };
        let mut decider = Decider::new(ids, sampler);
        prepare(Some(&mut decider));
        decider.decided
    }

    /// Records the spans of a sampled request that ended `total` after its arrival.
    pub fn record(
        &self,
        decided: &Decided,
        timeline: &Timeline,
        described: &Described<'_>,
        total: Duration,
    ) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let arrival_unix_nanos = now.saturating_sub(total).as_nanos() as u64;
        let mut state = self.state.borrow_mut();
        let spans = trace::spans(
            self.names,
            decided,
            &mut state.ids,
            timeline,
            described,
            arrival_unix_nanos,
            total,
        );
        let room = MAX_BUFFERED_SPANS.saturating_sub(state.spans.len());
        if spans.len() > room {
            state.dropped += spans.len() as u64;
        } else {
            state.spans.extend(spans);
        }
        let full = state.spans.len() >= SPANS_PER_BATCH;
        drop(state);
        if full {
            self.flush();
        }
    }

    /// Sends what spans the shard has; a full channel keeps them for the next flush (and a
    /// full buffer then drops new ones, counted).
    pub fn flush(&self) {
        let Some(sink) = &self.sink else { return };
        let mut state = self.state.borrow_mut();
        if state.spans.is_empty() && state.dropped == 0 {
            return;
        }
        if sink.is_full() {
            return;
        }
        let batch = SpanBatch {
            spans: std::mem::take(&mut state.spans),
            dropped: std::mem::take(&mut state.dropped),
        };
        if let Err(error) = sink.try_send(batch) {
            // Full after all (another shard filled it) or the control thread is gone.
            let batch = error.into_inner();
            state.dropped += batch.dropped;
            if state.spans.is_empty() {
                state.spans = batch.spans;
            } else {
                state.dropped += batch.spans.len() as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::trace::Gathered;

    fn described() -> Described<'static> {
        Described {
            method: "GET",
            path: "/",
            namespace: "ns",
            revision: "r",
            status: 200,
            error: None,
            shard: 0,
        }
    }

    fn sampled(tracer: &ShardTracer) -> Decided {
        tracer
            .decide(|decider| {
                decider
                    .expect("tracing is on")
                    .decide(&Gathered::default(), |_, _| {});
            })
            .expect("decided")
    }

    #[test]
    fn off_it_lends_no_decider_and_without_a_sink_it_stays_off() {
        let (sink, _spans) = flume::bounded(4);
        let tracer = ShardTracer::new(SpanNames::Activator, Some(sink));
        assert_eq!(tracer.decide(|decider| assert!(decider.is_none())), None);
        let lonely = ShardTracer::new(SpanNames::Activator, None);
        lonely.set_sampler(Some(Sampler::new(1.0).unwrap()));
        assert_eq!(lonely.decide(|decider| assert!(decider.is_none())), None);
        tracer.set_sampler(Some(Sampler::new(1.0).unwrap()));
        assert!(sampled(&tracer).context.sampled);
        tracer.set_sampler(None);
        assert_eq!(tracer.decide(|decider| assert!(decider.is_none())), None);
    }

    #[test]
    fn spans_go_in_batches_and_a_full_channel_costs_spans_counted_never_a_wait() {
        let (sink, spans) = flume::bounded(1);
        let tracer = ShardTracer::new(SpanNames::Activator, Some(sink));
        tracer.set_sampler(Some(Sampler::new(1.0).unwrap()));
        let decided = sampled(&tracer);
        let timeline = Timeline::default();
        tracer.record(&decided, &timeline, &described(), Duration::from_millis(1));
        assert!(
            spans.is_empty(),
            "under a batch, nothing is sent until the flush"
        );
        tracer.flush();
        let first = spans.try_recv().unwrap();
        assert_eq!(
            first.spans.len(),
            2,
            "a request never admitted: handle, throttler_try"
        );
        assert_eq!(first.dropped, 0);
        // Fill the channel, then the buffer: what does not fit is counted.
        tracer.record(&decided, &timeline, &described(), Duration::from_millis(1));
        tracer.flush();
        for _ in 0..MAX_BUFFERED_SPANS {
            tracer.record(&decided, &timeline, &described(), Duration::from_millis(1));
        }
        let second = spans.try_recv().unwrap();
        assert_eq!(second.spans.len(), 2);
        tracer.flush();
        let third = spans.try_recv().unwrap();
        assert_eq!(third.spans.len(), MAX_BUFFERED_SPANS);
        assert_eq!(
            third.dropped as usize + third.spans.len(),
            2 * MAX_BUFFERED_SPANS,
            "every span recorded is either sent or counted"
        );
    }
}
