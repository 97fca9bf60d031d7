//! The driver with a fake exporter under tokio's paused clock: batching, the schedule, the
//! bounded queue, one export in flight, the timeout, config changes.

use std::borrow::Cow;
use std::sync::Mutex;

use kactivator_api::trace::span::{SpanKind, SpanStatus};
use kactivator_api::trace::{SpanId, TraceId};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::*;
use crate::TraceProtocol;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behaviour {
    Succeed,
    Fail,
    /// Never answers: only the driver's timeout ends the export.
    Hang,
    /// Succeeds, saying this many spans were rejected.
    Reject(u64),
}

/// One call of a fake exporter.
#[derive(Debug)]
struct Call {
    /// The endpoint of the config the exporter was made for.
    exporter: String,
    /// Since the test started (paused clock).
    at: Duration,
    spans: Vec<FinishedSpan>,
}

struct Fake {
    endpoint: String,
    behaviour: Arc<Mutex<Behaviour>>,
    calls: mpsc::UnboundedSender<Call>,
    started: Instant,
}

impl Export for Fake {
    fn target(&self) -> &str {
        &self.endpoint
    }

    async fn export(
        &mut self,
        spans: &[FinishedSpan],
        _resource: &Resource,
    ) -> Result<Exported, ExportFailure> {
        let behaviour = *self.behaviour.lock().unwrap();
        let call = Call {
            exporter: self.endpoint.clone(),
            at: self.started.elapsed(),
            spans: spans.to_vec(),
        };
        self.calls.send(call).unwrap();
        match behaviour {
            Behaviour::Succeed => Ok(Exported::default()),
            Behaviour::Fail => Err(ExportFailure::Protocol("told to fail".into())),
            Behaviour::Hang => std::future::pending().await,
            Behaviour::Reject(rejected) => Ok(Exported {
                rejected,
                message: "too old".into(),
                bytes: 0,
            }),
        }
    }
}

fn otlp(endpoint: &str) -> TracingConfig {
    TracingConfig {
        protocol: TraceProtocol::HttpProtobuf,
        endpoint: endpoint.to_owned(),
        sampling_rate: 1.0,
    }
}

const A: &str = "http://a:4318";
const B: &str = "http://b:4318";

struct Harness {
    config: watch::Sender<TracingConfig>,
    spans: Option<flume::Sender<SpanBatch>>,
    counters: Arc<ExportCounters>,
    calls: mpsc::UnboundedReceiver<Call>,
    behaviour: Arc<Mutex<Behaviour>>,
    changes: Arc<Mutex<Vec<TracingConfig>>>,
    driver: JoinHandle<()>,
    next_span: u64,
}

impl Harness {
    /// Starts the driver and lets it apply `initial`.
    async fn start(initial: TracingConfig) -> Harness {
        let started = Instant::now();
        let (config, config_rx) = watch::channel(initial);
        let (spans, spans_rx) = flume::bounded(16);
        let (calls_tx, calls) = mpsc::unbounded_channel();
        let behaviour = Arc::new(Mutex::new(Behaviour::Succeed));
        let changes = Arc::new(Mutex::new(Vec::new()));
        let counters = Arc::new(ExportCounters::default());
        let exporter_for = {
            let behaviour = Arc::clone(&behaviour);
            move |config: &TracingConfig| {
                config.validate()?;
                Ok(config.enabled().then(|| Fake {
                    endpoint: config.endpoint.clone(),
                    behaviour: Arc::clone(&behaviour),
                    calls: calls_tx.clone(),
                    started,
                }))
            }
        };
        let on_change = {
            let changes = Arc::clone(&changes);
            move |config: &TracingConfig| changes.lock().unwrap().push(config.clone())
        };
        let driver = tokio::spawn(drive(
            BatchConfig::default(),
            config_rx,
            spans_rx,
            Resource::default(),
            Arc::clone(&counters),
            on_change,
            exporter_for,
        ));
        let harness = Harness {
            config,
            spans: Some(spans),
            counters,
            calls,
            behaviour,
            changes,
            driver,
            next_span: 1,
        };
        harness.settle().await;
        harness
    }

    fn behave(&self, behaviour: Behaviour) {
        *self.behaviour.lock().unwrap() = behaviour;
    }

    /// Hands the driver `count` new spans, in batches of at most 100 as shards would, waiting
    /// for room in the channel like a test (a shard would try_send and count its own drop).
    async fn send(&mut self, count: u64) {
        let mut left = count;
        while left > 0 {
            let size = left.min(100);
            let spans = (self.next_span..self.next_span + size).map(span).collect();
            self.next_span += size;
            left -= size;
            let batch = SpanBatch { spans, dropped: 0 };
            self.spans
                .as_ref()
                .unwrap()
                .send_async(batch)
                .await
                .unwrap();
        }
        self.settle().await;
    }

    /// Waits until the driver has taken everything sent (it counts a batch in the same step
    /// that takes it). The paused clock does not move while this task keeps yielding.
    async fn settle(&self) {
        while !self.spans.as_ref().is_none_or(|spans| spans.is_empty()) {
            tokio::task::yield_now().await;
        }
        // One more turn, for a config change sent just before.
        tokio::task::yield_now().await;
    }

    async fn call(&mut self) -> Call {
        self.calls.recv().await.expect("the driver is running")
    }

    fn counters(&self) -> CountersSnapshot {
        self.counters.snapshot()
    }

    fn changes(&self) -> Vec<String> {
        let changes = self.changes.lock().unwrap();
        changes
            .iter()
            .map(|config| config.endpoint.clone())
            .collect()
    }
}

fn span(id: u64) -> FinishedSpan {
    FinishedSpan {
        trace_id: TraceId::new([7; 16]).unwrap(),
        span_id: SpanId::new(id.to_be_bytes()).unwrap(),
        parent_span_id: None,
        name: Cow::Borrowed("activator_proxy"),
        kind: SpanKind::Server,
        start_unix_nanos: 1,
        end_unix_nanos: 2,
        status: SpanStatus::Unset,
        attributes: Vec::new(),
    }
}

fn ids(call: &Call) -> (u64, u64) {
    let id = |span: &FinishedSpan| u64::from_be_bytes(span.span_id.to_bytes());
    (id(&call.spans[0]), id(call.spans.last().unwrap()))
}

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn a_full_batch_goes_out_at_once_and_a_partial_one_on_the_schedule() {
    let mut harness = Harness::start(otlp(A)).await;
    harness.send(512).await;
    let full = harness.call().await;
    assert_eq!((full.at, full.spans.len()), (Duration::ZERO, 512));
    harness.send(10).await;
    let partial = harness.call().await;
    assert_eq!((partial.at, partial.spans.len()), (5 * SECOND, 10));
    assert_eq!(ids(&partial), (513, 522));
    harness.settle().await;
    assert_eq!(harness.counters().spans_exported, 522);
}

#[tokio::test(start_paused = true)]
async fn batches_hold_at_most_512_spans_oldest_first() {
    let mut harness = Harness::start(otlp(A)).await;
    harness.send(1300).await;
    let calls = [
        harness.call().await,
        harness.call().await,
        harness.call().await,
    ];
    let seen: Vec<_> = calls.iter().map(|call| (call.at, ids(call))).collect();
    assert_eq!(
        seen,
        [
            (Duration::ZERO, (1, 512)),
            (Duration::ZERO, (513, 1024)),
            // fewer than 512 left: they wait for the schedule
            (5 * SECOND, (1025, 1300)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_schedule_ticks_while_idle() {
    let mut harness = Harness::start(otlp(A)).await;
    tokio::time::sleep(7 * SECOND).await;
    harness.send(1).await;
    // The tick at 5 s found nothing; the next is at 10 s.
    assert_eq!(harness.call().await.at, 10 * SECOND);
}

#[tokio::test(start_paused = true)]
async fn a_hung_export_keeps_the_channel_drained_bounds_the_queue_and_times_out() {
    let mut harness = Harness::start(otlp(A)).await;
    harness.behave(Behaviour::Hang);
    harness.send(512).await;
    assert_eq!(harness.call().await.at, Duration::ZERO);
    // 3000 more while that export hangs: the driver keeps taking them off the channel
    // (`send` returns), queues 2048 and drops the rest.
    harness.send(3000).await;
    let counters = harness.counters();
    assert_eq!(counters.spans_dropped_queue_full, 3000 - 2048);
    assert_eq!(counters.export_failures, 0);
    assert!(
        harness.calls.try_recv().is_err(),
        "one export in flight at a time"
    );

    // The timeout ends it; the queue, full, goes out at once.
    harness.behave(Behaviour::Succeed);
    let next = harness.call().await;
    assert_eq!(next.at, 10 * SECOND);
    assert_eq!(ids(&next), (513, 1024));
    let counters = harness.counters();
    assert_eq!(counters.export_failures, 1);
    assert_eq!(counters.spans_dropped_export_failed, 512);
}

#[tokio::test(start_paused = true)]
async fn a_failed_batch_is_counted_and_not_retried() {
    let mut harness = Harness::start(otlp(A)).await;
    harness.behave(Behaviour::Fail);
    harness.send(512).await;
    assert_eq!(ids(&harness.call().await), (1, 512));
    harness.behave(Behaviour::Succeed);
    harness.send(3).await;
    // The next call carries the new spans only: the failed ones are gone.
    let next = harness.call().await;
    assert_eq!(ids(&next), (513, 515));
    harness.settle().await;
    let counters = harness.counters();
    assert_eq!(counters.export_failures, 1);
    assert_eq!(counters.spans_dropped_export_failed, 512);
    assert_eq!(counters.spans_exported, 3);
}

#[tokio::test(start_paused = true)]
async fn rejected_spans_are_counted_apart_from_exported_ones() {
    let mut harness = Harness::start(otlp(A)).await;
    harness.behave(Behaviour::Reject(2));
    harness.send(5).await;
    harness.call().await;
    harness.settle().await;
    let counters = harness.counters();
    assert_eq!((counters.spans_exported, counters.spans_rejected), (3, 2));
    assert_eq!(counters.export_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn the_shards_own_drops_are_counted() {
    let harness = Harness::start(otlp(A)).await;
    let spans = harness.spans.as_ref().unwrap();
    spans
        .try_send(SpanBatch {
            spans: Vec::new(),
            dropped: 7,
        })
        .unwrap();
    harness.settle().await;
    assert_eq!(harness.counters().spans_dropped_by_shards, 7);
}

#[tokio::test(start_paused = true)]
async fn a_config_change_switches_the_exporter_and_is_announced_first() {
    let mut harness = Harness::start(otlp(A)).await;
    assert_eq!(harness.changes(), [A]);
    harness.send(3).await;
    assert_eq!(harness.call().await.exporter, A);
    harness.config.send(otlp(B)).unwrap();
    harness.settle().await;
    assert_eq!(harness.changes(), [A, B]);
    harness.send(3).await;
    assert_eq!(harness.call().await.exporter, B);
    // The same config again changes nothing.
    harness.config.send(otlp(B)).unwrap();
    harness.settle().await;
    assert_eq!(harness.changes(), [A, B]);
}

#[tokio::test(start_paused = true)]
async fn a_refused_config_keeps_the_previous_one() {
    let mut harness = Harness::start(otlp(A)).await;
    harness.config.send(otlp("https://b:4318")).unwrap();
    harness.settle().await;
    assert_eq!(harness.changes(), [A]);
    harness.send(3).await;
    assert_eq!(harness.call().await.exporter, A);
}

#[tokio::test(start_paused = true)]
async fn a_refused_initial_config_leaves_tracing_off() {
    let harness = Harness::start(otlp("collector:4317")).await;
    harness.settle().await;
    assert_eq!(harness.changes(), [""]);
    harness
        .spans
        .as_ref()
        .unwrap()
        .try_send(SpanBatch {
            spans: vec![span(1)],
            dropped: 0,
        })
        .unwrap();
    harness.settle().await;
    assert_eq!(harness.counters().spans_dropped_tracing_off, 1);
}

#[tokio::test(start_paused = true)]
async fn turning_tracing_off_drops_what_is_queued_and_what_arrives() {
    let mut harness = Harness::start(otlp(A)).await;
    harness.behave(Behaviour::Hang);
    harness.send(600).await;
    harness.call().await; // 512 in flight, 88 queued
    harness.config.send(TracingConfig::OFF).unwrap();
    harness.settle().await;
    assert_eq!(harness.changes(), [A, ""]);
    assert_eq!(harness.counters().spans_dropped_tracing_off, 88);
    harness.send(5).await;
    assert_eq!(harness.counters().spans_dropped_tracing_off, 93);
    // The export in flight still ends (by its timeout) and is counted.
    tokio::time::sleep(11 * SECOND).await;
    assert_eq!(harness.counters().spans_dropped_export_failed, 512);
    assert!(harness.calls.try_recv().is_err());
}

#[tokio::test(start_paused = true)]
async fn closing_the_channel_exports_what_is_queued_and_returns() {
    let mut harness = Harness::start(otlp(A)).await;
    harness.send(700).await;
    harness.spans = None;
    let first = harness.call().await;
    let last = harness.call().await;
    assert_eq!((first.at, ids(&first)), (Duration::ZERO, (1, 512)));
    assert_eq!((last.at, ids(&last)), (Duration::ZERO, (513, 700)));
    (&mut harness.driver).await.unwrap();
    assert_eq!(harness.counters().spans_exported, 700);
}
