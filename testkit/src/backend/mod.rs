//! Test backends: real HTTP/1.1 servers that mimic a Knative queue-proxy in front of a
//! user container, with routes for streaming, delays, trailers, upgrades and half-close.
//!
//! Each backend built by [`spawn`] runs on its own OS thread with a current-thread tokio
//! runtime, so it never competes with the code under test for a runtime, and it exposes
//! its counters ([`Stats`]) as shared atomics.
//!
//! Routes (every response carries `X-Backend: <name>`, plus `X-Knative-Revision-Name` and
//! `X-Knative-Revision-Namespace` when configured; [`BackendHandle::set_revision`] changes
//! them at run time):
//!
//! | route | response |
//! |---|---|
//! | any, with `K-Network-Probe: queue` | the queue-proxy's probe answer: `queue`, or 503 after [`BackendHandle::set_probe_healthy`]`(false)`; counted in [`Stats::probes`], not in `requests` |
//! | `/` | `hello from <name>\n` |
//! | `/healthz` | `ok` |
//! | `/echo` | the request body, streamed back; Content-Type and Content-Length copied |
//! | `/headers` | JSON describing method, uri, version, headers and `body_bytes` |
//! | `/bytes/<n>` | `n` pattern bytes with a Content-Length |
//! | `/chunked/<n>` | `n` pattern bytes, chunked |
//! | `/sink` | JSON `{"bytes": n, "checksum": c}` of the request body |
//! | `/delay/<ms>` | `slept <ms>\n` after sleeping |
//! | `/status/<code>` | that status with `status <code>\n` (no body for 204 and 304) |
//! | `/trailers` | chunked `hello\n` with trailers `x-checksum: abc`, `x-final: yes` |
//! | `/respond-header/<name>/<value>` | `with a header of my own\n`, with `<name>: <value>` set by the app (identity headers, when configured, are stamped over it) |
//! | `/slow-body/<n>/<ms>` | `n` KiB of pattern bytes, one KiB every `ms` |
//! | `/close` | `bye\n` with `Connection: close` |
//! | `/ws` | websocket echo |
//! | `/ws-half-close` | raw echo after `Upgrade: echo`, reporting the client's half-close |
//! | anything else | 404 `no route\n` |
//!
//! Routes that do not use the request body read and discard it before responding, so
//! that the connection stays reusable.

mod bodies;
pub(crate) mod routes;
pub(crate) mod stats;
mod upgrades;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

pub use crate::pattern::{pattern_byte, pattern_checksum};
pub use stats::Stats;
pub use upgrades::EOF_MARKER;

use routes::Identity;
use stats::{ConnectionGuard, Counters};

/// Pending-connection queue length; the standard library's 128 overflows under the
/// connection storms of benchmarks.
const LISTEN_BACKLOG: u32 = 1024;

/// Pause after a failed accept (typically out of file descriptors), so the accept loop
/// does not spin while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);

/// Who a backend claims to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendConfig {
    /// Sent as `X-Backend` and in the `/` greeting.
    pub name: String,
    /// Sent as `X-Knative-Revision-Name` when set.
    pub revision_name: Option<String>,
    /// Sent as `X-Knative-Revision-Namespace` when set.
    pub revision_namespace: Option<String>,
    /// A request whose client half-closes its connection is still worked on to its end and
    /// answered, as by an app that never looks at its client (a model server that cannot stop
    /// mid-inference). Off, the backend is hyper's default, which, like Go's `net/http` and
    /// uvicorn, notices the client left and drops the request's work at once.
    pub keeps_working: bool,
    /// The `SETTINGS_MAX_CONCURRENT_STREAMS` an HTTP/2 server advertises (the gRPC backend);
    /// `None`: hyper's default (200).
    pub max_concurrent_streams: Option<u32>,
    /// The gRPC backend speaks only HTTP/2 (h2c with prior knowledge): an HTTP/1.1 request
    /// ends its connection unanswered, as a Go server behind `h2c.NewHandler` without an
    /// HTTP/1 handler, or a gRPC server, would. Off: HTTP/1.1 and h2c on one port.
    pub http2_only: bool,
}

impl BackendConfig {
    /// A backend called `name`, without revision headers.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            revision_name: None,
            revision_namespace: None,
            keeps_working: false,
            max_concurrent_streams: None,
            http2_only: false,
        }
    }

    /// A gRPC backend that speaks only HTTP/2 (see `http2_only`).
    pub fn http2_only(mut self) -> Self {
        self.http2_only = true;
        self
    }

    /// An HTTP/2 server that allows `streams` streams per connection (the gRPC backend).
    pub fn with_max_concurrent_streams(mut self, streams: u32) -> Self {
        self.max_concurrent_streams = Some(streams);
        self
    }

    /// A backend that finishes every request whose client left (see `keeps_working`).
    pub fn keeps_working(mut self) -> Self {
        self.keeps_working = true;
        self
    }

    /// Adds the revision headers a queue-proxy would send.
    pub fn with_revision(
        mut self,
        revision_name: impl Into<String>,
        revision_namespace: impl Into<String>,
    ) -> Self {
        self.revision_name = Some(revision_name.into());
        self.revision_namespace = Some(revision_namespace.into());
        self
    }
}

impl Default for BackendConfig {
    fn default() -> Self {
        Self::named("backend")
    }
}

/// State shared by all connections of one backend, and with its handle.
#[derive(Debug)]
pub(crate) struct Shared {
    identity: Identity,
    counters: Arc<Counters>,
    /// Whether queue-proxy probes get 200 `queue` (else 503).
    probe_healthy: AtomicBool,
    /// Milliseconds a queue-proxy probe waits before its answer.
    probe_delay_ms: AtomicU64,
    keeps_working: bool,
}

impl Shared {
    fn new(config: &BackendConfig) -> io::Result<Self> {
        Ok(Self {
            identity: Identity::new(
                &config.name,
                config.revision_name.as_deref(),
                config.revision_namespace.as_deref(),
            )?,
            counters: Arc::default(),
            probe_healthy: AtomicBool::new(true),
            probe_delay_ms: AtomicU64::new(0),
            keeps_working: config.keeps_working,
        })
    }
}

/// State of one accepted connection; alive as long as the connection (or the stream it
/// was upgraded to) is.
#[derive(Debug)]
pub(crate) struct ConnectionContext {
    shared: Arc<Shared>,
    _open: ConnectionGuard,
}

/// Starts a backend on 127.0.0.1 with an ephemeral port; see [`BackendHandle::addr`].
pub fn spawn(config: BackendConfig) -> io::Result<BackendHandle> {
    spawn_on(SocketAddr::from(([127, 0, 0, 1], 0)), config)
}

/// Starts a backend on `addr` on its own thread. Binding happens before this returns, so
/// the backend accepts connections as soon as the handle exists.
pub fn spawn_on(addr: SocketAddr, config: BackendConfig) -> io::Result<BackendHandle> {
    let shared = Arc::new(Shared::new(&config)?);
    let serving = Arc::clone(&shared);
    let (addr, server) = ServerThread::spawn(addr, format!("backend-{}", config.name), {
        move |listener, stop| serve(listener, serving, stop)
    })?;
    Ok(BackendHandle {
        addr,
        shared,
        server,
    })
}

/// Starts one backend per `(ip, config)`, all on the same port: several pods of a revision on
/// distinct loopback addresses (`127.0.0.2`, `127.0.0.3`, …), as a cluster has them on one
/// container port. The port is chosen by binding the first address to port 0; if it is taken
/// on another address, everything is stopped and tried again with a fresh port.
///
/// # Errors
///
/// The first error that is not "address in use", or "address in use" after several tries.
pub fn spawn_on_shared_port(
    pods: impl IntoIterator<Item = (IpAddr, BackendConfig)>,
) -> io::Result<Vec<BackendHandle>> {
    const ATTEMPTS: usize = 8;
    let pods: Vec<(IpAddr, BackendConfig)> = pods.into_iter().collect();
    let mut last_error = None;
    for _ in 0..ATTEMPTS {
        match spawn_all_on_one_port(&pods) {
            Ok(handles) => return Ok(handles),
            Err(error) if error.kind() == io::ErrorKind::AddrInUse => last_error = Some(error),
            Err(error) => return Err(error),
        }
    }
    Err(last_error.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrInUse)))
}

fn spawn_all_on_one_port(pods: &[(IpAddr, BackendConfig)]) -> io::Result<Vec<BackendHandle>> {
    let mut handles: Vec<BackendHandle> = Vec::with_capacity(pods.len());
    for (ip, config) in pods {
        let port = handles.first().map_or(0, |first| first.addr().port());
        // On failure the handles spawned so far are dropped, which stops them.
        handles.push(spawn_on(SocketAddr::new(*ip, port), config.clone())?);
    }
    Ok(handles)
}

/// A running backend. Dropping it stops the backend, like [`BackendHandle::shutdown`].
#[derive(Debug)]
pub struct BackendHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: ServerThread,
}

impl BackendHandle {
    /// The address the backend listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr><path>`, for clients that want a URL.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// Queue-proxy probes answered so far (also in [`Stats::probes`]).
    pub fn probes(&self) -> u64 {
        self.stats().probes
    }

    /// Makes queue-proxy probes answer 200 `queue` (`true`, the initial state) or 503
    /// (`false`), as a queue-proxy does when its readiness probe passes or fails. Normal
    /// requests are served either way, as a real pod would until it is taken out of rotation.
    pub fn set_probe_healthy(&self, healthy: bool) {
        self.shared.probe_healthy.store(healthy, Ordering::SeqCst);
    }

    /// Makes every queue-proxy probe wait `delay` before its answer (initially none): a pod
    /// whose probes are slow, or, with [`BackendHandle::set_probe_healthy`]`(false)`, fail only
    /// after a while.
    pub fn set_probe_delay(&self, delay: Duration) {
        let milliseconds = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.shared
            .probe_delay_ms
            .store(milliseconds, Ordering::SeqCst);
    }

    /// Whether queue-proxy probes currently pass.
    pub fn probe_healthy(&self) -> bool {
        self.shared.probe_healthy.load(Ordering::SeqCst)
    }

    /// From now on, every response (probe answers included) carries
    /// `X-Knative-Revision-Namespace: <namespace>` and `X-Knative-Revision-Name: <name>`:
    /// how a test makes this pod's address belong to another revision. Fails, changing
    /// nothing, if either cannot be a header value.
    pub fn set_revision(&self, namespace: &str, name: &str) -> io::Result<()> {
        self.shared
            .identity
            .set_revision(Some(name), Some(namespace))
    }

    /// Sets or removes each revision header independently (`None` stops sending it), for
    /// tests of a half-present identity.
    pub fn set_revision_headers(
        &self,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> io::Result<()> {
        self.shared.identity.set_revision(name, namespace)
    }

    /// Stops sending the revision headers, like a queue-proxy older than the fork.
    pub fn clear_revision(&self) {
        // Removing headers involves no value to validate.
        let _ = self.shared.identity.set_revision(None, None);
    }

    /// Zeroes `requests` and `connections_accepted` and restarts `max_in_flight` from the
    /// current `in_flight`. The gauges `in_flight` and `connections_open` keep counting
    /// what is actually live.
    pub fn reset_stats(&self) {
        self.shared.counters.reset();
    }

    /// Stops accepting, closes every connection and joins the backend's thread.
    pub fn shutdown(mut self) {
        self.server.stop();
    }
}

/// A test server on its own thread with a current-thread runtime, for both backends. Dropping
/// it stops the server (every connection closes) and joins the thread.
#[derive(Debug)]
pub(crate) struct ServerThread {
    stop_sender: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// What ends a server: a stop request, or a signal.
pub(crate) type Stop = std::pin::Pin<Box<dyn Future<Output = ()>>>;

impl ServerThread {
    /// Binds `addr` (before returning, so the server accepts as soon as this returns) and runs
    /// `serve(listener, stop)` on a new thread named `name`. Returns the bound address.
    pub(crate) fn spawn<S, F>(
        addr: SocketAddr,
        name: String,
        serve: S,
    ) -> io::Result<(SocketAddr, ServerThread)>
    where
        S: FnOnce(TcpListener, Stop) -> F + Send + 'static,
        F: Future<Output = ()>,
    {
        let runtime = build_runtime()?;
        let listener = {
            // Binding registers the socket with this runtime's reactor, which needs its context.
            let _entered = runtime.enter();
            bind(addr)?
        };
        let local_addr = listener.local_addr()?;
        let (stop_sender, stop_receiver) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            // A dropped sender counts as a stop request too, hence the ignored result.
            let stop: Stop = Box::pin(async move {
                let _ = stop_receiver.await;
            });
            runtime.block_on(serve(listener, stop));
            // Dropping the runtime cancels every connection task, closing their sockets.
            drop(runtime);
        })?;
        Ok((
            local_addr,
            ServerThread {
                stop_sender: Some(stop_sender),
                thread: Some(thread),
            },
        ))
    }

    /// Stops the server and joins its thread (once).
    pub(crate) fn stop(&mut self) {
        if let Some(stop_sender) = self.stop_sender.take() {
            let _ = stop_sender.send(());
        }
        if let Some(thread) = self.thread.take() {
            // A panic on the server thread has already been reported by the panic hook;
            // re-raising it here could abort a test that is unwinding.
            let _ = thread.join();
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs a server on the current thread until the process receives SIGTERM or SIGINT, calling
/// `on_ready` with the bound address once it accepts and the signal handlers are installed (so a
/// signal sent after `on_ready` always ends in a clean exit, never the default signal action).
pub(crate) fn run_server_until_signal<S, F>(
    addr: SocketAddr,
    on_ready: impl FnOnce(SocketAddr),
    serve: S,
) -> io::Result<()>
where
    S: FnOnce(TcpListener, Stop) -> F,
    F: Future<Output = ()>,
{
    use tokio::signal::unix::{signal, SignalKind};

    let runtime = build_runtime()?;
    runtime.block_on(async move {
        let listener = bind(addr)?;
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        on_ready(listener.local_addr()?);
        let stop: Stop = Box::pin(async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        });
        serve(listener, stop).await;
        Ok(())
    })
}

/// Runs a backend on the current thread until the process receives SIGTERM or SIGINT,
/// then returns `Ok(())`.
pub fn run_forever(addr: SocketAddr, config: BackendConfig) -> io::Result<()> {
    run_until_signal(addr, config, |_| {})
}

/// Like [`run_forever`], and calls `on_ready` with the bound address once the backend
/// accepts connections and the signal handlers are installed (so a signal sent after
/// `on_ready` always ends in a clean exit, never the default signal action).
pub fn run_until_signal(
    addr: SocketAddr,
    config: BackendConfig,
    on_ready: impl FnOnce(SocketAddr),
) -> io::Result<()> {
    let shared = Arc::new(Shared::new(&config)?);
    run_server_until_signal(addr, on_ready, move |listener, stop| {
        serve(listener, shared, stop)
    })
}

pub(crate) fn build_runtime() -> io::Result<Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Binds a listener with address reuse (so a backend can be restarted on the port it
/// just left, as a restarted pod would be) and a deep accept queue.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Accepts connections until `stop` completes.
async fn serve(listener: TcpListener, shared: Arc<Shared>, stop: impl Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut stop => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _peer)) => serve_connection(stream, &shared),
            Err(error) => {
                tracing::warn!(%error, "test backend failed to accept a connection");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
}

fn serve_connection(stream: TcpStream, shared: &Arc<Shared>) {
    // Small responses should leave immediately, as they do from Go's queue-proxy, which
    // also disables Nagle's algorithm.
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "could not disable Nagle's algorithm");
    }
    let connection = Arc::new(ConnectionContext {
        shared: Arc::clone(shared),
        _open: shared.counters.connection_opened(),
    });
    // The service owns the context; hyper drops the service when the connection ends,
    // which releases `connections_open` unless an upgrade task still holds the context.
    let keeps_working = shared.keeps_working;
    let service = service_fn(move |request| {
        let connection = Arc::clone(&connection);
        async move { Ok::<_, Infallible>(routes::handle(request, connection).await) }
    });
    tokio::spawn(async move {
        let served = http1::Builder::new()
            .writev(true)
            .half_close(keeps_working)
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades()
            .await;
        if let Err(error) = served {
            tracing::debug!(%error, "test backend connection ended with an error");
        }
    });
}
