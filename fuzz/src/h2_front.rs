//! HTTP/2 frames into a live client connection: `http2::server::serve_connection` on a shard
//! built as the reactor builds one, over an in-memory connection that reads the client preface
//! and then the fuzzer's bytes (in pieces, yielding between them, as a socket would) and throws
//! away what the server writes. Streams run the whole request path: identity, probes, admission,
//! and the exchange with a pod, a real h2c server on loopback run by this harness.
//!
//! Input: byte 0 picks the routing table and the shard's state, byte 1 seeds the read sizes,
//! the rest is what the client sends after the preface. A request reaches the revision with
//! `knative-serving-namespace: default` and `knative-serving-revision: hello`. The pod answers
//! each stream by its `x-pod` request header: `reset` resets it, `refuse` refuses it
//! (REFUSED_STREAM, which the activator may retry), `other` answers in another revision's name
//! (an app may set any header; it is relayed as it came), `headers` sends only a head; anything
//! else echoes the body with trailers.
//!
//! Beyond "no panic": when the client's bytes end, every stream ends (no task hangs), and every
//! slot, queue place and waiter a stream took is given back.

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use crossbeam_utils::CachePadded;
use h2::Reason;
use kactivator_api::RevisionKey;
use kactivator_shards::fuzzing::serve_h2;
use kactivator_shards::http2::PREFACE;
use kactivator_shards::metrics::{AllShardStats, ShardStats};
use kactivator_shards::routing::{
    LbPolicy, PodTracker, Protocol, RevisionLabels, RevisionRoute, RoutingUpdate, ShardCommand,
    Timeouts,
};
use kactivator_shards::runtime::control_link::ControlLink;
use kactivator_shards::shard::{Shard, ShardSettings};
use kactivator_shards::throttle::gate::{ProcessQueue, RevisionGate};
use kactivator_shards::throttle::slots::UNLIMITED;
use monoio::time::TimeDriver;
use monoio::{LegacyDriver, Runtime, RuntimeBuilder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Polls the connection gets, once the client's bytes are all read, before it reads the end
/// of the stream: time for streams to reach the pod and relay its answer.
const LINGER_POLLS: u32 = 64;

thread_local! {
    /// One reactor for every input (building one per input costs more than most inputs).
    static RUNTIME: RefCell<Runtime<TimeDriver<LegacyDriver>>> = RefCell::new(
        RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("an epoll reactor can be built"),
    );
    /// The pod's address, once its listener runs.
    static POD: Cell<Option<SocketAddr>> = const { Cell::new(None) };
    /// The pod's connection and stream tasks still running.
    static POD_TASKS: Cell<usize> = const { Cell::new(0) };
}

/// Feed arbitrary bytes to an HTTP/2 connection after the preface.
pub fn h2_front(data: &[u8]) {
    ignore_sigpipe();
    let [selector, seed, frames @ ..] = data else {
        return;
    };
    let (selector, seed) = (*selector, *seed);
    let mut stream = PREFACE.to_vec();
    stream.extend_from_slice(frames);
    // In a task of its own: the future `block_on` drives directly is polled again as soon as
    // it is woken, before any task, so its yields would starve the streams.
    RUNTIME.with_borrow_mut(|runtime| {
        runtime.block_on(async move { monoio::spawn(run(selector, seed, stream)).await })
    });
}

async fn run(selector: u8, seed: u8, stream: Vec<u8>) {
    let pod = pod_address();
    let (control, _from_shards) = ControlLink::channel();
    let stats: AllShardStats = vec![CachePadded::new(ShardStats::new(0))].into();
    let (grants, _grants) = flume::unbounded();
    let shard = Rc::new(Shard::new(
        0,
        Arc::new(ShardSettings::default()),
        stats,
        vec![grants],
        control,
    ));

    // Bits 0-1: no revision, one whose pod takes any number of requests, one whose pod takes
    // one at a time (the rest queue), one with no pods (every request queues).
    let key = RevisionKey::new("default", "hello").expect("a valid key");
    let queue = Arc::new(ProcessQueue::new(ProcessQueue::UNLIMITED));
    let gate = Arc::new(RevisionGate::with_process_queue(1, queue.clone()));
    let capacity = if selector & 3 == 2 { 1 } else { UNLIMITED };
    let tracker = Arc::new(PodTracker::new(pod, capacity));
    if selector & 3 != 0 {
        let route = RevisionRoute {
            key: key.clone(),
            labels: RevisionLabels {
                namespace: "default".into(),
                revision: "hello".into(),
                ..RevisionLabels::default()
            },
            container_concurrency: if selector & 3 == 2 { 1 } else { 0 },
            protocol: Protocol::H2c,
            timeouts: Timeouts::default(),
            lb_policy: LbPolicy::FirstAvailable,
            priority: None,
            pods: if selector & 3 == 3 {
                Vec::new()
            } else {
                vec![tracker.clone()]
            },
            gate: gate.clone(),
            queue_depth: 4,
            upstream_tls: None,
            rules: None,
            cold_start: Default::default(),
        };
        shard.apply(ShardCommand::Routing(RoutingUpdate::Upsert {
            version: 1,
            route: Arc::new(route),
        }));
    }
    // Bits 2-4: after how many reads the shard starts draining (GOAWAY); 0 is never.
    let drain_after = usize::from((selector >> 2) & 7);

    let feed = Feed {
        data: stream,
        at: 0,
        reads: 0,
        ready: false,
        linger: LINGER_POLLS,
        seed: u32::from(seed) | 0x100,
        drain_after,
        shard: Rc::downgrade(&shard),
    };
    serve_h2(shard.clone(), feed).await;

    // Every stream ends once its client is gone, and gives back what it held.
    while Rc::strong_count(&shard) > 1 {
        yield_now().await;
    }
    assert_eq!(gate.waiting(), 0, "waiters left behind");
    assert_eq!(queue.queued(), 0, "queue places left behind");
    assert_eq!(tracker.in_flight(), 0, "pod slots left behind");
    // Dropping the shard drops its connections to the pod, which then close.
    drop(shard);
    while POD_TASKS.get() > 0 {
        yield_now().await;
    }
}

/// Yields to the other tasks once, behind every task already queued.
async fn yield_now() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        wake_later(cx);
        Poll::Pending
    })
    .await
}

/// Wakes the polling task once every task queued now has run. (A monoio task that wakes
/// itself while it is polled goes to the front of the queue, so `wake_by_ref` would run it
/// again before anything else.)
fn wake_later(cx: &Context<'_>) {
    let waker = cx.waker().clone();
    monoio::spawn(async move { waker.wake() });
}

/// The client's side of the connection: hands the server `data` in pieces of 1 to 64 bytes,
/// each after a yield; then, after some polls, the end of the stream. Writes vanish.
struct Feed {
    data: Vec<u8>,
    at: usize,
    reads: usize,
    /// The next read delivers (the one before it yielded).
    ready: bool,
    linger: u32,
    seed: u32,
    drain_after: usize,
    /// Weak: the connection's I/O must not keep the shard alive.
    shard: std::rc::Weak<Shard>,
}

impl AsyncRead for Feed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let feed = &mut *self;
        if !feed.ready {
            feed.ready = true;
            wake_later(cx);
            return Poll::Pending;
        }
        if feed.at == feed.data.len() {
            if feed.linger > 0 {
                feed.linger -= 1;
                wake_later(cx);
                return Poll::Pending;
            }
            return Poll::Ready(Ok(()));
        }
        feed.ready = false;
        feed.seed ^= feed.seed << 13;
        feed.seed ^= feed.seed >> 17;
        feed.seed ^= feed.seed << 5;
        let size = (1 + (feed.seed % 64) as usize)
            .min(feed.data.len() - feed.at)
            .min(buf.remaining());
        buf.put_slice(&feed.data[feed.at..feed.at + size]);
        feed.at += size;
        feed.reads += 1;
        if feed.reads == feed.drain_after {
            if let Some(shard) = feed.shard.upgrade() {
                shard.draining.set();
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Feed {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The pod's address; its listener starts on first use and serves for the thread's life.
fn pod_address() -> SocketAddr {
    if let Some(addr) = POD.get() {
        return addr;
    }
    let listener =
        monoio::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port for the pod");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    POD.set(Some(addr));
    monoio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let Ok(io) = stream.try_into_poll_io() else {
                continue;
            };
            counted(pod_connection(io));
        }
    });
    addr
}

/// Spawns `task`, counted in [`POD_TASKS`] while it runs.
fn counted(task: impl Future<Output = ()> + 'static) {
    POD_TASKS.set(POD_TASKS.get() + 1);
    monoio::spawn(async move {
        task.await;
        POD_TASKS.set(POD_TASKS.get() - 1);
    });
}

async fn pod_connection(io: monoio::net::tcp::stream_poll::TcpStreamPoll) {
    let Ok(mut connection) = h2::server::handshake(io).await else {
        return;
    };
    while let Some(Ok((request, respond))) = connection.accept().await {
        counted(pod_stream(request, respond));
    }
}

async fn pod_stream(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) {
    let behaviour = request
        .headers()
        .get("x-pod")
        .map(|value| value.as_bytes().to_vec())
        .unwrap_or_default();
    match behaviour.as_slice() {
        b"reset" => return respond.send_reset(Reason::INTERNAL_ERROR),
        b"refuse" => return respond.send_reset(Reason::REFUSED_STREAM),
        _ => {}
    }
    let mut head = http::Response::builder().status(200);
    if behaviour == b"other" {
        head = head
            .header("knative-serving-namespace", "default")
            .header("knative-serving-revision", "someone-else");
    }
    let head = head.body(()).expect("a valid response head");
    let only_head = behaviour == b"headers";
    let Ok(mut send) = respond.send_response(head, only_head) else {
        return;
    };
    if only_head {
        return;
    }
    let mut body = request.into_body();
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else {
            return send.send_reset(Reason::CANCEL);
        };
        let _ = body.flow_control().release_capacity(chunk.len());
        if send.send_data(chunk, false).is_err() {
            return;
        }
    }
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let _ = send.send_trailers(trailers);
}

/// A write to a socket whose peer has gone raises SIGPIPE, which kills the process unless it is
/// ignored. The kactivator binary ignores it as every Rust program does (the standard library's
/// start-up sets it to SIG_IGN before `main`), but libFuzzer's `main` is not Rust's.
#[allow(unsafe_code)]
fn ignore_sigpipe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler code; done once.
    ONCE.call_once(|| unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    });
}
