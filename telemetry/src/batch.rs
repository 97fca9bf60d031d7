//! The driver's sans-IO parts: the bounded queue of spans waiting for export, and the limit
//! on how often a failed export is logged. Time comes in as an argument.

use std::collections::VecDeque;
use std::time::Duration;

use kactivator_api::trace::span::FinishedSpan;
use tokio::time::Instant;

/// Spans waiting for export, at most `capacity`; the oldest go first.
pub(crate) struct SpanQueue {
    spans: VecDeque<FinishedSpan>,
    capacity: usize,
}

impl SpanQueue {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            spans: VecDeque::new(),
            capacity,
        }
    }

    /// Queues what fits of `spans` and answers how many did not (they are dropped: a full
    /// queue never waits).
    pub(crate) fn push(&mut self, spans: Vec<FinishedSpan>) -> u64 {
        let room = self.capacity - self.spans.len();
        let overflow = spans.len().saturating_sub(room);
        self.spans.extend(spans.into_iter().take(room));
        overflow as u64
    }

    /// The next batch: the oldest `max` spans, or all when fewer.
    pub(crate) fn take(&mut self, max: usize) -> Vec<FinishedSpan> {
        let count = max.min(self.spans.len());
        self.spans.drain(..count).collect()
    }

    /// Drops every queued span and answers how many there were.
    pub(crate) fn clear(&mut self) -> u64 {
        let count = self.spans.len();
        self.spans.clear();
        count as u64
    }

    pub(crate) fn len(&self) -> usize {
        self.spans.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

/// Logs a failure at most once per `interval`, and says how many went unlogged between.
pub(crate) struct FailureLog {
    interval: Duration,
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl FailureLog {
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            interval,
            last_logged: None,
            unlogged: 0,
        }
    }

    /// A failure happened at `now`: `Some(n)` when it is to be logged, `n` being the failures
    /// not logged since the last one that was; `None` when it is to stay quiet.
    pub(crate) fn failed(&mut self, now: Instant) -> Option<u64> {
        match self.last_logged {
            Some(last) if now.duration_since(last) < self.interval => {
                self.unlogged += 1;
                None
            }
            _ => {
                self.last_logged = Some(now);
                Some(std::mem::take(&mut self.unlogged))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use kactivator_api::trace::span::{SpanKind, SpanStatus};
    use kactivator_api::trace::{SpanId, TraceId};

    use super::*;

    fn spans(count: usize) -> Vec<FinishedSpan> {
        (0..count)
            .map(|i| FinishedSpan {
                trace_id: TraceId::new([1; 16]).unwrap(),
                span_id: SpanId::new((i as u64 + 1).to_be_bytes()).unwrap(),
                parent_span_id: None,
                name: Cow::Borrowed("span"),
                kind: SpanKind::Server,
                start_unix_nanos: 1,
                end_unix_nanos: 2,
                status: SpanStatus::Unset,
                attributes: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn the_queue_keeps_what_fits_and_counts_the_rest() {
        let mut queue = SpanQueue::new(10);
        assert_eq!(queue.push(spans(6)), 0);
        assert_eq!(queue.push(spans(6)), 2);
        assert_eq!(queue.len(), 10);
        assert_eq!(queue.push(spans(1)), 1);
        let batch = queue.take(4);
        assert_eq!(batch.len(), 4);
        assert_eq!(
            batch[0].span_id,
            SpanId::new(1u64.to_be_bytes()).unwrap(),
            "oldest first"
        );
        assert_eq!(queue.take(100).len(), 6);
        assert!(queue.is_empty());
        assert_eq!(queue.push(spans(3)), 0);
        assert_eq!(queue.clear(), 3);
    }

    #[test]
    fn failures_are_logged_at_most_once_per_interval_with_the_count_between() {
        let start = Instant::now();
        let mut log = FailureLog::new(Duration::from_secs(30));
        let at = |secs| start + Duration::from_secs(secs);
        assert_eq!(log.failed(at(0)), Some(0));
        assert_eq!(log.failed(at(1)), None);
        assert_eq!(log.failed(at(29)), None);
        assert_eq!(log.failed(at(30)), Some(2));
        assert_eq!(log.failed(at(31)), None);
        assert_eq!(log.failed(at(100)), Some(1));
    }
}
