//! The housekeeping sweep: now and then, NotReady trackers idle for 10 minutes are collected.

use std::time::Duration;

use crate::state::Op;
use crate::worker::WorkerHandle;

/// Collects idle NotReady trackers now and then.
pub async fn run(worker: WorkerHandle, every: Duration) {
    let mut ticker = tokio::time::interval(every);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        if worker.enqueue(Op::CleanupStale).await.is_err() {
            return;
        }
    }
}
