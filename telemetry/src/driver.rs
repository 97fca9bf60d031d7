//! The driver on the control thread: takes the shards' span batches off their channel, queues
//! them, and exports them through the exporter of the config in force, batched as
//! OpenTelemetry's BatchSpanProcessor does with its defaults (a queue of 2048 spans, batches of
//! at most 512, one every 5 s or as soon as 512 wait, a 10 s export timeout, one export at a
//! time). It never retries: a failed batch is dropped, counted, and logged at most once per
//! 30 s. The shards' senders never wait on it: it keeps draining their channel while an export
//! is in flight, and what does not fit in the queue is dropped and counted.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kactivator_api::trace::span::{FinishedSpan, SpanBatch};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::batch::{FailureLog, SpanQueue};
use crate::export::{Export, ExportError, ExportFailure, Exported, Exporter};
use crate::{Resource, TracingConfig, TracingConfigError};

#[cfg(test)]
mod tests;

/// The most spans waiting for export (BatchSpanProcessor's `maxQueueSize`).
pub const DEFAULT_MAX_QUEUE_SIZE: usize = 2048;
/// The most spans in one export (`maxExportBatchSize`).
pub const DEFAULT_MAX_EXPORT_BATCH_SIZE: usize = 512;
/// How long spans wait for more to join their batch (`scheduledDelayMillis`).
pub const DEFAULT_SCHEDULE_DELAY: Duration = Duration::from_secs(5);
/// How long an export may take, dialing included (`exportTimeoutMillis`).
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a failed export may be logged; failures between are counted in the next line.
pub const DEFAULT_FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// How the driver batches. `Default` is OpenTelemetry's BatchSpanProcessor's defaults; tests
/// shorten the times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    /// The most spans waiting for export; more are dropped and counted
    /// ([`ExportCounters::spans_dropped_queue_full`]). Defaults to 2048
    /// ([`DEFAULT_MAX_QUEUE_SIZE`]).
    pub max_queue_size: usize,
    /// The most spans in one export. Defaults to 512 ([`DEFAULT_MAX_EXPORT_BATCH_SIZE`]).
    pub max_export_batch_size: usize,
    /// The longest a span waits for its batch to fill: a batch goes out this long after the
    /// previous export started, or as soon as it is full. Defaults to 5 s
    /// ([`DEFAULT_SCHEDULE_DELAY`]).
    pub schedule_delay: Duration,
    /// How long one export may take, from dialing to the collector's answer; past it the
    /// batch fails. Defaults to 10 s ([`DEFAULT_EXPORT_TIMEOUT`]).
    pub export_timeout: Duration,
    /// The least time between two logged export failures. Defaults to 30 s
    /// ([`DEFAULT_FAILURE_LOG_INTERVAL`]).
    pub failure_log_interval: Duration,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_queue_size: DEFAULT_MAX_QUEUE_SIZE,
            max_export_batch_size: DEFAULT_MAX_EXPORT_BATCH_SIZE,
            schedule_delay: DEFAULT_SCHEDULE_DELAY,
            export_timeout: DEFAULT_EXPORT_TIMEOUT,
            failure_log_interval: DEFAULT_FAILURE_LOG_INTERVAL,
        }
    }
}

/// What became of the spans the shards handed over, for the metrics page. Every span a shard
/// recorded ends in exactly one of the `spans_*` counters (once its batch is done); all only
/// ever grow.
#[derive(Debug, Default)]
pub struct ExportCounters {
    /// Spans a collector accepted, or written to stdout.
    pub spans_exported: AtomicU64,
    /// Spans a collector answered it rejected (OTLP's partial success), though the export
    /// succeeded.
    pub spans_rejected: AtomicU64,
    /// Spans the shards dropped before handing them over, because their own buffer was full
    /// (the sum of [`SpanBatch::dropped`]).
    pub spans_dropped_by_shards: AtomicU64,
    /// Spans dropped on arrival because the export queue already held
    /// [`BatchConfig::max_queue_size`]: the collector is slower than the traffic, or down.
    pub spans_dropped_queue_full: AtomicU64,
    /// Spans in batches whose export failed (refused, timed out, answered with an error);
    /// they are not retried.
    pub spans_dropped_export_failed: AtomicU64,
    /// Spans that arrived, or were still queued, while tracing was off.
    pub spans_dropped_tracing_off: AtomicU64,
    /// Exports that failed: one per batch, whatever its size.
    pub export_failures: AtomicU64,
    /// Bytes of the exports that succeeded: the encoded payloads, before HTTP or gRPC framing.
    pub bytes_exported: AtomicU64,
}

/// The counters' values at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    pub spans_exported: u64,
    pub spans_rejected: u64,
    pub spans_dropped_by_shards: u64,
    pub spans_dropped_queue_full: u64,
    pub spans_dropped_export_failed: u64,
    pub spans_dropped_tracing_off: u64,
    pub export_failures: u64,
    pub bytes_exported: u64,
}

impl ExportCounters {
    pub fn snapshot(&self) -> CountersSnapshot {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CountersSnapshot {
            spans_exported: read(&self.spans_exported),
            spans_rejected: read(&self.spans_rejected),
            spans_dropped_by_shards: read(&self.spans_dropped_by_shards),
            spans_dropped_queue_full: read(&self.spans_dropped_queue_full),
            spans_dropped_export_failed: read(&self.spans_dropped_export_failed),
            spans_dropped_tracing_off: read(&self.spans_dropped_tracing_off),
            export_failures: read(&self.export_failures),
            bytes_exported: read(&self.bytes_exported),
        }
    }
}

fn add(counter: &AtomicU64, value: u64) {
    if value > 0 {
        counter.fetch_add(value, Ordering::Relaxed);
    }
}

/// Exports the shards' spans until every sender of `spans` is gone, with
/// [`BatchConfig::default`]. Meant for the control thread's tokio runtime (current-thread is
/// enough; it spawns only the exporters' connection tasks and, for stdout, a blocking write).
///
/// * `config`: the tracing settings; `run` applies the current one at once and each change.
///   A config that [`TracingConfig::validate`] refuses is logged and not applied: the
///   previous one stays (at start, tracing stays off). When the sender is dropped the last
///   config stays in force.
/// * `spans`: the shards' batches. `run` never makes a sender wait (they `try_send` on the
///   bounded channel the caller made); it drains the channel even while an export is in
///   flight. When every sender is dropped, `run` exports what is queued (each batch still
///   bounded by the export timeout) and returns.
/// * `resource`: who is exporting, on every batch.
/// * `counters`: what became of the spans (see [`ExportCounters`]).
/// * `on_change`: called with the initial config (or [`TracingConfig::OFF`] when that is
///   refused) and with each config applied after, before any span is exported under it; the
///   place to tell the shards the sampler.
///
/// Memory stays bounded: at most `max_queue_size` spans queued plus one batch in flight, one
/// connection to the collector, and an answer of at most 64 KiB.
pub async fn run(
    config: watch::Receiver<TracingConfig>,
    spans: flume::Receiver<SpanBatch>,
    resource: Resource,
    counters: Arc<ExportCounters>,
    on_change: impl FnMut(&TracingConfig),
) {
    run_with(
        BatchConfig::default(),
        config,
        spans,
        resource,
        counters,
        on_change,
    )
    .await
}

/// [`run`] with other batching settings.
pub async fn run_with(
    batch: BatchConfig,
    config: watch::Receiver<TracingConfig>,
    spans: flume::Receiver<SpanBatch>,
    resource: Resource,
    counters: Arc<ExportCounters>,
    on_change: impl FnMut(&TracingConfig),
) {
    let timeout = batch.export_timeout;
    let exporter_for = move |config: &TracingConfig| Exporter::new(config, timeout);
    drive(
        batch,
        config,
        spans,
        resource,
        counters,
        on_change,
        exporter_for,
    )
    .await
}

/// [`run_with`] over any exporter: `exporter_for` makes the one a config asks for.
pub(crate) async fn drive<E: Export>(
    batch: BatchConfig,
    mut config: watch::Receiver<TracingConfig>,
    spans: flume::Receiver<SpanBatch>,
    resource: Resource,
    counters: Arc<ExportCounters>,
    mut on_change: impl FnMut(&TracingConfig),
    exporter_for: impl FnMut(&TracingConfig) -> Result<Option<E>, TracingConfigError>,
) {
    let now = Instant::now();
    let mut driver = Driver {
        queue: SpanQueue::new(batch.max_queue_size),
        failures: FailureLog::new(batch.failure_log_interval),
        next_export: now + batch.schedule_delay,
        batch,
        resource: Arc::new(resource),
        counters,
        applied: TracingConfig::OFF,
        current: Current::Off,
        generation: 0,
        in_flight: None,
        exporter_for,
    };
    let initial = config.borrow_and_update().clone();
    driver.reconfigure(initial, &mut on_change, true);

    let (mut config_open, mut spans_open) = (true, true);
    loop {
        driver.start_export(Instant::now(), !spans_open);
        if !spans_open && driver.queue.is_empty() && driver.in_flight.is_none() {
            return;
        }
        // The schedule ticks only while an exporter waits for work.
        let timer_armed = driver.in_flight.is_none() && matches!(driver.current, Current::Idle(_));
        tokio::select! {
            biased;
            changed = config.changed(), if config_open => match changed {
                Ok(()) => {
                    let next = config.borrow_and_update().clone();
                    driver.reconfigure(next, &mut on_change, false);
                }
                Err(_) => config_open = false,
            },
            done = completion(&mut driver.in_flight) => driver.finish(done, Instant::now()),
            received = spans.recv_async(), if spans_open => match received {
                Ok(batch) => driver.receive(batch),
                Err(_) => spans_open = false,
            },
            () = tokio::time::sleep_until(driver.next_export), if timer_armed => {
                if driver.queue.is_empty() {
                    driver.next_export = Instant::now() + driver.batch.schedule_delay;
                }
            }
        }
    }
}

/// The exporter of the config in force.
enum Current<E> {
    /// Tracing is off: spans are dropped on arrival.
    Off,
    /// Ready for the next batch.
    Idle(E),
    /// Lent to the export in flight, which hands it back when done.
    Busy,
}

type InFlight<E> = Pin<Box<dyn Future<Output = Done<E>> + Send>>;

/// An export that ended, with the exporter it borrowed.
struct Done<E> {
    exporter: E,
    /// The config it was made for; an older one is dropped, not handed back.
    generation: u64,
    spans: u64,
    result: Result<Exported, ExportError>,
}

struct Driver<E, F> {
    batch: BatchConfig,
    resource: Arc<Resource>,
    counters: Arc<ExportCounters>,
    queue: SpanQueue,
    failures: FailureLog,
    /// When the next batch goes out even if not full.
    next_export: Instant,
    applied: TracingConfig,
    current: Current<E>,
    /// Counts applied configs, so an export of an older one does not hand its exporter back.
    generation: u64,
    /// At most one export at a time.
    in_flight: Option<InFlight<E>>,
    exporter_for: F,
}

impl<E, F> Driver<E, F>
where
    E: Export,
    F: FnMut(&TracingConfig) -> Result<Option<E>, TracingConfigError>,
{
    fn reconfigure(
        &mut self,
        config: TracingConfig,
        on_change: &mut impl FnMut(&TracingConfig),
        initial: bool,
    ) {
        if !initial && config == self.applied {
            return;
        }
        let exporter = match (self.exporter_for)(&config) {
            Ok(exporter) => exporter,
            Err(error) if initial => {
                tracing::error!(%error, "tracing config refused; tracing stays off");
                on_change(&TracingConfig::OFF);
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "tracing config refused; the previous one stays");
                return;
            }
        };
        self.generation += 1;
        // An export in flight finishes with the exporter it has; the next batch uses this one.
        self.current = match exporter {
            Some(exporter) => {
                tracing::info!(
                    protocol = config.protocol.label(),
                    target = exporter.target(),
                    sampling_rate = config.sampling_rate,
                    "tracing on"
                );
                Current::Idle(exporter)
            }
            None => {
                if !initial {
                    tracing::info!("tracing off");
                }
                add(&self.counters.spans_dropped_tracing_off, self.queue.clear());
                Current::Off
            }
        };
        self.applied = config;
        on_change(&self.applied);
    }

    fn receive(&mut self, batch: SpanBatch) {
        add(&self.counters.spans_dropped_by_shards, batch.dropped);
        if matches!(self.current, Current::Off) {
            add(
                &self.counters.spans_dropped_tracing_off,
                batch.spans.len() as u64,
            );
            return;
        }
        add(
            &self.counters.spans_dropped_queue_full,
            self.queue.push(batch.spans),
        );
    }

    /// Starts an export when none is in flight, the exporter is free, and a batch is due: a
    /// full one, the schedule's, or anything left when the channel has closed.
    fn start_export(&mut self, now: Instant, closing: bool) {
        if self.in_flight.is_some() || self.queue.is_empty() {
            return;
        }
        let due = self.queue.len() >= self.batch.max_export_batch_size
            || now >= self.next_export
            || closing;
        if !due {
            return;
        }
        let mut exporter = match std::mem::replace(&mut self.current, Current::Busy) {
            Current::Idle(exporter) => exporter,
            // Off keeps no queue and Busy has an export in flight: neither gets here.
            other => {
                self.current = other;
                return;
            }
        };
        let spans: Vec<FinishedSpan> = self.queue.take(self.batch.max_export_batch_size);
        self.next_export = now + self.batch.schedule_delay;
        let (generation, timeout, resource) = (
            self.generation,
            self.batch.export_timeout,
            Arc::clone(&self.resource),
        );
        self.in_flight = Some(Box::pin(async move {
            let exported = tokio::time::timeout(timeout, exporter.export(&spans, &resource)).await;
            let result = exported
                .unwrap_or(Err(ExportFailure::TimedOut(timeout)))
                .map_err(|failure| ExportError {
                    target: exporter.target().to_owned(),
                    failure,
                });
            Done {
                exporter,
                generation,
                spans: spans.len() as u64,
                result,
            }
        }));
    }

    fn finish(&mut self, done: Done<E>, now: Instant) {
        if done.generation == self.generation && matches!(self.current, Current::Busy) {
            self.current = Current::Idle(done.exporter);
        }
        match done.result {
            Ok(exported) => {
                let rejected = exported.rejected.min(done.spans);
                add(&self.counters.spans_exported, done.spans - rejected);
                add(&self.counters.spans_rejected, rejected);
                add(&self.counters.bytes_exported, exported.bytes);
                if rejected > 0 {
                    if let Some(unlogged) = self.failures.failed(now) {
                        tracing::warn!(
                            rejected,
                            reason = exported.message,
                            unlogged_failures = unlogged,
                            "the trace collector rejected spans"
                        );
                    }
                }
            }
            Err(error) => {
                add(&self.counters.export_failures, 1);
                add(&self.counters.spans_dropped_export_failed, done.spans);
                if let Some(unlogged) = self.failures.failed(now) {
                    tracing::warn!(
                        %error,
                        spans = done.spans,
                        cause = error.failure.label(),
                        unlogged_failures = unlogged,
                        "span export failed; its spans are dropped"
                    );
                }
            }
        }
    }
}

/// The export in flight's end; never, when there is none.
async fn completion<E>(in_flight: &mut Option<InFlight<E>>) -> Done<E> {
    let Some(export) = in_flight else {
        return std::future::pending().await;
    };
    let done = export.await;
    // A finished future is never polled again.
    *in_flight = None;
    done
}
