//! The hub: one shard's thread and its ports. Builds the shard's reactor on its own thread,
//! accepts on each data port, gives every connection to its front (HTTP/1, which hands a
//! connection that opens with the HTTP/2 preface back here for the HTTP/2 front), runs the
//! shard's own tasks (routing commands, grants and evictions from other shards, the timer, sweeps), and stops
//! with the other shards (the stop barrier). The only module that knows both fronts.

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::task::Poll;
use std::thread::JoinHandle;
use std::time::Duration;

use futures_util::future::{FutureExt, OptionFuture};
use monoio::net::TcpListener;

use crate::http1::{self, Served};
use crate::http2;
use crate::metrics::AllShardStats;
use crate::request::peer::Peer;
use crate::routing::{Handoff, ShardCommand};
use crate::runtime::alarm;
use crate::runtime::contain;
use crate::runtime::control_link::ControlLink;
use crate::runtime::late;
use crate::runtime::memory;
use crate::runtime::reactor::{self, DriverChoice, DriverKind, Reactor};
use crate::runtime::readiness::Readiness;
use crate::runtime::stream::ByteStream;
use crate::runtime::tls;
use crate::shard::{OpenConnection, Shard, ShardSettings};

/// How often idle upstream connections are swept.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// How long a shard waits at the stop barrier for the others before going on alone (a shard
/// whose thread died must not keep the rest from stopping).
const BARRIER_PATIENCE: Duration = Duration::from_secs(2);

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

/// Runs a shard until it has stopped accepting and its last connection closed: its own tasks
/// (routing commands, the mailbox of grants and evictions, the back-of-queue relay, the timer, the sweep), an accept loop
/// per port, and the stop.
///
/// `ports`: each data port's listener with a second descriptor of the same socket (`spare`),
/// through which the stop drains its backlog and shuts it down, and whether it speaks TLS.
async fn run(
    shard: Rc<Shard>,
    ports: Vec<(TcpListener, std::net::TcpListener, bool)>,
    commands: flume::Receiver<ShardCommand>,
    handoffs: flume::Receiver<Handoff>,
) {
    // Apply whatever the control thread queued before we started, so the first request already
    // sees the initial routing table.
    while let Ok(command) = commands.try_recv() {
        shard.apply(command);
    }
    shard.replica.settle_rules();
    let command_shard = shard.clone();
    monoio::spawn(async move {
        while let Ok(command) = commands.recv_async().await {
            command_shard.apply(command);
            // The rest of a batch is applied before the rule table is built again, once.
            while let Ok(command) = commands.try_recv() {
                command_shard.apply(command);
            }
            command_shard.replica.settle_rules();
        }
        // The control thread is gone: nothing will ever update routing again; stop cleanly.
        command_shard.apply(ShardCommand::StopAccepting);
    });
    let handoff_shard = shard.clone();
    monoio::spawn(async move {
        while let Ok(handoff) = handoffs.recv_async().await {
            handoff_shard.receive(handoff);
        }
    });
    let relay_shard = shard.clone();
    monoio::spawn(async move { relay_shard.back_of_queue.run_relay().await });
    let timer_shard = shard.clone();
    monoio::spawn(async move { alarm::run_timer(&timer_shard.alarms).await });
    let late_shard = shard.clone();
    monoio::spawn(async move { late::run_sweeper(&late_shard.late).await });
    if shard.settings.spans.is_some() {
        let tracer_shard = shard.clone();
        monoio::spawn(async move {
            loop {
                monoio::time::sleep(crate::tracer::FLUSH_INTERVAL).await;
                tracer_shard.tracer.flush();
            }
        });
    }
    let sweep_shard = shard.clone();
    monoio::spawn(async move {
        while !sweep_shard.stopping.is_set() {
            monoio::time::sleep(SWEEP_INTERVAL).await;
            let now = std::time::Instant::now();
            sweep_shard.replica.for_each_pod(|pod| {
                sweep_shard.pool.sweep(&pod.idle_plain, now);
                sweep_shard.tls_pool.sweep(&pod.idle_tls, now);
            });
            if let Some(cap) = sweep_shard.settings.pool.max_idle_per_shard {
                sweep_shard.trim_idle_over(cap, now);
            }
            sweep_shard.h2c.sweep();
            sweep_shard.tls_h2c.sweep();
            memory::trim_if_released();
        }
    });

    let mut listeners = Vec::with_capacity(ports.len());
    let mut spares = Vec::with_capacity(ports.len());
    for (listener, spare, tls) in ports {
        listeners.push((listener, tls));
        spares.push((spare, tls));
    }
    let listener_shut = Cell::new(false);
    // Each accept loop runs until its listener is shut down; it is never dropped mid-accept,
    // since an io_uring accept cancelled too late completes with a connection nobody would serve.
    let accept_loop = |(listener, tls): (TcpListener, bool)| {
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
                    Ok((stream, peer)) if tls => serve_tls(shard, stream, peer),
                    Ok((stream, peer)) => serve(shard, stream, peer),
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
        for (spare, _) in &spares {
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
        for (spare, tls) in &spares {
            let _ = spare.set_nonblocking(true);
            while let Ok((stream, peer)) = spare.accept() {
                // An accepted socket does not inherit the listener's O_NONBLOCK, and the epoll
                // driver needs it (io_uring does not mind).
                let registered = stream
                    .set_nonblocking(true)
                    .and_then(|()| monoio::net::TcpStream::from_std(stream));
                match registered {
                    Ok(stream) if *tls => serve_tls(&shard, stream, peer),
                    Ok(stream) => serve(&shard, stream, peer),
                    Err(error) => tracing::warn!(shard = shard.index, "accept failed: {error}"),
                }
            }
        }
        listener_shut.set(true);
        // Shutting the sockets down (not only closing our descriptors) ends the accepts in
        // flight.
        for (spare, _) in &spares {
            let _ = socket2::SockRef::from(spare).shutdown(std::net::Shutdown::Both);
        }
        meet(&barrier.closed, shards, &shard, "listeners closed").await;
        shard.stopping.set();
        // The grace period is over and no listener takes new connections: idle keep-alive
        // clients now reconnect elsewhere.
        shard.idle.close_all();
        shard.replica.for_each_pod(|pod| {
            pod.idle_plain.clear();
            pod.idle_tls.clear();
        });
        shard.h2c.clear();
        shard.tls_h2c.clear();
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
    // The last requests' spans go out with the shard.
    shard.tracer.flush();
}

/// Everything a shard thread needs.
pub struct ShardSpec {
    pub index: usize,
    pub cpu: Option<usize>,
    pub driver: DriverChoice,
    /// One listener per data port (HTTP/1 and HTTP/2 alike on each), bound by the caller.
    pub listeners: Vec<std::net::TcpListener>,
    /// One listener per TLS data port: the same requests, over TLS with the certificates of the
    /// latest `ShardCommand::ServerTls` (a connection is closed while there is none).
    pub tls_listeners: Vec<std::net::TcpListener>,
    pub commands: flume::Receiver<ShardCommand>,
    /// This shard's mailbox: slots granted to it by others, evictions asked of it and answers
    /// to its own (`routing::Handoff`).
    pub mailbox: flume::Receiver<Handoff>,
    /// Every shard's mailbox, by index.
    pub peers: Vec<flume::Sender<Handoff>>,
    pub settings: Arc<ShardSettings>,
    pub stats: AllShardStats,
    /// Registrations and pod signals to the control thread.
    pub control: ControlLink,
}

/// Starts a shard thread. `started` receives the driver in use, or why the shard could not start.
pub fn spawn_shard(
    spec: ShardSpec,
    started: mpsc::Sender<Result<DriverKind, String>>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("shard-{}", spec.index))
        .spawn(move || {
            if let Some(cpu) = spec.cpu {
                if let Err(error) = monoio::utils::bind_to_cpu_set([cpu]) {
                    tracing::warn!(shard = spec.index, cpu, "could not pin shard: {error:?}");
                }
            }
            match reactor::build(spec.driver) {
                Ok(reactor) => run_on(reactor, spec, started),
                Err(error) => {
                    let _ = started.send(Err(error));
                }
            }
        })
}

/// Lives as long as a shard runs; dropped while unwinding, it reports the shard dead, so that
/// health turns red instead of a dead shard hiding behind the others' 200s, and shuts its
/// listeners down, so that no new connection lands in a queue nobody serves any more (the
/// other shards' listeners on the same ports take them all).
struct ShardLife {
    index: usize,
    readiness: Arc<Readiness>,
    /// Descriptors of the shard's listening sockets.
    listeners: Vec<std::net::TcpListener>,
}

impl Drop for ShardLife {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for listener in &self.listeners {
                let _ = socket2::SockRef::from(listener).shutdown(std::net::Shutdown::Both);
            }
            self.readiness.shard_died(self.index);
            tracing::error!(
                shard = self.index,
                "shard thread died: its connections are lost; liveness and readiness now fail"
            );
        }
    }
}

fn run_on(
    mut reactor: Reactor,
    spec: ShardSpec,
    started: mpsc::Sender<Result<DriverKind, String>>,
) {
    let kind = reactor.kind();
    *spec.stats[spec.index]
        .driver
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = kind.as_str();
    let ShardSpec {
        index,
        listeners,
        tls_listeners,
        commands,
        mailbox,
        peers,
        settings,
        stats,
        control,
        ..
    } = spec;
    let listeners: Vec<(std::net::TcpListener, bool)> = listeners
        .into_iter()
        .map(|listener| (listener, false))
        .chain(tls_listeners.into_iter().map(|listener| (listener, true)))
        .collect();
    // A second descriptor of each listening socket, for the stop: the backlog is drained through
    // it with non-blocking accepts, and the socket is shut down through it.
    let mut spares = Vec::with_capacity(listeners.len());
    let mut watched = Vec::with_capacity(listeners.len());
    for (listener, _) in &listeners {
        match listener
            .try_clone()
            .and_then(|spare| Ok((spare, listener.try_clone()?)))
        {
            Ok((spare, other)) => {
                spares.push(spare);
                watched.push(other);
            }
            Err(error) => {
                let _ = started.send(Err(format!(
                    "shard {index}: cannot duplicate a listener: {error}"
                )));
                return;
            }
        }
    }
    let _life = ShardLife {
        index,
        readiness: settings.readiness.clone(),
        listeners: watched,
    };
    reactor.block_on(async move {
        let mut ports = Vec::with_capacity(listeners.len());
        for ((listener, tls), spare) in listeners.into_iter().zip(spares) {
            match monoio::net::TcpListener::from_std(listener) {
                Ok(listener) => ports.push((listener, spare, tls)),
                Err(error) => {
                    let _ = started.send(Err(format!(
                        "shard {index}: cannot register listener: {error}"
                    )));
                    return;
                }
            }
        }
        let _ = started.send(Ok(kind));
        let shard = Rc::new(Shard::new(index, settings, stats, peers, control));
        run(shard, ports, commands, mailbox).await;
    });
}

/// Serves one connection accepted on a TLS port: the handshake, bounded by the head timeout,
/// with the shard's current certificates (none yet: the connection is closed at once), then
/// the front the client chose: HTTP/2 when ALPN settled on `h2`, else HTTP/1, which hands an
/// HTTP/2 preface on as on a plain port (a client that sends h2 without ALPN, as Knative's
/// activator does to its queue-proxies).
fn serve_tls(shard: &Rc<Shard>, stream: monoio::net::TcpStream, peer: std::net::SocketAddr) {
    let Some(config) = shard.server_tls() else {
        shard.stats().tls_handshake_failures.increment();
        tracing::debug!(shard = shard.index, %peer, "TLS connection closed: no certificate yet");
        return;
    };
    let _ = stream.set_nodelay(true);
    let open = OpenConnection::count(shard);
    let front_shard = shard.clone();
    let head_timeout = shard.settings.head_timeout;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    // Boxed, and the rest chained after it: the handshake's state (the accept future, with the
    // session inside) is given back once it ends instead of sizing the task every open
    // connection keeps; an HTTP/2 one's state is boxed as on a plain port.
    let handshake = Box::pin(async move {
        // Until its handshake ends, the connection gives way at the connection cap as an idle
        // one does (the longest waiting first; its read side shut down, the handshake ends):
        // clients that stall their handshakes cannot hold the cap against new ones.
        let idle = front_shard.idle.enter(fd);
        front_shard.wake_paused_accept();
        let handshake = monoio::time::timeout(head_timeout, tls::accept(config, stream)).await;
        drop(idle);
        let stats = front_shard.stats();
        match handshake {
            Ok(Ok(stream)) => {
                stats.tls_handshakes.increment();
                Some((front_shard, stream))
            }
            Ok(Err(error)) => {
                stats.tls_handshake_failures.increment();
                tracing::debug!(shard = front_shard.index, %peer, "TLS handshake failed: {error}");
                None
            }
            Err(_) => {
                stats.tls_handshake_failures.increment();
                tracing::debug!(
                    shard = front_shard.index,
                    %peer,
                    "TLS handshake not done within the head timeout"
                );
                None
            }
        }
    });
    let connection = handshake.then(move |accepted| {
        OptionFuture::from(accepted.map(|(front_shard, stream)| {
            if stream.session().alpn_protocol() == Some(&b"h2"[..]) {
                front_shard.stats().connections_accepted.increment();
                let peer = Rc::new(Peer::of(peer).over_tls(true));
                futures_util::future::Either::Left(Box::pin(http2::server::take_over(
                    front_shard,
                    stream,
                    bytes::Bytes::new(),
                    peer,
                )))
            } else {
                futures_util::future::Either::Right(
                    serve_http1(front_shard, stream, peer).map(drop),
                )
            }
        }))
    });
    spawn_connection(shard, open, connection);
}

/// Serves one accepted connection with its front, its panics contained to it: HTTP/1, or
/// HTTP/2 when it opens with the preface (the HTTP/1 front recognises it and hands the
/// connection back with what it read).
fn serve(shard: &Rc<Shard>, stream: monoio::net::TcpStream, peer: std::net::SocketAddr) {
    // Small writes (heads, frames) must not wait for more.
    let _ = stream.set_nodelay(true);
    let open = OpenConnection::count(shard);
    let connection = serve_http1(shard.clone(), stream, peer);
    spawn_connection(shard, open, connection);
}

/// A connection's HTTP/1 front, and HTTP/2 when it opens with the preface (the front recognises
/// it and hands the connection back with what it read).
#[inline(always)]
fn serve_http1<S: ByteStream>(
    shard: Rc<Shard>,
    stream: S,
    peer: std::net::SocketAddr,
) -> impl Future<Output = Option<()>> {
    // Combinators rather than `async` blocks: a block that awaits a future it owns keeps it
    // twice (as its capture and as the future it polls), and every open connection pays for
    // that state, idle or not. Tried and measured (issue 37): the HTTP/1 future as the task
    // itself, an HTTP/2 take-over spawning a task of its own, saves ~87 instructions per
    // request (the combinator's poll is no longer inlined into the task's now that the front is
    // generic), but an idle HTTP/2 connection then holds 1.4 KB more (17.2 against 15.8 KB:
    // the HTTP/1 task's freed block fragments the pages the idle buffers would give back), and
    // `an_idle_h2c_connection_gives_its_buffers_back_and_serves_on` failed on it.
    http1::serve_connection(shard.clone(), stream, peer).then(move |served| {
        // Boxed: an HTTP/2 connection's state is far larger than an HTTP/1 one's, and only the
        // connections that turn out to be HTTP/2 pay for it.
        OptionFuture::from(match served {
            Served::Http2 { stream, read, peer } => Some(Box::pin(http2::server::take_over(
                shard, stream, read, peer,
            ))),
            Served::Closed => None,
        })
    })
}

/// Runs a connection's future as a task of its own, its panics contained to it, counted among
/// the open connections until it ends.
#[inline(always)]
fn spawn_connection<T: 'static>(
    shard: &Rc<Shard>,
    open: OpenConnection,
    connection: impl Future<Output = T> + 'static,
) {
    let shard = shard.clone();
    monoio::spawn(contain::catching(connection).map(move |served| {
        // Counted out when the task ends (or is dropped).
        drop(open);
        if let Err(panic) = served {
            contain::record(shard.stats(), "a connection", &*panic);
        }
    }));
}
