//! The control plane: one tokio thread that owns configuration and publishes routing snapshots.
//!
//! Data flows one way: sources (the standalone file for now) → routing table → versioned updates
//! over one channel per shard. The admin server reads shard counters; it never writes to them.

pub mod admin;
pub mod config;
pub mod metrics;
pub mod pod_state;
pub mod publisher;
pub mod shell;
pub mod standalone;
pub mod state;
pub mod table;
pub mod worker;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kactivator_shards::metrics::AllShardStats;
use kactivator_shards::routing::ShardCommand;
use tokio::signal::unix::{signal, SignalKind};

use crate::admin::AdminState;
use crate::config::Config;
use crate::publisher::Publisher;
use crate::table::RoutingTable;

/// The control thread's state.
pub struct ControlPlane {
    config: Config,
    table: RoutingTable,
    publisher: Publisher,
    admin: Arc<AdminState>,
}

impl ControlPlane {
    /// Builds the routing table from `config` and queues it for every shard, so a shard's first
    /// request already sees it.
    pub fn new(
        shards: usize,
        config: Config,
        publisher: Publisher,
        stats: AllShardStats,
        pod_name: String,
    ) -> ControlPlane {
        let mut table = RoutingTable::new(shards);
        publisher.publish(table.replace_all(standalone::desired_revisions(&config)));
        let admin = Arc::new(AdminState {
            stats,
            pod_name,
            registry: prometheus::Registry::new(),
            ready: false.into(),
            draining: false.into(),
        });
        ControlPlane {
            config,
            table,
            publisher,
            admin,
        }
    }

    /// Revisions currently routed.
    pub fn revision_count(&self) -> usize {
        self.table.len()
    }

    /// Serves the admin port and waits for SIGTERM/SIGINT, then drains: readiness fails at once,
    /// requests keep being served for the grace period, then the shards stop accepting. Returns
    /// when the shards have been told to stop; the caller joins them.
    pub async fn run(self, admin_listener: std::net::TcpListener) -> std::io::Result<()> {
        admin_listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(admin_listener)?;
        tokio::spawn(admin::serve(listener, self.admin.clone()));
        self.admin.ready.store(true, Ordering::Release);

        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let which = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        let grace = Duration::from_secs(self.config.proxy.drain_grace_seconds);
        tracing::info!(
            signal = which,
            grace_seconds = grace.as_secs(),
            "draining: readiness now fails; still serving"
        );
        self.admin.draining.store(true, Ordering::Release);
        self.admin.ready.store(false, Ordering::Release);
        self.publisher.broadcast(ShardCommand::BeginDrain);
        tokio::select! {
            _ = tokio::time::sleep(grace) => {}
            _ = terminate.recv() => tracing::warn!("second signal: skipping the rest of the grace period"),
            _ = interrupt.recv() => tracing::warn!("second signal: skipping the rest of the grace period"),
        }
        tracing::info!("closing listeners; finishing in-flight requests");
        self.publisher.broadcast(ShardCommand::StopAccepting);
        Ok(())
    }
}
