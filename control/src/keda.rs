//! The parts of KEDA's HTTP add-on kactivator answers for (issue 40; `reference/keda-http-add-on.md`):
//! what KEDA's external-scaler calls ask for and what they are answered, in the add-on's terms,
//! a route's request rate as the add-on computes it, and an HTTPScaledObject read as a route.
//! Pure: `object`, `scaler`, `rate`, `counts`, `model`, `env`. Shells on the control thread:
//! `source` (the watches of HTTPScaledObjects, Services and EndpointSlices into state-worker
//! ops) and `grpc` (the external scaler and gRPC health KEDA calls).

pub mod counts;
pub mod env;
pub mod grpc;
pub mod model;
pub mod object;
pub mod peers;
pub mod rate;
pub mod scaler;
pub mod source;
pub mod tls;

use std::sync::Arc;

use kactivator_shards::metrics::AllShardStats;
use kactivator_shards::runtime::readiness::Readiness;

use crate::publisher::Publisher;
use crate::worker::WorkerHandle;

/// What the role runs on the control thread: the source and the scaler's bound port.
pub struct KedaRun {
    pub source: source::KedaSource,
    pub scaler: std::net::TcpListener,
    /// Where the other replicas are listed; `None`: this one alone.
    pub peers: Option<peers::PeerService>,
    /// How often `StreamIsActive` sends (`KEDA_HTTP_SCALER_STREAM_INTERVAL_MS`).
    pub stream_every: std::time::Duration,
}

impl KedaRun {
    /// Starts the source, the counting task and the scaler's gRPC server on the current
    /// (control) runtime.
    pub fn spawn(
        self,
        worker: WorkerHandle,
        readiness: Arc<Readiness>,
        publisher: Publisher,
        stats: AllShardStats,
        registry: &crate::metrics::Registry,
    ) -> std::io::Result<()> {
        self.scaler.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(self.scaler)?;
        let (routes_sender, routes) = tokio::sync::watch::channel(source::ScaledRoutes::default());
        let (counts_sender, counts) = tokio::sync::watch::channel(grpc::Counts {
            by_route: Arc::default(),
            taken: std::time::Instant::now(),
        });
        let (peers_sender, peers) = tokio::sync::watch::channel(Vec::new());
        if let Some(service) = self.peers {
            tokio::spawn(
                self.source
                    .watch_peers(service, peers_sender, worker.clone()),
            );
        }
        tokio::spawn(self.source.run(
            worker,
            readiness.clone(),
            publisher,
            stats.clone(),
            routes_sender,
            crate::sources::kubernetes::informers::event_apply_histogram(registry),
        ));
        tokio::spawn(grpc::count(stats, routes.clone(), peers, counts_sender));
        tokio::spawn(grpc::serve(
            listener,
            grpc::Scaler::new(routes, counts, readiness).streaming_every(self.stream_every),
        ));
        Ok(())
    }
}
