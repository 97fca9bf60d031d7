//! Panics kept to the work that caused them.
//!
//! monoio does not catch a panic in a task: it unwinds through the reactor and ends the shard
//! thread, with every connection on it. Work that strangers' input drives (a connection, an
//! HTTP/2 stream, a request) therefore runs inside [`catching`]: a panic ends that piece of
//! work only, is counted (`ShardStats::panics`) and logged, and the shard serves on. Whatever
//! the future held is dropped while unwinding (a slot guard gives its slot back). The shard's
//! own tasks (commands, grants, timers) are not wrapped: a panic there leaves the shard in a
//! state nobody can vouch for, so it ends the thread, and `Readiness` turns health red.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

use crate::metrics::ShardStats;

/// Runs `work`; a panic inside it comes back as `Err` with the panic's payload.
///
/// Unwind safety is asserted: the state a panicking future leaves behind is dropped, never used
/// again (the caller only learns that it panicked).
///
/// Not an `async fn`: one would hold `work` twice, as its argument and as the future it awaits,
/// doubling the size of every request's and connection's state and copying it once more.
#[inline]
pub fn catching<F: Future>(
    work: F,
) -> impl Future<Output = Result<F::Output, Box<dyn Any + Send>>> {
    AssertUnwindSafe(work).catch_unwind()
}

/// The message a panic carried (`panic!("...")`'s text), for a log line.
pub fn message(panic: &(dyn Any + Send)) -> &str {
    if let Some(text) = panic.downcast_ref::<&'static str>() {
        text
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text
    } else {
        "(a panic without a message)"
    }
}

/// Records a panic that `what` contained: counted on the shard and logged.
pub fn record(stats: &ShardStats, what: &str, panic: &(dyn Any + Send)) {
    stats.panics.increment();
    tracing::error!(
        shard = stats.index,
        "a panic ended {what}; the shard serves on: {}",
        message(panic)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_panicking_future_yields_its_message_and_a_good_one_its_output() {
        let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .build()
            .unwrap();
        runtime.block_on(async {
            let good = catching(async { 7 }).await;
            assert_eq!(good.ok(), Some(7));
            let bad = catching(async {
                let guard = Arc::new(());
                let held = guard.clone();
                // Something held across the panic is dropped while unwinding.
                let _kept = held;
                if Arc::strong_count(&guard) == 2 {
                    panic!("injected: {}", 42);
                }
            })
            .await;
            let panic = bad.expect_err("the future panicked");
            assert_eq!(message(&*panic), "injected: 42");
        });
    }
}
