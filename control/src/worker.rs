//! The serialized state worker and its supervisor, on the control thread.
//!
//! Every change to pod state goes through one bounded channel to one task, so ops never race
//! and each one sees the effects of all earlier ones. Enqueueing waits when the channel is full:
//! nothing is ever dropped. A caller that needs the result (a registration answering 200 only
//! once applied, a test barrier) awaits the op's reply.
//!
//! A panicking op is caught, logged and counted; its caller gets [`WorkerError::Lost`]. The worker
//! then stops and the supervisor restarts it after a backoff ([`RestartBackoff`]: none for the
//! first panic, then 100 ms doubling to 5 s while panics come less than a minute apart, reset
//! after a quiet minute), and the restarted worker first re-publishes everything, so an op that stopped
//! half-way cannot leave the shards out of step. Health: unhealthy for a minute after a panic,
//! or while the channel is more than half full.
//!
//! The worker is generic over a [`Machine`] so the supervisor is tested with a machine that
//! panics on demand, under tokio's paused clock.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntGauge, Registry};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::metrics::register;
use crate::pod_state::Timestamp;
use crate::state::{Op, OpError};

/// First restart delay after a repeated panic.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// Longest restart delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A minute without a panic resets the backoff and the health.
pub const QUIET_RESET: Duration = Duration::from_secs(60);

/// What the worker applies ops to.
pub trait Machine {
    /// Applies one op at `now`.
    fn apply(&mut self, op: Op, now: Timestamp) -> Result<(), OpError>;
    /// When [`Machine::on_deadline`] should next run, if ever.
    fn next_deadline(&self) -> Option<Timestamp>;
    /// Time-driven work (quarantine ends).
    fn on_deadline(&mut self, now: Timestamp);
    /// After each op or deadline: publish, update metrics.
    fn flush(&mut self);
    /// After a restart: make everything downstream consistent again.
    fn recover(&mut self);
}

/// Why an op did not apply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkerError {
    #[error("{0}")]
    Op(#[from] OpError),
    #[error("the state worker panicked while applying this change; it has been restarted")]
    Lost,
    #[error("the state worker has stopped")]
    Stopped,
}

struct Request {
    op: Op,
    enqueued: Instant,
    reply: Option<oneshot::Sender<Result<(), WorkerError>>>,
}

/// The sending side, cloned by every producer.
#[derive(Clone)]
pub struct WorkerHandle {
    tx: mpsc::Sender<Request>,
    shared: Arc<Shared>,
}

impl WorkerHandle {
    /// Applies `op` and waits until it has been.
    pub async fn apply(&self, op: Op) -> Result<(), WorkerError> {
        let (reply, done) = oneshot::channel();
        self.send(op, Some(reply)).await?;
        done.await.unwrap_or(Err(WorkerError::Lost))
    }

    /// Queues `op` without waiting for it to apply (but waiting for room in the channel).
    pub async fn enqueue(&self, op: Op) -> Result<(), WorkerError> {
        self.send(op, None).await
    }

    /// Waits until every op queued before it has been applied.
    pub async fn barrier(&self) -> Result<(), WorkerError> {
        self.apply(Op::Noop).await
    }

    async fn send(
        &self,
        op: Op,
        reply: Option<oneshot::Sender<Result<(), WorkerError>>>,
    ) -> Result<(), WorkerError> {
        let request = Request {
            op,
            enqueued: Instant::now(),
            reply,
        };
        self.tx
            .send(request)
            .await
            .map_err(|_| WorkerError::Stopped)?;
        self.shared.metrics.queue_depth.set(self.queue_len() as i64);
        Ok(())
    }

    /// Ops waiting in the channel.
    pub fn queue_len(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// `Ok` when healthy, else why not.
    pub fn health(&self) -> Result<(), String> {
        let now = Instant::now();
        if let Some(ago) = self.shared.since_last_panic(now) {
            if ago < QUIET_RESET {
                return Err(format!(
                    "state worker panicked {:.1}s ago",
                    ago.as_secs_f64()
                ));
            }
        }
        let len = self.queue_len();
        if len > self.tx.max_capacity() / 2 {
            return Err(format!(
                "state worker queue is {len} of {}",
                self.tx.max_capacity()
            ));
        }
        Ok(())
    }

    /// Panics caught since start.
    pub fn panics(&self) -> u64 {
        self.shared.metrics.panics.get()
    }
}

/// The worker's metrics.
pub struct WorkerMetrics {
    queue_depth: IntGauge,
    queue_seconds: HistogramVec,
    processing_seconds: HistogramVec,
    deadline_seconds: Histogram,
    panics: IntCounter,
}

impl WorkerMetrics {
    pub fn new(registry: &Registry) -> WorkerMetrics {
        // 0.1 ms to about 0.8 s: the fork's buckets went to 51 ms, short of a large
        // recalculation.
        let buckets = prometheus::exponential_buckets(0.0001, 2.0, 14).expect("valid buckets");
        let queue_depth = IntGauge::new(
            "activator_state_worker_queue_depth",
            "Ops waiting for the state worker",
        )
        .expect("valid metric");
        let queue_seconds = HistogramVec::new(
            HistogramOpts::new(
                "activator_state_worker_queue_duration_seconds",
                "Time an op waited in the state worker's channel",
            )
            .buckets(buckets.clone()),
            &["op_type"],
        )
        .expect("valid metric");
        let processing_seconds = HistogramVec::new(
            HistogramOpts::new(
                "activator_state_worker_processing_duration_seconds",
                "Time the state worker spent applying an op, publishing included",
            )
            .buckets(buckets.clone()),
            &["op_type"],
        )
        .expect("valid metric");
        let deadline_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "activator_state_worker_timer_duration_seconds",
                "Time the state worker spent on timed work (quarantine ends)",
            )
            .buckets(buckets),
        )
        .expect("valid metric");
        let panics = IntCounter::new(
            "activator_state_worker_panics_total",
            "Ops that panicked in the state worker (each restarts it)",
        )
        .expect("valid metric");
        WorkerMetrics {
            queue_depth: register(registry, queue_depth),
            queue_seconds: register(registry, queue_seconds),
            processing_seconds: register(registry, processing_seconds),
            deadline_seconds: register(registry, deadline_seconds),
            panics: register(registry, panics),
        }
    }
}

struct Shared {
    metrics: WorkerMetrics,
    start: Instant,
    /// Milliseconds after `start` of the last panic, plus one; 0 = never.
    last_panic: AtomicU64,
}

impl Shared {
    fn since_last_panic(&self, now: Instant) -> Option<Duration> {
        let stamp = self.last_panic.load(Ordering::Acquire);
        (stamp != 0)
            .then(|| now.saturating_duration_since(self.start + Duration::from_millis(stamp - 1)))
    }
}

/// Restart delays after panics.
#[derive(Clone, Debug, Default)]
pub struct RestartBackoff {
    next: Option<Duration>,
    last_panic: Option<Duration>,
}

impl RestartBackoff {
    /// A panic happened at `now` (time since any fixed epoch): how long to wait before restarting.
    pub fn after_panic(&mut self, now: Duration) -> Duration {
        let delay = match self.last_panic {
            Some(last) if now.saturating_sub(last) < QUIET_RESET => {
                let delay = self.next.unwrap_or(BACKOFF_INITIAL);
                self.next = Some((delay * 2).min(BACKOFF_MAX));
                delay
            }
            // The first panic, or the first after a quiet minute: restart at once.
            _ => {
                self.next = Some(BACKOFF_INITIAL);
                Duration::ZERO
            }
        };
        self.last_panic = Some(now);
        delay
    }
}

/// Creates the channel; run the returned future on the control thread.
pub fn spawn<M: Machine + 'static>(
    machine: M,
    capacity: usize,
    metrics: WorkerMetrics,
) -> (WorkerHandle, impl std::future::Future<Output = ()>) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let start = Instant::now();
    let shared = Arc::new(Shared {
        metrics,
        start,
        last_panic: AtomicU64::new(0),
    });
    let handle = WorkerHandle {
        tx,
        shared: shared.clone(),
    };
    (handle, supervise(machine, rx, shared))
}

enum Exit {
    Closed,
    Panicked,
}

async fn supervise<M: Machine>(
    mut machine: M,
    mut rx: mpsc::Receiver<Request>,
    shared: Arc<Shared>,
) {
    let mut backoff = RestartBackoff::default();
    loop {
        match serve(&mut machine, &mut rx, &shared).await {
            Exit::Closed => return,
            Exit::Panicked => {
                let now = Instant::now();
                let since_start = now.saturating_duration_since(shared.start);
                shared
                    .last_panic
                    .store(since_start.as_millis() as u64 + 1, Ordering::Release);
                let delay = backoff.after_panic(since_start);
                tracing::warn!(
                    delay_ms = delay.as_millis() as u64,
                    "restarting the state worker"
                );
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                // The restart itself must not take the worker down for good.
                if catch_unwind(AssertUnwindSafe(|| {
                    machine.recover();
                    machine.flush();
                }))
                .is_err()
                {
                    shared.metrics.panics.inc();
                    tracing::error!("the state worker panicked while recovering");
                }
            }
        }
    }
}

async fn serve<M: Machine>(
    machine: &mut M,
    rx: &mut mpsc::Receiver<Request>,
    shared: &Shared,
) -> Exit {
    let to_timestamp =
        |at: Instant| Timestamp::from_epoch_offset(at.saturating_duration_since(shared.start));
    loop {
        let deadline = machine
            .next_deadline()
            .map(|at| shared.start + at.epoch_offset());
        let request = tokio::select! {
            biased;
            request = rx.recv() => match request {
                Some(request) => request,
                None => return Exit::Closed,
            },
            _ = sleep_until_or_never(deadline) => {
                let started = Instant::now();
                let result = catch_unwind(AssertUnwindSafe(|| {
                    machine.on_deadline(to_timestamp(started));
                    machine.flush();
                }));
                shared.metrics.deadline_seconds.observe(started.elapsed().as_secs_f64());
                if result.is_err() {
                    shared.metrics.panics.inc();
                    tracing::error!("the state worker panicked on timed work");
                    return Exit::Panicked;
                }
                continue;
            }
        };
        shared.metrics.queue_depth.set(rx.len() as i64);
        let label = request.op.label();
        let started = Instant::now();
        shared
            .metrics
            .queue_seconds
            .with_label_values(&[label])
            .observe(
                started
                    .saturating_duration_since(request.enqueued)
                    .as_secs_f64(),
            );
        let op = request.op;
        let result = catch_unwind(AssertUnwindSafe(|| {
            let result = machine.apply(op, to_timestamp(started));
            machine.flush();
            result
        }));
        shared
            .metrics
            .processing_seconds
            .with_label_values(&[label])
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(result) => {
                if let Err(error) = &result {
                    tracing::warn!(op = label, "state change refused: {error}");
                }
                if let Some(reply) = request.reply {
                    let _ = reply.send(result.map_err(WorkerError::Op));
                }
            }
            Err(panic) => {
                shared.metrics.panics.inc();
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|text| text.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic".into());
                tracing::error!(op = label, "state worker panicked: {message}");
                // Dropping the reply tells its caller the op was lost.
                return Exit::Panicked;
            }
        }
    }
}

async fn sleep_until_or_never(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    #[test]
    fn backoff_restarts_at_once_then_doubles_to_five_seconds_and_resets_after_a_quiet_minute() {
        let mut backoff = RestartBackoff::default();
        let mut now = Duration::from_secs(100);
        let mut delays = Vec::new();
        for _ in 0..9 {
            delays.push(backoff.after_panic(now).as_millis());
            now += Duration::from_secs(1);
        }
        assert_eq!(delays, vec![0, 100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        // The loop left `now` 1 s after the last panic: 59 s after it is still "less than a
        // minute apart".
        now += Duration::from_secs(58);
        assert_eq!(backoff.after_panic(now), BACKOFF_MAX);
        // A full quiet minute resets: restart at once, then 100 ms again.
        now += QUIET_RESET;
        assert_eq!(backoff.after_panic(now), Duration::ZERO);
        assert_eq!(backoff.after_panic(now), BACKOFF_INITIAL);
    }

    /// Records ops; panics on `CleanupStale`; counts recoveries.
    #[derive(Clone, Default)]
    struct Fake {
        log: Rc<RefCell<Vec<(&'static str, Duration)>>>,
        recoveries: Rc<RefCell<Vec<Duration>>>,
        deadline: Rc<RefCell<Option<Timestamp>>>,
        fired: Rc<RefCell<Vec<Duration>>>,
    }

    impl Machine for Fake {
        fn apply(&mut self, op: Op, now: Timestamp) -> Result<(), OpError> {
            if op == Op::CleanupStale {
                panic!("injected panic");
            }
            self.log.borrow_mut().push((op.label(), now.epoch_offset()));
            Ok(())
        }
        fn next_deadline(&self) -> Option<Timestamp> {
            *self.deadline.borrow()
        }
        fn on_deadline(&mut self, now: Timestamp) {
            self.fired.borrow_mut().push(now.epoch_offset());
            *self.deadline.borrow_mut() = None;
        }
        fn flush(&mut self) {}
        fn recover(&mut self) {
            self.recoveries.borrow_mut().push(Duration::ZERO);
        }
    }

    fn start(fake: &Fake, capacity: usize) -> WorkerHandle {
        let registry = Registry::new();
        let (handle, worker) = spawn(fake.clone(), capacity, WorkerMetrics::new(&registry));
        tokio::task::spawn_local(worker);
        handle
    }

    fn local<F: std::future::Future>(future: F) -> F::Output {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&runtime, future)
    }

    #[test]
    fn concurrent_ops_are_all_applied_in_order_before_a_barrier() {
        local(async {
            let fake = Fake::default();
            let handle = start(&fake, 8);
            let mut tasks = Vec::new();
            for _ in 0..100 {
                let handle = handle.clone();
                tasks.push(tokio::task::spawn_local(async move {
                    handle.enqueue(Op::Noop).await.unwrap()
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
            handle.barrier().await.unwrap();
            assert_eq!(fake.log.borrow().len(), 101, "100 ops and the barrier");
        });
    }

    #[test]
    fn a_panicking_op_is_lost_counted_and_later_ops_still_apply() {
        local(async {
            let fake = Fake::default();
            let handle = start(&fake, 8);
            handle.apply(Op::Noop).await.unwrap();
            assert_eq!(handle.apply(Op::CleanupStale).await, Err(WorkerError::Lost));
            assert_eq!(handle.panics(), 1);
            assert!(handle.health().is_err(), "unhealthy right after a panic");
            handle.apply(Op::Noop).await.unwrap();
            assert_eq!(fake.log.borrow().len(), 2);
            assert_eq!(fake.recoveries.borrow().len(), 1, "recovered once");
            tokio::time::sleep(QUIET_RESET).await;
            assert_eq!(handle.health(), Ok(()), "healthy after a quiet minute");
        });
    }

    #[test]
    fn repeated_panics_back_off_on_the_paused_clock() {
        local(async {
            let fake = Fake::default();
            let handle = start(&fake, 8);
            let begin = Instant::now();
            let mut applied_at = Vec::new();
            for _ in 0..5 {
                assert_eq!(handle.apply(Op::CleanupStale).await, Err(WorkerError::Lost));
                handle.apply(Op::Noop).await.unwrap();
                applied_at.push((Instant::now() - begin).as_millis());
            }
            // Restart delays 0, 100, 200, 400, 800 ms accumulate before each following op.
            assert_eq!(applied_at, vec![0, 100, 300, 700, 1500]);
        });
    }

    #[test]
    fn enqueue_waits_for_room_and_a_full_queue_is_unhealthy() {
        local(async {
            let fake = Fake::default();
            let registry = Registry::new();
            let (handle, worker) = spawn(fake.clone(), 4, WorkerMetrics::new(&registry));
            // The worker is not running yet: fill the channel.
            for _ in 0..4 {
                handle.enqueue(Op::Noop).await.unwrap();
            }
            assert_eq!(handle.queue_len(), 4);
            assert!(handle.health().unwrap_err().contains("queue is 4 of 4"));
            let blocked = {
                let handle = handle.clone();
                tokio::task::spawn_local(async move { handle.enqueue(Op::Noop).await })
            };
            tokio::task::yield_now().await;
            assert!(!blocked.is_finished(), "a full queue makes enqueue wait");
            tokio::task::spawn_local(worker);
            blocked.await.unwrap().unwrap();
            handle.barrier().await.unwrap();
            assert_eq!(fake.log.borrow().len(), 6, "nothing was dropped");
            assert_eq!(handle.health(), Ok(()));
        });
    }

    #[test]
    fn deadlines_fire_on_the_paused_clock_between_ops() {
        local(async {
            let fake = Fake::default();
            *fake.deadline.borrow_mut() =
                Some(Timestamp::from_epoch_offset(Duration::from_secs(3)));
            let handle = start(&fake, 8);
            handle.barrier().await.unwrap();
            assert!(fake.fired.borrow().is_empty());
            tokio::time::sleep(Duration::from_secs(3)).await;
            handle.barrier().await.unwrap();
            assert_eq!(*fake.fired.borrow(), vec![Duration::from_secs(3)]);
        });
    }
}
