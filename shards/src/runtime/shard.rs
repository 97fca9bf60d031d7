//! One shard: a reactor thread's accept loop, its routing replica, pool and counters.

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use monoio::net::TcpListener;

use crate::http1;
use crate::http2::pods::H2Pods;
use crate::http2::H2Settings;
use crate::metrics::{AllShardStats, ShardStats};
use crate::request::identity::DEFAULT_CLUSTER_DOMAIN;
use crate::request::probes::Health;
use crate::routing::replica::Replica;
use crate::routing::{Grant, ShardCommand};
use crate::runtime::alarm::{self, Alarms};
use crate::runtime::blocks::Blocks;
use crate::runtime::contain;
use crate::runtime::control_link::ControlLink;
use crate::runtime::idle::IdleConnections;
use crate::runtime::readiness::Readiness;
use crate::runtime::signal::{BackOfQueue, LocalEvent, LocalNotify};
use crate::upstream::pool::{Pool, PoolConfig};

/// How often idle upstream connections are swept.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Once every listener is closed, how long a connection accepted before that has to send its
/// first request (it is answered, not closed under it, see `http1::connection`).
pub const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// How long a shard waits at the stop barrier for the others before going on alone (a shard
/// whose thread died must not keep the rest from stopping).
const BARRIER_PATIENCE: Duration = Duration::from_secs(2);

/// The shards' meeting point when they stop: no shard closes its listener before every shard
/// has been told to stop accepting, and no shard closes a connection it accepted before every
/// listener is closed. So a client whose connection closes can always reconnect, and a
/// connection is never refused by one shard while another still accepts.
#[derive(Debug, Default)]
pub struct StopBarrier {
    told: AtomicUsize,
    filtered: AtomicUsize,
    closed: AtomicUsize,
}

/// A classic BPF socket filter that drops a TCP segment with SYN set and ACK clear (a client
/// opening a connection) and lets everything else through: handshakes already under way
/// complete, and connections they create (which inherit the filter) carry data as usual. A
/// socket filter sees a TCP segment from its header on; byte 13 holds the flags.
const REFUSE_NEW_CONNECTIONS: [socket2::SockFilter; 5] = [
    // A = flags
    socket2::SockFilter::new(
        (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16,
        0,
        0,
        13,
    ),
    // A &= SYN | ACK
    socket2::SockFilter::new(
        (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16,
        0,
        0,
        0x12,
    ),
    // A == SYN: drop (next), else accept (the one after)
    socket2::SockFilter::new(
        (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        0,
        1,
        0x02,
    ),
    socket2::SockFilter::new((libc::BPF_RET | libc::BPF_K) as u16, 0, 0, 0),
    socket2::SockFilter::new((libc::BPF_RET | libc::BPF_K) as u16, 0, 0, u32::MAX),
];

/// How long a shard waits, once every listener drops new packets, for handshakes already under
/// way to land in its accept queue.
const HANDSHAKES_IN_FLIGHT: Duration = Duration::from_millis(20);

/// Waits (polling: this happens once per process) until `count` reaches `shards`; a shard whose
/// thread died counts as there.
async fn meet(count: &AtomicUsize, shards: usize, shard: &Shard, what: &str) {
    let index = shard.index;
    count.fetch_add(1, Ordering::AcqRel);
    let started = std::time::Instant::now();
    let dead = || shard.settings.readiness.dead_shards();
    while count.load(Ordering::Acquire) + dead() < shards {
        if started.elapsed() >= BARRIER_PATIENCE {
            tracing::warn!(shard = index, "stopping without the other shards: {what}");
            return;
        }
        monoio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Settings every shard shares, fixed at start-up.
#[derive(Clone, Debug)]
pub struct ShardSettings {
    /// Domain for the Host fallback `<rev>.<ns>.svc.<domain>`. Default:
    /// [`DEFAULT_CLUSTER_DOMAIN`] (`cluster.local`).
    pub cluster_domain: String,
    /// Upstream connection pool settings.
    pub pool: PoolConfig,
    /// An autoscaler reporter runs: a revision's first request pokes it. Default false.
    pub report_load: bool,
    /// What kubelet probes report besides draining (the autoscaler link, the informers).
    pub readiness: Arc<Readiness>,
    /// Where the shards meet when they stop accepting (one object for all of them).
    pub stop: Arc<StopBarrier>,
    /// Most client connections open on one shard; at the limit the shard stops accepting until
    /// one closes (new clients wait in the kernel's queue). Default:
    /// [`DEFAULT_MAX_CONNECTIONS_PER_SHARD`] (16 384 connections).
    pub max_connections: usize,
    /// Most connections on one shard in the middle of a request head (the head did not come in
    /// one read); at the limit the shard stops accepting until one completes or closes, so slow
    /// heads cannot hold more than this many head buffers. Default:
    /// [`DEFAULT_MAX_PENDING_HEADS_PER_SHARD`] (1 024 heads).
    pub max_pending_heads: usize,
    /// HTTP/2 settings, towards clients and pods.
    pub h2: H2Settings,
    /// A connection's first request head must be whole within this of the accept, any later
    /// head within this of its first byte (upstream's `ReadHeaderTimeout`). Default:
    /// [`DEFAULT_HEAD_TIMEOUT`] (60 s).
    pub head_timeout: Duration,
}

/// Default of `proxy.head_timeout_seconds`: 60 s, the `ReadHeaderTimeout` of upstream's server
/// (`network.NewServer`).
pub const DEFAULT_HEAD_TIMEOUT: Duration = Duration::from_secs(60);

/// Default of `proxy.max_connections_per_shard`: 16 384 client connections per shard, about
/// 75 MiB of idle keep-alive connections (BENCHMARKS.md, "Memory per open connection").
pub const DEFAULT_MAX_CONNECTIONS_PER_SHARD: usize = 16_384;

/// Default of `proxy.max_pending_heads_per_shard`: 1 024 unfinished request heads per shard
/// (each holds a buffer of up to the 64 KiB head limit).
pub const DEFAULT_MAX_PENDING_HEADS_PER_SHARD: usize = 1_024;

impl Default for ShardSettings {
    fn default() -> Self {
        ShardSettings {
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.into(),
            pool: PoolConfig::default(),
            report_load: false,
            readiness: Arc::default(),
            stop: Arc::default(),
            max_connections: DEFAULT_MAX_CONNECTIONS_PER_SHARD,
            max_pending_heads: DEFAULT_MAX_PENDING_HEADS_PER_SHARD,
            h2: H2Settings::default(),
            head_timeout: DEFAULT_HEAD_TIMEOUT,
        }
    }
}

/// Shard-local state, shared by the shard's tasks through `Rc`.
pub struct Shard {
    pub index: usize,
    pub settings: Arc<ShardSettings>,
    all_stats: AllShardStats,
    pub replica: Replica,
    pub pool: Pool,
    /// h2c connections to pods, one per pod (requests that arrived over HTTP/2).
    pub(crate) h2_pods: H2Pods,
    /// Set on `BeginDrain`: probes fail, requests are still served, responses carry
    /// `Connection: close` and idle keep-alive connections close.
    pub draining: LocalEvent,
    /// Set on `StopAccepting`: the shard meets the others at the [`StopBarrier`] and then closes
    /// its listener.
    pub stop_accepting: LocalEvent,
    /// Set once every shard's listener is closed: a connection that has not sent its first
    /// request within [`FIRST_REQUEST_GRACE`] closes.
    pub stopping: LocalEvent,
    /// Fires whenever a client connection closes (drain waits on it), and when a pending head
    /// completes while accepting is paused.
    pub connection_closed: LocalNotify,
    /// Keep-alive connections between requests: the longest idle gives way at the connection
    /// cap, and all close once the listeners are closed.
    pub idle: IdleConnections,
    /// Connections in the middle of a request head (see `ShardSettings::max_pending_heads`).
    pub pending_heads: Cell<usize>,
    /// The accept loop waits for room (a connection or a pending head fewer).
    pub accept_paused: Cell<bool>,
    /// Every shard's grant mailbox, this one's included, by shard index.
    peers: Vec<flume::Sender<Grant>>,
    /// Registrations and pod signals to the control thread.
    pub control: ControlLink,
    /// Deadlines of waiting requests (queued for a slot, slow heads), one timer for all.
    pub alarms: Alarms,
    /// Spare blocks for exchanges with pods, which run outside the connections' futures.
    pub exchanges: Blocks,
    /// Where a task that handed its pod slot on lets the woken waiter go first.
    pub back_of_queue: BackOfQueue,
}

/// Spare exchange blocks a shard keeps (each a few KiB) once its concurrency drops.
const SPARE_EXCHANGES: usize = 256;

impl Shard {
    pub fn new(
        index: usize,
        settings: Arc<ShardSettings>,
        all_stats: AllShardStats,
        peers: Vec<flume::Sender<Grant>>,
        control: ControlLink,
    ) -> Shard {
        let pool = Pool::new(settings.pool);
        let h2_pods = H2Pods::new(settings.pool, settings.h2, all_stats.clone(), index);
        Shard {
            index,
            settings,
            all_stats,
            replica: Replica::default(),
            pool,
            h2_pods,
            draining: LocalEvent::default(),
            stop_accepting: LocalEvent::default(),
            stopping: LocalEvent::default(),
            connection_closed: LocalNotify::default(),
            idle: IdleConnections::default(),
            pending_heads: Cell::new(0),
            accept_paused: Cell::new(false),
            peers,
            control,
            alarms: Alarms::default(),
            exchanges: Blocks::new(SPARE_EXCHANGES),
            back_of_queue: BackOfQueue::default(),
        }
    }

    /// Sends a slot to another shard's oldest waiter. False if that shard is gone (the caller
    /// then releases the slot).
    pub fn send_grant(&self, shard: usize, grant: Grant) -> bool {
        self.peers
            .get(shard)
            .is_some_and(|peer| peer.send(grant).is_ok())
    }

    /// At `max_connections` open connections or `max_pending_heads` unfinished heads.
    fn at_accept_limit(&self) -> bool {
        self.at_connection_limit() || self.pending_heads.get() >= self.settings.max_pending_heads
    }

    fn at_connection_limit(&self) -> bool {
        self.stats().connections_open.get() as usize >= self.settings.max_connections
    }

    /// Runs a client connection with its panics contained: a panic ends this connection only.
    fn serve(self: &Rc<Self>, stream: monoio::net::TcpStream, peer: std::net::SocketAddr) {
        let connection = http1::serve_connection(self.clone(), stream, peer);
        let shard = self.clone();
        monoio::spawn(async move {
            if let Err(panic) = contain::catching(connection).await {
                contain::record(shard.stats(), "a connection", &*panic);
                // The connection's own bookkeeping was unwound with it.
                shard.stats().connections_open.decrement();
                shard.connection_closed.notify_all();
            }
        });
    }

    /// Health as the kubelet's probes see it.
    pub(crate) fn health(&self) -> Health {
        if self.draining.is_set() {
            Health::Draining
        } else if let Some(reason) = self.settings.readiness.not_ready() {
            Health::NotReady(reason)
        } else {
            Health::Healthy
        }
    }

    #[inline]
    pub fn stats(&self) -> &ShardStats {
        &self.all_stats[self.index]
    }

    fn apply(&self, command: ShardCommand) {
        match command {
            ShardCommand::Routing(update) => self.replica.apply(update, self),
            ShardCommand::BeginDrain => self.draining.set(),
            ShardCommand::StopAccepting => {
                self.draining.set();
                self.stop_accepting.set();
            }
        }
    }
}

/// Runs a shard until it has stopped accepting and its last connection closed.
///
/// `ports`: each data port's listener with a second descriptor of the same socket (`spare`),
/// through which the stop drains its backlog and shuts it down.
pub async fn run(
    shard: Rc<Shard>,
    ports: Vec<(TcpListener, std::net::TcpListener)>,
    commands: flume::Receiver<ShardCommand>,
    grants: flume::Receiver<Grant>,
) {
    // Apply whatever the control thread queued before we started, so the first request already
    // sees the initial routing table.
    while let Ok(command) = commands.try_recv() {
        shard.apply(command);
    }
    let command_shard = shard.clone();
    monoio::spawn(async move {
        while let Ok(command) = commands.recv_async().await {
            command_shard.apply(command);
        }
        // The control thread is gone: nothing will ever update routing again; stop cleanly.
        command_shard.apply(ShardCommand::StopAccepting);
    });
    let grant_shard = shard.clone();
    monoio::spawn(async move {
        while let Ok(grant) = grants.recv_async().await {
            match grant_shard.replica.get(grant.key.as_str()) {
                Some(revision) => revision.receive_grant(grant.pod, &grant_shard),
                // The revision is gone here: nobody to serve, give the slot back.
                None => {
                    grant.pod.slots.release();
                }
            }
        }
    });
    let relay_shard = shard.clone();
    monoio::spawn(async move { relay_shard.back_of_queue.run_relay().await });
    let timer_shard = shard.clone();
    monoio::spawn(async move { alarm::run_timer(&timer_shard.alarms).await });
    let sweep_shard = shard.clone();
    monoio::spawn(async move {
        while !sweep_shard.stopping.is_set() {
            monoio::time::sleep(SWEEP_INTERVAL).await;
            sweep_shard.pool.sweep();
            sweep_shard.h2_pods.sweep();
        }
    });

    let (listeners, spares): (Vec<TcpListener>, Vec<std::net::TcpListener>) =
        ports.into_iter().unzip();
    let listener_shut = Cell::new(false);
    // Each accept loop runs until its listener is shut down; it is never dropped mid-accept,
    // since an io_uring accept cancelled too late completes with a connection nobody would serve.
    let accept_loop = |listener: TcpListener| {
        let shard = &shard;
        let listener_shut = &listener_shut;
        async move {
            loop {
                // At a limit no accept is in flight: new clients wait in the kernel's queue. At
                // the connection cap the longest-idle keep-alive connection gives way first.
                if shard.at_accept_limit() {
                    shard.stats().accept_pauses.increment();
                    shard.accept_paused.set(true);
                    while shard.at_accept_limit() {
                        if shard.at_connection_limit() && shard.idle.evict_oldest() {
                            shard.stats().idle_evictions.increment();
                        }
                        shard.connection_closed.notified().await;
                    }
                    shard.accept_paused.set(false);
                }
                match listener.accept().await {
                    Ok((stream, peer)) => shard.serve(stream, peer),
                    Err(_) if shard.stop_accepting.is_set() && listener_shut.get() => break,
                    Err(error) => {
                        // EMFILE and friends: back off briefly rather than spin.
                        tracing::warn!(shard = shard.index, "accept failed: {error}");
                        monoio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }
    };
    let mut accepting: Vec<_> = listeners
        .into_iter()
        .map(|listener| Box::pin(accept_loop(listener)))
        .collect();
    let stopping = async {
        shard.stop_accepting.wait().await;
        let shards = shard.peers.len();
        let barrier = &shard.settings.stop;
        meet(&barrier.told, shards, &shard, "told to stop accepting").await;
        // Closing a listener resets the connections the kernel completed for it and nobody
        // accepted yet, and those clients have sent their requests. So first no connection may
        // start on any listener: a socket filter drops new clients' SYNs (they retry, find the
        // port closed and go elsewhere). Then what completed, or was under way, is accepted and
        // served, and only then is the socket shut down.
        for spare in &spares {
            if let Err(error) = socket2::SockRef::from(spare).attach_filter(&REFUSE_NEW_CONNECTIONS)
            {
                tracing::warn!(
                    shard = shard.index,
                    "cannot filter the listener before closing it: {error}"
                );
            }
        }
        meet(&barrier.filtered, shards, &shard, "listeners filtered").await;
        // A handshake whose SYN passed before the filter completes within this: on loopback at
        // once, over a network in one round trip.
        monoio::time::sleep(HANDSHAKES_IN_FLIGHT).await;
        for spare in &spares {
            let _ = spare.set_nonblocking(true);
            while let Ok((stream, peer)) = spare.accept() {
                // An accepted socket does not inherit the listener's O_NONBLOCK, and the epoll
                // driver needs it (io_uring does not mind).
                let registered = stream
                    .set_nonblocking(true)
                    .and_then(|()| monoio::net::TcpStream::from_std(stream));
                match registered {
                    Ok(stream) => shard.serve(stream, peer),
                    Err(error) => tracing::warn!(shard = shard.index, "accept failed: {error}"),
                }
            }
        }
        listener_shut.set(true);
        // Shutting the sockets down (not only closing our descriptors) ends the accepts in
        // flight.
        for spare in &spares {
            let _ = socket2::SockRef::from(spare).shutdown(std::net::Shutdown::Both);
        }
        meet(&barrier.closed, shards, &shard, "listeners closed").await;
        shard.stopping.set();
        // The grace period is over and no listener takes new connections: idle keep-alive
        // clients now reconnect elsewhere.
        shard.idle.close_all();
        shard.pool.clear();
        shard.h2_pods.clear();
    };
    // All run until the listeners are shut; then the accept loops have a moment to hand over a
    // connection their last accepts completed with (after the shutdown none can arrive, so
    // dropping them then loses nothing).
    let mut stopping = pin!(stopping);
    let mut accepts_ended = vec![false; accepting.len()];
    let mut stopped = false;
    let mut last_call: Option<std::pin::Pin<Box<monoio::time::Sleep>>> = None;
    let stop = std::future::poll_fn(|cx| {
        for (accept, ended) in accepting.iter_mut().zip(accepts_ended.iter_mut()) {
            if !*ended {
                *ended = accept.as_mut().poll(cx).is_ready();
            }
        }
        if !stopped {
            stopped = stopping.as_mut().poll(cx).is_ready();
        }
        if !stopped {
            return Poll::Pending;
        }
        if accepts_ended.iter().all(|ended| *ended) {
            return Poll::Ready(());
        }
        let timer = last_call
            .get_or_insert_with(|| Box::pin(monoio::time::sleep(Duration::from_millis(200))));
        timer.as_mut().poll(cx)
    });
    // The descriptors stay open until the end; the socket itself is already shut down.
    stop.await;
    while shard.stats().connections_open.get() > 0 {
        shard.connection_closed.notified().await;
    }
}
