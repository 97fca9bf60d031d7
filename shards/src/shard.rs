//! One shard's context, shared by its tasks through `Rc`: its routing replica, its connections
//! to pods, its counters, timers and signals, and the settings every shard shares. Protocol-
//! neutral: the fronts (`http1`, `http2`) and the hub that accepts connections build on it.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;

use crate::metrics::{AllShardStats, ShardStats};
use crate::request::log::RequestLog;
use crate::request::policy::Edits;
use crate::request::trace::SpanNames;
use crate::role::{Role, Roles};
use crate::routing::replica::{LocalPod, LocalRevision, Outbox, Outgoing, Replica};
use crate::routing::{Handoff, ShardCommand};
use crate::runtime::alarm::Alarms;
use crate::runtime::blocks::Blocks;
use crate::runtime::control_link::ControlLink;
use crate::runtime::idle::IdleConnections;
use crate::runtime::late::Lateness;
use crate::runtime::race::{race, Either};
use crate::runtime::readiness::{Health, Readiness};
use crate::runtime::signal::{BackOfQueue, LocalEvent, LocalNotify};
use crate::runtime::stream::{ByteStream, Connector, PlainTcp};
use crate::runtime::tls::{ClientTls, TlsDialer, UpstreamTls};
use crate::throttle::gate::RevisionGate;
use crate::tracer::ShardTracer;
use crate::upstream::error::UpstreamError;
use crate::upstream::h2c::{H2Settings, H2cConnections, Lease, Pings, PodStreams};
use crate::upstream::pool::{IdleConns, Pool, PoolConfig};
use kactivator_api::{RevisionKey, DEFAULT_CLUSTER_DOMAIN};
use monoio::time::Instant;

/// Once every listener is closed, how long a connection accepted before that has to send its
/// first request (it is answered, not closed under it, see `http1::connection`).
pub const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// The shards' meeting point when they stop: no shard closes its listener before every shard
/// has been told to stop accepting, and no shard closes a connection it accepted before every
/// listener is closed (the hub's stop keeps it). So a client whose connection closes can always reconnect, and a
/// connection is never refused by one shard while another still accepts.
#[derive(Debug, Default)]
pub struct StopBarrier {
    pub(crate) told: AtomicUsize,
    pub(crate) filtered: AtomicUsize,
    pub(crate) closed: AtomicUsize,
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
    /// Which of kactivator's roles the shard plays (`role`). Default: the activator.
    pub role: Roles,
    /// Knative's request log, one line per request; `None` (the default): none.
    pub request_log: Option<Arc<RequestLog>>,
    /// Where the shards' finished spans go (the control thread's exporter, issue 39), in
    /// batches; `None` (the default): nowhere, and tracing stays off whatever it is told.
    pub spans: Option<flume::Sender<kactivator_api::trace::span::SpanBatch>>,
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
            role: Roles::default(),
            request_log: None,
            spans: None,
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
    pub(crate) h2c: H2cConnections,
    /// Idle TLS connections to pods of revisions reached over TLS, and their HTTP/2 ones.
    pub tls_pool: Pool<TlsDialer>,
    pub(crate) tls_h2c: H2cConnections<TlsDialer>,
    /// Set on `BeginDrain`: probes fail, requests are still served, responses carry
    /// `Connection: close` and idle keep-alive connections close.
    pub draining: LocalEvent,
    /// Set on `StopAccepting`: the shard meets the others at the [`StopBarrier`] and then closes
    /// its listener.
    pub stop_accepting: LocalEvent,
    /// Set once every shard's listener is closed: a connection that has not sent its first
    /// request within [`FIRST_REQUEST_GRACE`] closes.
    pub stopping: LocalEvent,
    /// Fires whenever a client connection closes (drain waits on it), and, while accepting is
    /// paused, when a pending head completes or a connection goes idle
    /// ([`Shard::wake_paused_accept`]).
    pub connection_closed: LocalNotify,
    /// Keep-alive connections between requests: the longest idle gives way at the connection
    /// cap, and all close once the listeners are closed.
    pub idle: IdleConnections,
    /// Connections in the middle of a request head (see `ShardSettings::max_pending_heads`).
    pub pending_heads: Cell<usize>,
    /// The accept loop waits for room (a connection or a pending head fewer).
    pub accept_paused: Cell<bool>,
    /// Every shard's mailbox for grants and evictions, this one's included, by shard index.
    pub(crate) peers: Vec<flume::Sender<Handoff>>,
    /// Registrations and pod signals to the control thread.
    pub control: ControlLink,
    /// Deadlines of waiting requests (queued for a slot, slow heads), one timer for all.
    pub alarms: Alarms,
    /// Exchanges under way, in start order: which have been for a while (see `runtime::late`).
    pub late: Lateness,
    /// Spare blocks for exchanges with pods, which run outside the connections' futures.
    pub exchanges: Blocks,
    /// Where a task that handed its pod slot on lets the woken waiter go first.
    pub back_of_queue: BackOfQueue,
    /// The TLS data port's certificates and settings (`ShardCommand::ServerTls`).
    server_tls: RefCell<Option<Arc<rustls::ServerConfig>>>,
    /// Tracing: on or off (`ShardCommand::Tracing`), ids, the spans not yet sent.
    pub tracer: ShardTracer,
}

/// Spare exchange blocks a shard keeps (each a few KiB) once its concurrency drops.
const SPARE_EXCHANGES: usize = 256;

impl Shard {
    pub fn new(
        index: usize,
        settings: Arc<ShardSettings>,
        all_stats: AllShardStats,
        peers: Vec<flume::Sender<Handoff>>,
        control: ControlLink,
    ) -> Shard {
        let pool = Pool::new(settings.pool, PlainTcp);
        let h2c = H2cConnections::new(
            settings.pool,
            PlainTcp,
            settings.h2,
            all_stats.clone(),
            index,
        );
        let tracer = ShardTracer::new(
            match settings.role.edits() {
                Edits::Activator => SpanNames::Activator,
                Edits::QueueProxy => SpanNames::QueueProxy,
                Edits::Interceptor => SpanNames::Interceptor,
            },
            settings.spans.clone(),
        );
        let replica = Replica::new(settings.role.http1_in_h2c());
        let tls_pool = Pool::new(settings.pool, TlsDialer { http2: false });
        let tls_h2c = H2cConnections::new(
            settings.pool,
            TlsDialer { http2: true },
            settings.h2,
            all_stats.clone(),
            index,
        );
        Shard {
            index,
            settings,
            all_stats,
            replica,
            pool,
            h2c,
            tls_pool,
            tls_h2c,
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
            late: Lateness::default(),
            exchanges: Blocks::new(SPARE_EXCHANGES),
            back_of_queue: BackOfQueue::default(),
            server_tls: RefCell::new(None),
            tracer,
        }
    }

    /// Carries out what `revision` left in `outbox`: each slot granted to another shard's
    /// waiter goes to that shard's mailbox; one that cannot be delivered (the shard is gone) is
    /// released here, which may hand it on again. Each eviction asked of another shard goes
    /// the same way; one that cannot be delivered is answered "nothing shed" here. True when a
    /// request queued on this shard was woken with a slot.
    pub fn deliver(&self, revision: &LocalRevision, mut outbox: Outbox) -> bool {
        let mut woke_local = outbox.woke_local;
        while let Some(outgoing) = outbox.outgoing.pop() {
            let again = match outgoing {
                Outgoing::Grant { to, pod } => {
                    let grant = Handoff::Grant {
                        key: revision.key().clone(),
                        pod: pod.tracker.clone(),
                    };
                    if self.send(to, grant) {
                        continue;
                    }
                    revision.release(&pod)
                }
                Outgoing::Evict { to, below, waiter } => {
                    let evict = Handoff::Evict {
                        key: revision.key().clone(),
                        gate: revision.gate().clone(),
                        below,
                        from: self.index,
                        waiter,
                    };
                    if self.send(to, evict) {
                        continue;
                    }
                    revision.receive_place(waiter, false)
                }
            };
            woke_local |= again.woke_local;
            outbox.merge(again);
        }
        woke_local
    }

    /// The revision `key` as this shard has it, if it is the one `gate` belongs to (not a later
    /// revision of the same name).
    fn revision_of(
        &self,
        key: &RevisionKey,
        gate: &Arc<RevisionGate>,
    ) -> Option<Rc<LocalRevision>> {
        self.replica
            .get(key.as_str())
            .filter(|revision| Arc::ptr_eq(revision.gate(), gate))
    }

    fn send(&self, to: usize, handoff: Handoff) -> bool {
        self.peers
            .get(to)
            .is_some_and(|peer| peer.send(handoff).is_ok())
    }

    /// Takes what another shard sent: a slot for a waiter here, an eviction asked of this
    /// shard, or the answer to one this shard asked. Whatever finds its revision gone (or
    /// replaced by a later one of the same name) is undone: the slot released, nothing shed,
    /// the places carried given back.
    pub fn receive(&self, handoff: Handoff) {
        match handoff {
            Handoff::Grant { key, pod } => match self.replica.get(key.as_str()) {
                Some(revision) => {
                    let outbox = revision.receive_grant(pod);
                    self.deliver(&revision, outbox);
                }
                // The revision is gone here: nobody to serve, give the slot back.
                None => {
                    pod.slots.release();
                }
            },
            Handoff::Evict {
                key,
                gate,
                below,
                from,
                waiter,
            } => {
                let placed = self
                    .revision_of(&key, &gate)
                    .is_some_and(|revision| revision.evict(below));
                let answer = Handoff::Place {
                    key,
                    gate: gate.clone(),
                    waiter,
                    placed,
                };
                if !self.send(from, answer) && placed {
                    gate.give_back_place();
                }
            }
            Handoff::Place {
                key,
                gate,
                waiter,
                placed,
            } => match self.revision_of(&key, &gate) {
                Some(revision) => {
                    let outbox = revision.receive_place(waiter, placed);
                    self.deliver(&revision, outbox);
                }
                None if placed => gate.give_back_place(),
                None => {}
            },
        }
    }

    /// At `max_connections` open connections or `max_pending_heads` unfinished heads.
    pub(crate) fn at_accept_limit(&self) -> bool {
        self.at_connection_limit() || self.pending_heads.get() >= self.settings.max_pending_heads
    }

    pub(crate) fn at_connection_limit(&self) -> bool {
        self.stats().connections_open.get() as usize >= self.settings.max_connections
    }

    /// Wakes the accept loop if it waits for room: a connection that went idle can give way at
    /// the connection cap, and a finished head frees a pending-head place.
    pub(crate) fn wake_paused_accept(&self) {
        if self.accept_paused.get() {
            self.connection_closed.notify_all();
        }
    }

    /// Whether the drain began: told by `ShardCommand::BeginDrain`, or already in the shared
    /// readiness that the control thread writes before it sends the command (a request that
    /// arrives in between is served as in the drain, and wakes the shard's waiters for it).
    #[inline]
    pub(crate) fn is_draining(&self) -> bool {
        if self.draining.is_set() {
            return true;
        }
        if self.settings.readiness.draining() {
            self.draining.set();
            return true;
        }
        false
    }

    /// Health as the kubelet's probes see it.
    pub(crate) fn health(&self) -> Health {
        if self.is_draining() {
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

    /// Applies a command from the control thread: a routing update, the drain, the stop.
    pub fn apply(&self, command: ShardCommand) {
        match command {
            ShardCommand::Routing(update) => {
                let report_load = self.settings.report_load;
                if let Some((revision, outbox)) =
                    self.replica.apply(update, self.stats(), report_load)
                {
                    self.deliver(&revision, outbox);
                }
            }
            ShardCommand::BeginDrain => self.draining.set(),
            ShardCommand::StopAccepting => {
                self.draining.set();
                self.stop_accepting.set();
            }
            ShardCommand::ServerTls(config) => *self.server_tls.borrow_mut() = config,
            ShardCommand::Tracing(sampler) => self.tracer.set_sampler(sampler),
        }
    }

    /// The TLS data port's current server configuration, if it has certificates.
    pub(crate) fn server_tls(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.server_tls.borrow().clone()
    }
}

/// A client connection counted among the shard's open ones until this is dropped, also while
/// unwinding from a panic; closing wakes whoever waits for a connection to close (the accept
/// loop at its limit, the drain).
pub(crate) struct OpenConnection(Rc<Shard>);

impl OpenConnection {
    pub(crate) fn count(shard: &Rc<Shard>) -> OpenConnection {
        shard.stats().connections_open.increment();
        OpenConnection(shard.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.stats().connections_open.decrement();
        self.0.connection_closed.notify_all();
    }
}

impl Shard {
    /// Closes the idle HTTP/1 connections beyond `cap` over every pod and kind, the oldest of
    /// all first, as [`crate::upstream::pool::over_cap`] decides.
    pub(crate) fn trim_idle_over(&self, cap: usize, now: std::time::Instant) {
        let mut ages: Vec<Vec<Duration>> = Vec::new();
        // Each pod's plain then TLS list, in the order the second walk below takes them.
        self.replica.for_each_pod(|pod| {
            ages.push(pod.idle_plain.ages(now));
            ages.push(pod.idle_tls.ages(now));
        });
        let held: usize = ages.iter().map(Vec::len).sum();
        if held <= cap {
            return;
        }
        let lists: Vec<&[Duration]> = ages.iter().map(Vec::as_slice).collect();
        let closing = crate::upstream::pool::over_cap(&lists, cap);
        let mut closing = closing.into_iter();
        self.replica.for_each_pod(|pod| {
            pod.idle_plain.close_oldest(closing.next().unwrap_or(0));
            pod.idle_tls.close_oldest(closing.next().unwrap_or(0));
        });
    }
}

/// One request's stream to a pod over HTTP/2, but for the sender it is opened with: the
/// connection it goes on (open already, `reused`, or dialled for it), the pod's address as an
/// `:authority`, the connection's PINGs, the stream's count there while the [`Lease`] lives,
/// and which of the shard's two sets the connection is in (h2c or TLS).
pub(crate) struct PodH2 {
    pub authority: http::uri::Authority,
    pub reused: bool,
    pings: Rc<Pings>,
    lease: Lease,
    tls: bool,
}

impl Shard {
    /// A stream to the pod at `addr` over HTTP/2: over TLS with `tls` (the pod's
    /// `LocalPod::tls` for this client), else h2c.
    pub(crate) async fn h2_stream(
        &self,
        addr: SocketAddr,
        tls: Option<&UpstreamTls>,
    ) -> Result<(SendRequest<Bytes>, PodH2), UpstreamError> {
        let (streams, reused, lease) = match tls {
            None => self.h2c.checkout(addr, &(), self.stats()).await?,
            Some(tls) => self.tls_h2c.checkout(addr, tls, self.stats()).await?,
        };
        let PodStreams {
            sender,
            authority,
            pings,
        } = streams;
        let stream = PodH2 {
            authority,
            reused,
            pings,
            lease,
            tls: tls.is_some(),
        };
        Ok((sender, stream))
    }

    /// Forgets the connection `stream` went on (it refused the stream, or went away), so that
    /// the next request to the pod takes another or dials one.
    pub(crate) fn forget_h2(&self, addr: SocketAddr, stream: &PodH2) {
        match stream.tls {
            false => self.h2c.forget(addr, &stream.lease),
            true => self.tls_h2c.forget(addr, &stream.lease),
        }
    }

    /// ★ After a stream the pod was still working on was dropped (which resets it, `CANCEL`):
    /// returns once the pod has read the reset (`Pings::confirm_written`), so that the slot
    /// its caller holds goes to no other request while the pod is still busy with this one;
    /// at `deadline` (the request's) the connection is forgotten instead.
    pub(crate) async fn settle_reset(&self, addr: SocketAddr, stream: &PodH2, deadline: Instant) {
        let confirmed = stream.pings.confirm_written();
        if let Either::Right(()) = race(confirmed, self.alarms.at(deadline)).await {
            self.forget_h2(addr, stream);
        }
    }
}

/// A pod connection's stream and the shard's pool that keeps it between requests: the exchange
/// gives a connection back to the pool of its own kind.
pub(crate) trait PodStream: ByteStream + Sized {
    type Dialer: Connector<Stream = Self>;
    fn pool(shard: &Shard) -> &Pool<Self::Dialer>;
    /// The pod's idle connections of this kind.
    fn idle(pod: &LocalPod) -> &IdleConns<Self>;
}

impl PodStream for monoio::net::TcpStream {
    type Dialer = PlainTcp;
    #[inline(always)]
    fn pool(shard: &Shard) -> &Pool<PlainTcp> {
        &shard.pool
    }
    #[inline(always)]
    fn idle(pod: &LocalPod) -> &IdleConns<Self> {
        &pod.idle_plain
    }
}

impl PodStream for ClientTls {
    type Dialer = TlsDialer;
    #[inline(always)]
    fn pool(shard: &Shard) -> &Pool<TlsDialer> {
        &shard.tls_pool
    }
    #[inline(always)]
    fn idle(pod: &LocalPod) -> &IdleConns<Self> {
        &pod.idle_tls
    }
}
