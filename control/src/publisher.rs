//! Sends commands to every shard over its own channel. One way only: control → shards.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flume::Sender;
use kactivator_shards::metrics::AllShardStats;
use kactivator_shards::routing::{RoutingUpdate, ShardCommand};

/// The sending ends of the shards' command channels.
#[derive(Clone)]
pub struct Publisher {
    shards: Vec<Sender<ShardCommand>>,
    /// The newest routing version sent.
    published: Arc<AtomicU64>,
}

impl Publisher {
    pub fn new(shards: Vec<Sender<ShardCommand>>) -> Publisher {
        Publisher {
            shards,
            published: Arc::default(),
        }
    }

    /// Sends routing updates to every shard, in order.
    pub fn publish(&self, updates: impl IntoIterator<Item = RoutingUpdate>) {
        for update in updates {
            self.published.fetch_max(update.version(), Ordering::AcqRel);
            self.broadcast(ShardCommand::Routing(update));
        }
    }

    /// The newest routing version sent to the shards so far.
    pub fn published_version(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    /// Sends one command to every shard. The channels are unbounded: a shard that is busy
    /// applies the backlog between requests, and control never blocks on a shard.
    pub fn broadcast(&self, command: ShardCommand) {
        for shard in &self.shards {
            // A shard that exited has nothing left to update.
            let _ = shard.send(command.clone());
        }
    }
}

/// How often [`until_served`] looks at the shards.
const SERVED_CHECK_EVERY: Duration = Duration::from_millis(1);

/// Returns once every shard serves `version` or a later one (its `routing_version`), within
/// `within`: false when time ran out first. The shards apply what is published between
/// requests, so "published" is not "served": a request that arrives the moment after a publish
/// can still find the shard's old table. A shard whose thread ended is not waited for (readiness
/// reports it on its own).
pub async fn until_served(
    stats: &AllShardStats,
    dead: impl Fn() -> usize,
    version: u64,
    within: Duration,
) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let behind = stats
            .iter()
            .filter(|shard| shard.routing_version.get() < version)
            .count();
        if behind <= dead() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(SERVED_CHECK_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_utils::CachePadded;
    use kactivator_shards::metrics::ShardStats;

    #[tokio::test(start_paused = true)]
    async fn served_means_every_live_shard_has_applied_the_version() {
        let stats: AllShardStats = Arc::from(vec![
            CachePadded::new(ShardStats::new(0)),
            CachePadded::new(ShardStats::new(1)),
        ]);
        stats[0].routing_version.set(3);
        let within = Duration::from_millis(50);
        assert!(
            !until_served(&stats, || 0, 3, within).await,
            "shard 1 is behind"
        );
        assert!(
            until_served(&stats, || 1, 3, within).await,
            "shard 1 is dead"
        );
        stats[1].routing_version.set(4);
        assert!(until_served(&stats, || 0, 3, within).await);
        assert!(
            until_served(&stats, || 0, 0, within).await,
            "nothing published yet"
        );
    }
}
