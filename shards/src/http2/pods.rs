//! One shard's HTTP/2 connections to pods: one multiplexed h2c connection per pod, dialled on
//! first use, shared by every stream of the shard that goes there, dropped when the pod closes it,
//! sends GOAWAY, or it has carried nothing for the pool's idle timeout.
//!
//! A stream waits in `h2` for the pod's `SETTINGS_MAX_CONCURRENT_STREAMS`; admission keeps a
//! pod's streams at its containerConcurrency anyway.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;

use bytes::Bytes;
use h2::client::SendRequest;
use monoio::time::Instant;
use rustc_hash::FxHashMap;

use super::H2Settings;
use crate::metrics::ShardStats;
use crate::upstream::error::{TransportCause, UpstreamError};
use crate::upstream::pool::{connect, PoolConfig};

/// A live connection to one pod.
struct PodConn {
    sender: SendRequest<Bytes>,
    /// Set by the connection's task when it ends (the pod closed it, GOAWAY, an error).
    closed: Rc<Cell<bool>>,
    last_used: Cell<Instant>,
}

/// The shard's h2c connections, by pod address.
pub(crate) struct H2Pods {
    pool: PoolConfig,
    settings: H2Settings,
    conns: RefCell<FxHashMap<SocketAddr, PodConn>>,
}

impl H2Pods {
    pub(crate) fn new(pool: PoolConfig, settings: H2Settings) -> H2Pods {
        H2Pods {
            pool,
            settings,
            conns: RefCell::new(FxHashMap::default()),
        }
    }

    /// A handle on the connection to `addr`, dialled if there is none. `reused`: it was there.
    pub(crate) async fn checkout(
        &self,
        addr: SocketAddr,
        stats: &ShardStats,
    ) -> Result<(SendRequest<Bytes>, bool), UpstreamError> {
        if let Some(conn) = self.conns.borrow().get(&addr) {
            if !conn.closed.get() {
                conn.last_used.set(Instant::now());
                stats.upstream_reuses.increment();
                return Ok((conn.sender.clone(), true));
            }
        }
        let (sender, closed) = Box::pin(self.dial(addr, stats)).await?;
        self.conns.borrow_mut().insert(
            addr,
            PodConn {
                sender: sender.clone(),
                closed,
                last_used: Cell::new(Instant::now()),
            },
        );
        Ok((sender, false))
    }

    /// Forgets the connection to `addr` (it refused a new stream: GOAWAY), so the next
    /// checkout dials a new one. Streams already on it finish there.
    pub(crate) fn forget(&self, addr: SocketAddr) {
        self.conns.borrow_mut().remove(&addr);
    }

    async fn dial(
        &self,
        addr: SocketAddr,
        stats: &ShardStats,
    ) -> Result<(SendRequest<Bytes>, Rc<Cell<bool>>), UpstreamError> {
        let timeout = self.pool.connect_timeout;
        let timed_out = || {
            stats.upstream_connect_errors.increment();
            UpstreamError::ConnectTimeout {
                addr,
                after_ms: timeout.as_millis() as u64,
            }
        };
        let started = Instant::now();
        let stream = connect(addr, timeout, stats).await?;
        let io = stream
            .try_into_poll_io()
            .map_err(|(error, _)| UpstreamError::Connect {
                addr,
                cause: TransportCause::of(&error),
            })?;
        let mut builder = h2::client::Builder::new();
        builder
            .initial_window_size(self.settings.stream_window)
            .initial_connection_window_size(self.settings.connection_window)
            .max_frame_size(self.settings.max_frame)
            .max_header_list_size(self.settings.max_header_list)
            .enable_push(false);
        // The handshake is our preface and SETTINGS; the pod's SETTINGS arrive with the first
        // frames the connection reads. It counts against the connect timeout.
        let left = timeout.saturating_sub(started.elapsed());
        let (sender, connection) = match monoio::time::timeout(left, builder.handshake(io)).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(error)) => return Err(h2_failure(addr, &error, Phase::Dial)),
            Err(_) => return Err(timed_out()),
        };
        let closed = Rc::new(Cell::new(false));
        let flag = closed.clone();
        monoio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(pod = %addr, "h2c connection to pod ended: {error}");
            }
            flag.set(true);
        });
        Ok((sender, closed))
    }

    /// Drops connections that carried nothing for the idle timeout (streams still running on
    /// one keep it open until they end). Run periodically.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        let idle = self.pool.idle_timeout;
        self.conns.borrow_mut().retain(|_, conn| {
            !conn.closed.get() && now.duration_since(conn.last_used.get()) < idle
        });
    }

    /// Drops every connection (stop): each closes once its streams ended.
    pub(crate) fn clear(&self) {
        self.conns.borrow_mut().clear();
    }
}

/// Where an HTTP/2 failure with a pod happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Dial,
    Receive,
}

/// An `h2` error talking to the pod at `addr`, as an upstream error.
pub(crate) fn h2_failure(addr: SocketAddr, error: &h2::Error, phase: Phase) -> UpstreamError {
    if let Some(io) = error.get_io() {
        let cause = TransportCause::of(io);
        return match phase {
            Phase::Dial => UpstreamError::Connect { addr, cause },
            Phase::Receive => UpstreamError::Receive { addr, cause },
        };
    }
    UpstreamError::Http2 {
        addr,
        detail: error.to_string(),
    }
}
