//! The active health check's schedule (quarantine gate on): every routable pod of a pod-mode
//! revision every `health.probe_interval_ms`, at most [`PROBE_CONCURRENCY`] at once, and a pod
//! that just entered probation at once. Only what changes a pod becomes an op: a failure, an
//! IP reuse, a probation pod's pass.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};

use super::probe::{self, ProbeResult};
use super::ControlMetrics;
use crate::pod_state::{Event, Reason};
use crate::state::{Op, PodTarget, ProbeTarget, Source};
use crate::worker::WorkerHandle;

/// Most probes in flight at once.
pub const PROBE_CONCURRENCY: usize = 64;

/// Probes the routable pods every `interval` (only populated with quarantine on).
pub async fn run(
    mut targets: watch::Receiver<Vec<ProbeTarget>>,
    worker: WorkerHandle,
    metrics: Arc<ControlMetrics>,
    interval: Duration,
    timeout: Duration,
) {
    let limit = Arc::new(Semaphore::new(PROBE_CONCURRENCY));
    // The first round comes one interval after start-up, like every later one.
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            // A pod that just entered probation is probed at once rather than a tick later.
            changed = targets.changed() => {
                if changed.is_err() {
                    return;
                }
                if !targets.borrow().iter().any(|target| target.recovering) {
                    continue;
                }
            }
        }
        let round: Vec<ProbeTarget> = targets.borrow_and_update().clone();
        for target in round {
            let Ok(permit) = limit.clone().acquire_owned().await else {
                return;
            };
            let worker = worker.clone();
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let result = probe::probe(target.addr, &target.revision, timeout).await;
                drop(permit);
                metrics.probes.with_label_values(&[result.label()]).inc();
                let op = match result {
                    ProbeResult::Healthy => {
                        if !target.recovering {
                            return;
                        }
                        Event::HealthCheckPassed
                    }
                    ProbeResult::Unhealthy(_) | ProbeResult::Answered { .. } => {
                        let reason = result.reason();
                        tracing::warn!(pod = %target.addr, revision = %target.revision, "health check failed: {reason}");
                        Event::HealthCheckFailed
                    }
                    ProbeResult::IpReused {
                        namespace,
                        revision,
                    } => {
                        tracing::warn!(pod = %target.addr, revision = %target.revision, now_serving = %format!("{namespace}/{revision}"), "pod IP reused by another revision");
                        let _ = worker
                            .enqueue(Op::RemovePod {
                                revision: target.revision,
                                addr: target.addr,
                                reason: Reason::IpReused,
                                source: Source::Prober,
                            })
                            .await;
                        return;
                    }
                };
                let _ = worker
                    .enqueue(Op::MutatePod {
                        revision: target.revision,
                        target: PodTarget::Addr(target.addr),
                        event: op,
                        source: Source::Prober,
                    })
                    .await;
            });
        }
    }
}
