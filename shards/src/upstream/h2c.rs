//! One shard's HTTP/2 connections to pods: multiplexed h2c connections, dialled on first use,
//! shared by every stream of the shard that goes to that pod, dropped when the pod closes one,
//! sends GOAWAY, or it has carried nothing for the pool's idle timeout.
//!
//! A connection carries at most what its pod allows (`SETTINGS_MAX_CONCURRENT_STREAMS`, 100 to
//! 250 in common servers): a stream that finds every connection to its pod full gets a new
//! one, as Go's transport does, instead of waiting in `h2` behind streams that may last
//! (review finding: at containerConcurrency 0 the streams beyond the pod's limit waited, and
//! long-lived ones turned the rest into 504s). Streams are counted here from checkout to the
//! end of their exchange ([`Lease`]).
//!
//! While a dial is under way, other streams for that pod wait for it instead of dialling their
//! own: a cold burst of N streams opens one connection, not N.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::net::SocketAddr;
use std::rc::Rc;
use std::task::Poll;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::{Reason, SendStream};
use monoio::io::IntoPollIo;
use monoio::time::Instant;
use rustc_hash::FxHashMap;

use crate::metrics::{AllShardStats, ShardStats};
use crate::runtime::contain;
use crate::runtime::signal::{LocalEvent, LocalNotify};
use crate::runtime::stream::{Connector, PlainTcp};
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
/// Streams a new connection to a pod carries until the pod's SETTINGS say how many it allows:
/// 100, as Go's transport assumes (`initialMaxConcurrentStreams`). Without it, `h2` assumes no
/// limit, and a burst on a fresh connection sent streams that the pod refused.
pub const INITIAL_MAX_SEND_STREAMS: usize = 100;
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
    /// The connection's PING round trips.
    pub pings: Rc<Pings>,
}

/// PING round trips on one connection, shared by its streams: how a stream reset because its
/// client left learns that the pod has read the reset, and so stopped the work (gRPC servers
/// cancel the call's context on RST_STREAM). Only then is the pod's slot given back: a pod is
/// busy until it knows the request is abandoned, not until our client left.
///
/// One round trip is not proof: `h2` writes a PING requested after the reset in the same pass
/// as the reset, possibly before it. The second round trip leaves only once the first PONG
/// came back, after the reset was written, and the pod reads frames in order: its PONG comes
/// after the pod read the RST_STREAM.
pub(crate) struct Pings {
    ping_pong: RefCell<Option<h2::PingPong>>,
    /// Round trips started, and completed, so far (one at a time).
    started: Cell<u64>,
    completed: Cell<u64>,
    in_flight: Cell<bool>,
    /// Wakes the streams waiting while another drives a round trip.
    done: LocalNotify,
}

impl Pings {
    fn new(ping_pong: Option<h2::PingPong>) -> Pings {
        Pings {
            ping_pong: RefCell::new(ping_pong),
            started: Cell::new(0),
            completed: Cell::new(0),
            in_flight: Cell::new(false),
            done: LocalNotify::default(),
        }
    }

    /// Returns once the pod has read every frame this connection wrote before the call: two
    /// round trips that both started after it, or at once when the connection is gone.
    pub(crate) async fn confirm_written(&self) {
        let target = self.started.get() + 2;
        while self.completed.get() < target {
            if self.in_flight.get() {
                self.done.notified().await;
                continue;
            }
            if !self.round_trip().await {
                return;
            }
        }
    }

    /// One PING and its PONG, driven by the caller; false when the connection cannot carry it.
    async fn round_trip(&self) -> bool {
        let Some(ping_pong) = self.ping_pong.borrow_mut().take() else {
            return false;
        };
        self.in_flight.set(true);
        self.started.set(self.started.get() + 1);
        // Whatever happens to the caller (its deadline may drop it mid-way), the handle goes
        // back and the next waiter can drive the next round trip.
        let mut round = RoundTrip {
            pings: self,
            ping_pong: Some(ping_pong),
        };
        let ping_pong = round.ping_pong.as_mut().expect("put there above");
        let mut answered = ping_pong.ping(h2::Ping::opaque()).await;
        if answered.is_err() && !ping_pong_closed(&answered) {
            // A round trip whose driver went away left its PONG unread: collect it, then ours.
            answered = match std::future::poll_fn(|cx| ping_pong.poll_pong(cx)).await {
                Ok(_) => ping_pong.ping(h2::Ping::opaque()).await,
                Err(error) => Err(error),
            };
        }
        if answered.is_ok() {
            self.completed.set(self.completed.get() + 1);
        }
        answered.is_ok()
    }
}

/// Whether a failed ping failed because the connection is gone (rather than a PONG of an
/// earlier round trip left unread).
fn ping_pong_closed(answered: &Result<h2::Pong, h2::Error>) -> bool {
    answered
        .as_ref()
        .err()
        .is_some_and(|error| error.is_io() || error.is_go_away() || error.is_remote())
}

/// A round trip under way: ends it however its driver ends, the connection's handle put back.
struct RoundTrip<'a> {
    pings: &'a Pings,
    ping_pong: Option<h2::PingPong>,
}

impl Drop for RoundTrip<'_> {
    fn drop(&mut self) {
        *self.pings.ping_pong.borrow_mut() = self.ping_pong.take();
        self.pings.in_flight.set(false);
        self.pings.done.notify_all();
    }
}

/// A live connection to one pod.
struct PodConn {
    /// Tells it from the pod's other connections.
    id: u64,
    streams: PodStreams,
    /// Set by the connection's task when it ends (the pod closed it, GOAWAY, an error).
    closed: Rc<Cell<bool>>,
    last_used: Cell<Instant>,
    /// Streams checked out on it whose exchange has not ended.
    leased: Rc<Cell<usize>>,
}

impl PodConn {
    /// Whether another stream fits under the pod's current limit.
    fn has_room(&self) -> bool {
        !self.closed.get() && self.leased.get() < self.streams.sender.current_max_send_streams()
    }

    fn lease(&self) -> Lease {
        self.leased.set(self.leased.get() + 1);
        self.last_used.set(Instant::now());
        Lease {
            conn: self.id,
            leased: self.leased.clone(),
        }
    }
}

/// A stream's place on one connection, from checkout to the end of its exchange: the
/// connection counts it while this lives.
pub(crate) struct Lease {
    conn: u64,
    leased: Rc<Cell<usize>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.leased.set(self.leased.get().saturating_sub(1));
    }
}

/// A dial under way, which other checkouts of the pod wait for.
#[derive(Default)]
struct Dial {
    done: LocalEvent,
    /// Its result, once done (the connection itself is in the entry); none if the dialling
    /// stream went away before the end (then a waiter dials itself).
    result: RefCell<Option<Result<(), UpstreamError>>>,
}

/// A pod's connections, and the dial under way to it if any.
#[derive(Default)]
struct Entry {
    open: Vec<PodConn>,
    dialing: Option<Rc<Dial>>,
}

/// The shard's h2c connections, by pod address.
pub(crate) struct H2cConnections<C: Connector = PlainTcp> {
    pool: PoolConfig,
    connector: C,
    settings: H2Settings,
    conns: RefCell<FxHashMap<SocketAddr, Entry>>,
    /// The id of the next connection.
    next_id: Cell<u64>,
    /// The shard's counters, for the connection tasks this spawns.
    stats: AllShardStats,
    shard: usize,
}

impl<C: Connector> H2cConnections<C> {
    pub(crate) fn new(
        pool: PoolConfig,
        connector: C,
        settings: H2Settings,
        stats: AllShardStats,
        shard: usize,
    ) -> H2cConnections<C> {
        H2cConnections {
            pool,
            connector,
            settings,
            conns: RefCell::new(FxHashMap::default()),
            next_id: Cell::new(0),
            stats,
            shard,
        }
    }

    /// A handle on a connection to `addr` with room for one more stream: an open one, the one
    /// being dialled, or a new one. `reused`: it was open already. The stream counts against
    /// the connection while the [`Lease`] lives.
    pub(crate) async fn checkout(
        &self,
        addr: SocketAddr,
        target: &C::Target,
        stats: &ShardStats,
    ) -> Result<(PodStreams, bool, Lease), UpstreamError> {
        loop {
            let dialling = {
                let conns = self.conns.borrow();
                let Some(entry) = conns.get(&addr) else {
                    break;
                };
                if let Some(conn) = entry.open.iter().find(|conn| conn.has_room()) {
                    stats.upstream_reuses.increment();
                    return Ok((conn.streams.clone(), true, conn.lease()));
                }
                match &entry.dialing {
                    Some(dial) => dial.clone(),
                    None => break,
                }
            };
            dialling.done.wait().await;
            let failed = match &*dialling.result.borrow() {
                Some(Err(error)) => Some(error.clone()),
                // Dialled: look again for room (the new connection may be full already).
                Some(Ok(())) => None,
                // The dialling stream went away before the end: dial again.
                None => None,
            };
            if let Some(error) = failed {
                return Err(error);
            }
            // Dialled for us: the new connection is in the entry, take it even before the pod's
            // SETTINGS say how many streams it allows.
            let fresh = {
                let conns = self.conns.borrow();
                conns.get(&addr).and_then(|entry| {
                    entry
                        .open
                        .iter()
                        .rev()
                        .find(|conn| conn.has_room())
                        .map(|conn| (conn.streams.clone(), conn.lease()))
                })
            };
            if let Some((streams, lease)) = fresh {
                return Ok((streams, false, lease));
            }
        }
        let dial = Rc::new(Dial::default());
        self.conns.borrow_mut().entry(addr).or_default().dialing = Some(dial.clone());
        // Whatever happens to this checkout (its stream may be reset mid-dial), the entry and
        // its waiters are settled.
        let mut settle = Settle {
            pods: self,
            addr,
            dial: &dial,
            result: None,
        };
        let result = Box::pin(self.dial(addr, target, stats)).await;
        settle.result = Some(result.as_ref().map(|_| ()).map_err(Clone::clone));
        let dialled = result.map(|(streams, closed)| {
            let id = self.next_id.get();
            self.next_id.set(id + 1);
            let conn = PodConn {
                id,
                streams: streams.clone(),
                closed,
                last_used: Cell::new(Instant::now()),
                leased: Rc::default(),
            };
            let lease = conn.lease();
            self.conns
                .borrow_mut()
                .entry(addr)
                .or_default()
                .open
                .push(conn);
            (streams, false, lease)
        });
        drop(settle);
        dialled
    }

    /// Forgets the connection `lease` was on (it refused a new stream: GOAWAY), so the next
    /// checkout uses another or dials a new one. Streams already on it finish there.
    pub(crate) fn forget(&self, addr: SocketAddr, lease: &Lease) {
        let mut conns = self.conns.borrow_mut();
        if let Some(entry) = conns.get_mut(&addr) {
            entry.open.retain(|conn| conn.id != lease.conn);
            if entry.open.is_empty() && entry.dialing.is_none() {
                conns.remove(&addr);
            }
        }
    }

    async fn dial(
        &self,
        addr: SocketAddr,
        target: &C::Target,
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
        let stream = connect(&self.connector, addr, target, timeout, stats).await?;
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
            .initial_max_send_streams(INITIAL_MAX_SEND_STREAMS)
            .enable_push(false);
        // The handshake is our preface and SETTINGS; the pod's SETTINGS arrive with the first
        // frames the connection reads. It counts against the connect timeout.
        let left = timeout.saturating_sub(started.elapsed());
        let (sender, mut connection) =
            match monoio::time::timeout(left, builder.handshake(io)).await {
                Ok(Ok(pair)) => pair,
                Ok(Err(error)) => return Err(h2_failure(addr, &error, Phase::Dial)),
                Err(_) => return Err(timed_out()),
            };
        let pings = Rc::new(Pings::new(connection.ping_pong()));
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
        Ok((
            PodStreams {
                sender,
                authority,
                pings,
            },
            closed,
        ))
    }

    /// Drops connections that carried nothing for the idle timeout (streams still running on
    /// one keep it open until they end). Run periodically.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        let idle = self.pool.idle_timeout;
        self.conns.borrow_mut().retain(|_, entry| {
            entry.open.retain(|conn| {
                !conn.closed.get()
                    && (conn.leased.get() > 0 || now.duration_since(conn.last_used.get()) < idle)
            });
            !entry.open.is_empty() || entry.dialing.is_some()
        });
    }

    /// Drops every connection (stop): each closes once its streams ended.
    pub(crate) fn clear(&self) {
        self.conns.borrow_mut().clear();
    }
}

/// Ends a dial: on success the caller has added the open connection to the entry; either way
/// the entry no longer has this dial under way (an entry left with nothing goes), and the
/// waiters wake and read `result` (none: they dial themselves).
struct Settle<'a, C: Connector> {
    pods: &'a H2cConnections<C>,
    addr: SocketAddr,
    dial: &'a Rc<Dial>,
    result: Option<Result<(), UpstreamError>>,
}

impl<C: Connector> Drop for Settle<'_, C> {
    fn drop(&mut self) {
        let mut conns = self.pods.conns.borrow_mut();
        if let Some(entry) = conns.get_mut(&self.addr) {
            if entry
                .dialing
                .as_ref()
                .is_some_and(|dial| Rc::ptr_eq(dial, self.dial))
            {
                entry.dialing = None;
            }
            if entry.open.is_empty() && entry.dialing.is_none() {
                conns.remove(&self.addr);
            }
        }
        drop(conns);
        *self.dial.result.borrow_mut() = self.result.take();
        self.dial.done.set();
    }
}

/// Sends `data` as the peer's window allows, waiting for window as needed.
pub(crate) async fn send_all(
    send: &mut SendStream<Bytes>,
    mut data: Bytes,
) -> Result<(), h2::Error> {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let granted = poll_fn(|cx| match send.capacity() {
            0 => send.poll_capacity(cx),
            available => Poll::Ready(Some(Ok(available))),
        })
        .await;
        match granted {
            Some(Ok(0)) => continue,
            Some(Ok(available)) => {
                let chunk = data.split_to(available.min(data.len()));
                send.send_data(chunk, false)?;
            }
            Some(Err(error)) => return Err(error),
            None => return Err(h2::Error::from(Reason::CANCEL)),
        }
    }
    Ok(())
}

/// Why a pod's HTTP/2 response could not be relayed to its end (either front's client).
pub(crate) enum Cut {
    ClientGone,
    Pod(UpstreamError),
    TimedOut,
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
