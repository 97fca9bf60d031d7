//! One shard's HTTP/2 connections to pods: one multiplexed h2c connection per pod, dialled on
//! first use, shared by every stream of the shard that goes there, dropped when the pod closes it,
//! sends GOAWAY, or it has carried nothing for the pool's idle timeout.
//!
//! While a dial is under way, other streams for that pod wait for it instead of dialling their
//! own: a cold burst of N streams opens one connection, not N.
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

use crate::metrics::{AllShardStats, ShardStats};
use crate::runtime::contain;
use crate::runtime::signal::LocalEvent;
use crate::upstream::error::{TransportCause, UpstreamError};
use crate::upstream::pool::{connect, PoolConfig};

/// Default of `proxy.h2_max_concurrent_streams`: 250 streams per client connection, as Go's
/// `x/net/http2` server (upstream's) advertises.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 250;
/// Default of `proxy.h2_stream_window_bytes`: 1 MiB, Go's per-stream upload buffer.
pub const DEFAULT_STREAM_WINDOW: u32 = 1 << 20;
/// Default of `proxy.h2_connection_window_bytes`: 2 MiB. What one connection can have buffered
/// in the activator from its client (and from a pod) at most.
pub const DEFAULT_CONNECTION_WINDOW: u32 = 2 << 20;
/// Default of `proxy.h2_max_frame_bytes`: 16 KiB, the protocol's initial value.
pub const DEFAULT_MAX_FRAME: u32 = 16 << 10;
/// Default of `proxy.h2_max_header_list_bytes`: 64 KiB, as an HTTP/1 request head.
pub const DEFAULT_MAX_HEADER_LIST: u32 = 64 << 10;

/// HTTP/2 settings, for client connections and for connections to pods alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct H2Settings {
    /// Streams a client may have open on one connection.
    pub max_concurrent_streams: u32,
    /// Initial flow-control window of each stream, both directions.
    pub stream_window: u32,
    /// Flow-control window of a whole connection, both directions.
    pub connection_window: u32,
    /// Largest frame payload we accept.
    pub max_frame: u32,
    /// Largest header block we accept (decoded size).
    pub max_header_list: u32,
}

impl Default for H2Settings {
    fn default() -> Self {
        H2Settings {
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            stream_window: DEFAULT_STREAM_WINDOW,
            connection_window: DEFAULT_CONNECTION_WINDOW,
            max_frame: DEFAULT_MAX_FRAME,
            max_header_list: DEFAULT_MAX_HEADER_LIST,
        }
    }
}

/// A way to open streams to one pod: the connection's handle, and the pod's address as an
/// HTTP/2 `:authority` (made once per connection, not once per request).
#[derive(Clone)]
pub(crate) struct PodStreams {
    pub sender: SendRequest<Bytes>,
    pub authority: http::uri::Authority,
}

/// A live connection to one pod.
struct PodConn {
    streams: PodStreams,
    /// Set by the connection's task when it ends (the pod closed it, GOAWAY, an error).
    closed: Rc<Cell<bool>>,
    last_used: Cell<Instant>,
}

/// A dial under way, which other checkouts of the pod wait for.
#[derive(Default)]
struct Dial {
    done: LocalEvent,
    /// Its result, once done; none if the dialling stream went away before the end (then a
    /// waiter dials itself).
    result: RefCell<Option<Result<PodStreams, UpstreamError>>>,
}

enum Entry {
    Dialing(Rc<Dial>),
    Open(PodConn),
}

/// The shard's h2c connections, by pod address.
pub(crate) struct H2cConnections {
    pool: PoolConfig,
    settings: H2Settings,
    conns: RefCell<FxHashMap<SocketAddr, Entry>>,
    /// The shard's counters, for the connection tasks this spawns.
    stats: AllShardStats,
    shard: usize,
}

impl H2cConnections {
    pub(crate) fn new(
        pool: PoolConfig,
        settings: H2Settings,
        stats: AllShardStats,
        shard: usize,
    ) -> H2cConnections {
        H2cConnections {
            pool,
            settings,
            conns: RefCell::new(FxHashMap::default()),
            stats,
            shard,
        }
    }

    /// A handle on the connection to `addr`: the open one, the one being dialled, or a new one.
    /// `reused`: it was open already.
    pub(crate) async fn checkout(
        &self,
        addr: SocketAddr,
        stats: &ShardStats,
    ) -> Result<(PodStreams, bool), UpstreamError> {
        loop {
            let dialling = match self.conns.borrow().get(&addr) {
                Some(Entry::Open(conn)) if !conn.closed.get() => {
                    conn.last_used.set(Instant::now());
                    stats.upstream_reuses.increment();
                    return Ok((conn.streams.clone(), true));
                }
                Some(Entry::Dialing(dial)) => Some(dial.clone()),
                Some(Entry::Open(_)) | None => None,
            };
            let Some(dial) = dialling else {
                break;
            };
            dial.done.wait().await;
            let result = dial.result.borrow().clone();
            if let Some(result) = result {
                return result.map(|sender| (sender, false));
            }
        }
        let dial = Rc::new(Dial::default());
        self.conns
            .borrow_mut()
            .insert(addr, Entry::Dialing(dial.clone()));
        // Whatever happens to this checkout (its stream may be reset mid-dial), the entry and
        // its waiters are settled.
        let mut settle = Settle {
            pods: self,
            addr,
            dial: &dial,
            result: None,
        };
        let result = Box::pin(self.dial(addr, stats)).await;
        settle.result = Some(match &result {
            Ok((streams, _)) => Ok(streams.clone()),
            Err(error) => Err(error.clone()),
        });
        if let Ok((streams, closed)) = &result {
            self.conns.borrow_mut().insert(
                addr,
                Entry::Open(PodConn {
                    streams: streams.clone(),
                    closed: closed.clone(),
                    last_used: Cell::new(Instant::now()),
                }),
            );
        }
        drop(settle);
        result.map(|(streams, _)| (streams, false))
    }

    /// Forgets the connection to `addr` (it refused a new stream: GOAWAY), so the next
    /// checkout dials a new one. Streams already on it finish there.
    pub(crate) fn forget(&self, addr: SocketAddr) {
        let mut conns = self.conns.borrow_mut();
        if matches!(conns.get(&addr), Some(Entry::Open(_))) {
            conns.remove(&addr);
        }
    }

    async fn dial(
        &self,
        addr: SocketAddr,
        stats: &ShardStats,
    ) -> Result<(PodStreams, Rc<Cell<bool>>), UpstreamError> {
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
        let (all_stats, shard) = (self.stats.clone(), self.shard);
        monoio::spawn(async move {
            match contain::catching(connection).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::debug!(pod = %addr, "h2c connection to pod ended: {error}");
                }
                Err(panic) => {
                    contain::record(&all_stats[shard], "an h2c connection to a pod", &*panic)
                }
            }
            flag.set(true);
        });
        let authority = http::uri::Authority::try_from(addr.to_string())
            .expect("a socket address is a valid authority");
        Ok((PodStreams { sender, authority }, closed))
    }

    /// Drops connections that carried nothing for the idle timeout (streams still running on
    /// one keep it open until they end). Run periodically.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        let idle = self.pool.idle_timeout;
        self.conns.borrow_mut().retain(|_, entry| match entry {
            Entry::Open(conn) => {
                !conn.closed.get() && now.duration_since(conn.last_used.get()) < idle
            }
            Entry::Dialing(_) => true,
        });
    }

    /// Drops every connection (stop): each closes once its streams ended.
    pub(crate) fn clear(&self) {
        self.conns.borrow_mut().clear();
    }
}

/// Ends a dial's entry: on success the caller has put the open connection in its place; on
/// failure, or when the dialling checkout was dropped mid-dial, the entry goes. Either way
/// the waiters wake and read `result` (none: they dial themselves).
struct Settle<'a> {
    pods: &'a H2cConnections,
    addr: SocketAddr,
    dial: &'a Rc<Dial>,
    result: Option<Result<PodStreams, UpstreamError>>,
}

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        let succeeded = matches!(self.result, Some(Ok(_)));
        if !succeeded {
            let mut conns = self.pods.conns.borrow_mut();
            if matches!(conns.get(&self.addr), Some(Entry::Dialing(dial)) if Rc::ptr_eq(dial, self.dial))
            {
                conns.remove(&self.addr);
            }
        }
        *self.dial.result.borrow_mut() = self.result.take();
        self.dial.done.set();
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
