//! The active health check (quarantine gate on): the shell around [`ProbeSchedule`]. It keeps
//! the schedule's view of every revision's probe set from the state worker's
//! [`ProbeUpdate`]s, makes the probes the schedule says are due — at most
//! [`PROBE_CONCURRENCY`] at once, all in this one task on the control thread — in each
//! revision's protocol (h2c pods over h2c) and over its TLS where its pods are dialled over TLS
//! at their listed address (with the data plane's own client for the revision), over a kept
//! connection to each healthy pod, and hands the results back to the schedule. Only what
//! changes a pod becomes an op: a failure, an IP reuse, a probation pod's pass.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::probe::{self, Connection, ProbeResult};
use super::probe_schedule::{ProbeClass, ProbeJob, ProbeSchedule, ScheduleSettings};
use super::ControlMetrics;
use crate::pod_state::{Event, Reason, Timestamp};
use crate::state::{Op, PodTarget, ProbeUpdate, Source};
use crate::worker::WorkerHandle;

/// Most probes in flight at once.
pub const PROBE_CONCURRENCY: usize = 64;

/// Kept connections when the open-file limit cannot be read.
const KEPT_WITHOUT_A_LIMIT: usize = 256;

/// Runs the health check until the state worker's side of `updates` is gone.
pub async fn run(
    mut updates: mpsc::UnboundedReceiver<ProbeUpdate>,
    worker: WorkerHandle,
    metrics: Arc<ControlMetrics>,
    settings: ScheduleSettings,
    timeout: Duration,
) {
    let start = Instant::now();
    let clock = move || Timestamp::from_epoch_offset(start.elapsed());
    let mut schedule = ProbeSchedule::new(settings);
    // A quarter of the open-file limit: the rest is for clients, pods and the API server.
    let keep_limit = kactivator_shards::runtime::limits::open_files()
        .map_or(KEPT_WITHOUT_A_LIMIT, |limit| {
            usize::try_from(limit / 4).unwrap_or(usize::MAX)
        });
    let mut kept: HashMap<SocketAddr, Connection> = HashMap::new();
    let mut probes = FuturesUnordered::new();
    let mut counts = [usize::MAX; 4];
    loop {
        for job in schedule.due(clock(), PROBE_CONCURRENCY - probes.len()) {
            let connection = kept.remove(&job.addr);
            probes.push(async move {
                // The route's own client to the pods (`PodTls::upstream`), not a copy of it.
                let tls = job.tls.as_ref().map(|tls| tls.upstream(false));
                let (result, connection) = probe::probe_on(
                    connection,
                    job.addr,
                    &job.revision,
                    job.protocol,
                    tls.as_deref(),
                    timeout,
                    true,
                )
                .await;
                (job, result, connection)
            });
        }
        if schedule.counts() != counts {
            counts = schedule.counts();
            for (class, count) in ProbeClass::ALL.iter().zip(counts) {
                metrics
                    .probe_targets
                    .with_label_values(&[class.label()])
                    .set(count as i64);
            }
        }
        // With every probe slot taken, the next completion is what frees one.
        let wakeup = (probes.len() < PROBE_CONCURRENCY)
            .then(|| schedule.next_wakeup())
            .flatten();
        let sleep = async move {
            match wakeup {
                Some(at) => tokio::time::sleep_until(start + at.epoch_offset()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            update = updates.recv() => {
                let Some(update) = update else {
                    return;
                };
                let now = clock();
                let mut next = Some(update);
                while let Some(update) = next {
                    for addr in schedule.update(update, now) {
                        kept.remove(&addr);
                    }
                    next = updates.try_recv().ok();
                }
            }
            Some((job, result, connection)) = probes.next(), if !probes.is_empty() => {
                metrics.probes.with_label_values(&[result.label()]).inc();
                let passed = result == ProbeResult::Healthy;
                if !schedule.complete(job.ticket, passed, clock()) {
                    // The pod left (or was replaced) while the probe was out.
                    continue;
                }
                if let Some(connection) = connection {
                    if kept.len() < keep_limit {
                        kept.insert(job.addr, connection);
                    }
                }
                if let Some(op) = op_for(&job, result) {
                    let worker = worker.clone();
                    // Enqueueing waits while the worker's queue is full; probing goes on.
                    tokio::spawn(async move {
                        let _ = worker.enqueue(op).await;
                    });
                }
            }
            () = sleep => {}
        }
    }
}

/// The op a probe's result calls for, if any: a pass only matters on probation.
fn op_for(job: &ProbeJob, result: ProbeResult) -> Option<Op> {
    let event = match result {
        ProbeResult::Healthy => {
            if !job.recovering {
                return None;
            }
            Event::HealthCheckPassed
        }
        ProbeResult::Unhealthy(_) | ProbeResult::Answered { .. } => {
            let reason = result.reason();
            tracing::warn!(pod = %job.addr, revision = %job.revision, "health check failed: {reason}");
            Event::HealthCheckFailed
        }
        ProbeResult::IpReused {
            namespace,
            revision,
        } => {
            tracing::warn!(pod = %job.addr, revision = %job.revision, now_serving = %format!("{namespace}/{revision}"), "pod IP reused by another revision");
            return Some(Op::RemovePod {
                revision: job.revision.clone(),
                addr: job.addr,
                reason: Reason::IpReused,
                source: Source::Prober,
            });
        }
    };
    Some(Op::MutatePod {
        revision: job.revision.clone(),
        target: PodTarget::Addr(job.addr),
        event,
        source: Source::Prober,
    })
}
