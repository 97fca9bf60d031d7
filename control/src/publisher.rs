//! Sends commands to every shard over its own channel. One way only: control → shards.

use flume::Sender;
use kactivator_shards::routing::{RoutingUpdate, ShardCommand};

/// The sending ends of the shards' command channels.
#[derive(Clone)]
pub struct Publisher {
    shards: Vec<Sender<ShardCommand>>,
}

impl Publisher {
    pub fn new(shards: Vec<Sender<ShardCommand>>) -> Publisher {
        Publisher { shards }
    }

    /// Sends routing updates to every shard, in order.
    pub fn publish(&self, updates: impl IntoIterator<Item = RoutingUpdate>) {
        for update in updates {
            self.broadcast(ShardCommand::Routing(update));
        }
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
