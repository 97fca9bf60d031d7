//! The admin server on the control thread: `/metrics`, `/healthz`, `/readyz`, `/quitquitquit`, and
//! in the KEDA HTTP add-on role `/queue` (this replica's counts per route, the add-on's JSON).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kactivator_shards::metrics::AllShardStats;
use kactivator_shards::runtime::readiness::{Readiness, SHARD_DIED};
use kactivator_shards::shard::DEFAULT_HEAD_TIMEOUT;
use tokio::net::TcpListener;

/// What the admin endpoints read.
pub struct AdminState {
    pub stats: AllShardStats,
    pub pod_name: String,
    pub registry: prometheus::Registry,
    /// False until every shard is up, and again from SIGTERM on.
    pub ready: AtomicBool,
    /// The state worker, whose health `/healthz` reports.
    pub worker: Option<crate::worker::WorkerHandle>,
    /// The conditions of readiness besides start-up and draining (shared with the shards).
    pub readiness: Arc<Readiness>,
    /// Which metric names `/metrics` exports.
    pub metric_names: crate::config::MetricNames,
    /// Whose request metrics they are (the role).
    pub metrics_component: crate::config::MetricsComponent,
    /// The reporter's per-second concurrency of each revision, when a reporter runs.
    pub reported_concurrency: Option<crate::metrics::ReportedConcurrency>,
    /// `POST /quitquitquit` asks for what SIGTERM does: the drain, then the exit.
    pub quit: tokio::sync::Notify,
    /// KEDA's HTTP add-on role: `GET /queue` answers this replica's counts per route, as the
    /// add-on's interceptor does (the other replicas' scalers sum them).
    pub keda_queue: bool,
}

/// Serves one connection of an admin port (this one, and the queue-proxy's `:8022` and
/// `:9090`) with `service`: HTTP/1.1, each head due within [`DEFAULT_HEAD_TIMEOUT`] as on the
/// data ports (upstream's `ReadHeaderTimeout`), so a client that connects and says nothing does
/// not hold a connection for ever.
pub async fn serve_connection<S>(stream: tokio::net::TcpStream, service: S)
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<Full<Bytes>>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_connection_within(stream, service, DEFAULT_HEAD_TIMEOUT).await;
}

async fn serve_connection_within<S>(
    stream: tokio::net::TcpStream,
    service: S,
    head_timeout: Duration,
) where
    S: hyper::service::Service<Request<Incoming>, Response = Response<Full<Bytes>>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(head_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// Serves admin requests until the runtime stops.
pub async fn serve(listener: TcpListener, state: Arc<AdminState>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!("admin accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            // An IPv4 client of the dual-stack listener arrives as `::ffff:127.0.0.1`.
            let local = peer.ip().to_canonical().is_loopback();
            let service =
                hyper::service::service_fn(move |request| handle(request, state.clone(), local));
            serve_connection(stream, service).await;
        });
    }
}

/// `from_loopback`: the caller is on this host; only such callers may stop the process.
async fn handle(
    request: Request<Incoming>,
    state: Arc<AdminState>,
    from_loopback: bool,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let response = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => {
            // Off the control thread: with 10 000 revisions a render is ~9 MB and ~120 ms, and
            // the watch events, the state worker and the autoscaler link would wait behind it.
            let render_state = state.clone();
            let rendered = tokio::task::spawn_blocking(move || {
                crate::metrics::render(
                    &render_state.stats,
                    &render_state.pod_name,
                    &render_state.registry,
                    crate::metrics::RenderOptions {
                        names: render_state.metric_names,
                        component: render_state.metrics_component,
                        reported_concurrency: render_state.reported_concurrency.as_ref(),
                    },
                )
            })
            .await;
            match rendered {
                Ok(body) => text(StatusCode::OK, body).map(|mut response| {
                    response.headers_mut().insert(
                        "content-type",
                        hyper::header::HeaderValue::from_static(
                            "text/plain; version=0.0.4; charset=utf-8",
                        ),
                    );
                    response
                }),
                Err(error) => {
                    tracing::error!("rendering /metrics failed: {error}");
                    text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "rendering the metrics failed; see the log\n".into(),
                    )
                }
            }
        }
        (&Method::GET, "/queue") if state.keda_queue => {
            let counts = crate::keda::grpc::local_counts(&state.stats);
            text(StatusCode::OK, crate::keda::counts::queue_json(&counts)).map(|mut response| {
                response.headers_mut().insert(
                    "content-type",
                    hyper::header::HeaderValue::from_static("application/json"),
                );
                response
            })
        }
        // Liveness: the control thread answers, its state worker is healthy and every shard
        // thread lives (one that died took its listeners and connections with it: only a
        // restart brings it back). KEDA's HTTP add-on's chart probes it as `/livez`.
        (&Method::GET, path) if path == "/healthz" || (state.keda_queue && path == "/livez") => {
            if let Some(shard) = state.readiness.dead_shard() {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("shard {shard}: {}\n", SHARD_DIED),
                )
            } else {
                match state.worker.as_ref().map(|worker| worker.health()) {
                    Some(Err(why)) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
                    _ => text(StatusCode::OK, "ok\n".into()),
                }
            }
        }
        (&Method::GET, "/readyz") => {
            if state.readiness.draining() {
                text(StatusCode::SERVICE_UNAVAILABLE, "draining\n".into())
            } else if !state.ready.load(Ordering::Acquire) {
                text(StatusCode::SERVICE_UNAVAILABLE, "starting\n".into())
            } else if let Some(reason) = state.readiness.not_ready() {
                text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n"))
            } else {
                text(StatusCode::OK, "ready\n".into())
            }
        }
        (&Method::POST, "/quitquitquit") if !from_loopback => text(
            StatusCode::FORBIDDEN,
            "quitquitquit is only accepted from loopback\n".into(),
        ),
        (&Method::POST, "/quitquitquit") => {
            tracing::info!("exit requested through the admin port: draining as on SIGTERM");
            // The same drain as a signal's (a second request skips the rest of the grace
            // period, as a second signal does): nothing in flight is lost.
            state.quit.notify_one();
            text(
                StatusCode::OK,
                "draining: readiness fails now; the process exits once the grace period is over and in-flight requests are done\n".into(),
            )
        }
        (_, "/metrics" | "/healthz" | "/readyz" | "/quitquitquit") => text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".into(),
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz, /readyz\n".into(),
        ),
    };
    Ok(response.unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))))
}

fn text(status: StatusCode, body: String) -> Result<Response<Full<Bytes>>, hyper::http::Error> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::sync::Mutex;

    use crossbeam_utils::CachePadded;
    use kactivator_shards::metrics::ShardStats;
    use prometheus::core::{Collector, Desc};
    use prometheus::proto::MetricFamily;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A collector that holds its scrape until told to go on.
    struct Stalling {
        entered: Mutex<mpsc::Sender<()>>,
        release: Mutex<mpsc::Receiver<()>>,
    }

    impl Collector for Stalling {
        fn desc(&self) -> Vec<&Desc> {
            Vec::new()
        }

        fn collect(&self) -> Vec<MetricFamily> {
            let _ = self.entered.lock().unwrap().send(());
            let _ = self.release.lock().unwrap().recv();
            Vec::new()
        }
    }

    fn admin_state(registry: prometheus::Registry) -> Arc<AdminState> {
        Arc::new(AdminState {
            stats: Arc::from(vec![CachePadded::new(ShardStats::new(0))]),
            pod_name: "test".into(),
            registry,
            ready: true.into(),
            worker: None,
            readiness: Arc::new(Readiness::new(false, false)),
            metric_names: crate::config::MetricNames::default(),
            metrics_component: crate::config::MetricsComponent::default(),
            reported_concurrency: None,
            quit: tokio::sync::Notify::new(),
            keda_queue: false,
        })
    }

    /// Review finding: on the dual-stack listener (`[::]`, the default) an IPv4 loopback client
    /// arrives as `::ffff:127.0.0.1`, which is not a loopback address as written; the exit
    /// request is still one from this host.
    #[tokio::test(flavor = "current_thread")]
    async fn quitquitquit_from_either_loopback_through_the_dual_stack_listener_is_accepted() {
        let std_listener = kactivator_shards::runtime::reactor::bind_listener(
            kactivator_shards::runtime::reactor::any_address(0),
        )
        .unwrap();
        let port = std_listener.local_addr().unwrap().port();
        let listener = TcpListener::from_std(std_listener).unwrap();
        let state = admin_state(prometheus::Registry::new());
        tokio::spawn(serve(listener, state.clone()));
        for client in ["127.0.0.1", "::1"] {
            let ip: std::net::IpAddr = client.parse().unwrap();
            let mut stream = tokio::net::TcpStream::connect((ip, port)).await.unwrap();
            stream
                .write_all(b"POST /quitquitquit HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "{client}: {answer}");
            tokio::time::timeout(Duration::from_secs(1), state.quit.notified())
                .await
                .unwrap_or_else(|_| panic!("{client}: no exit asked"));
        }
    }

    /// Review finding: the queue-proxy's `:8022` had no head timeout, so a client that
    /// connected and said nothing held its connection for ever. Every admin port serves its
    /// connections through `serve_connection`, which closes one whose head does not come.
    #[tokio::test(flavor = "current_thread")]
    async fn an_admin_connection_that_sends_no_head_is_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(|_request: Request<Incoming>| async {
                Ok::<_, Infallible>(text(StatusCode::OK, "ok\n".into()).unwrap())
            });
            serve_connection_within(stream, service, Duration::from_millis(100)).await;
        });
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut rest = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "still open after 5 s");
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    /// A scrape renders on a blocking thread: the control thread (here the whole current-thread
    /// runtime) goes on answering while one is under way, however long it takes.
    #[tokio::test(flavor = "current_thread")]
    async fn the_control_thread_answers_while_a_scrape_renders() {
        let (entered_tx, entered) = mpsc::channel();
        let (release, release_rx) = mpsc::channel();
        let registry = prometheus::Registry::new();
        registry
            .register(Box::new(Stalling {
                entered: Mutex::new(entered_tx),
                release: Mutex::new(release_rx),
            }))
            .unwrap();
        let state = admin_state(registry);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, state));
        // Were the render on the runtime's thread, nothing could answer until it ended: a
        // watchdog ends it after 10 s so that such a regression fails the check below instead
        // of hanging the test.
        let watchdog = release.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(10));
            let _ = watchdog.send(());
        });
        let scrape = tokio::spawn(get(addr, "/metrics"));
        // Wait (off the runtime) until the render is inside the stalling collector.
        tokio::task::spawn_blocking(move || entered.recv().unwrap())
            .await
            .unwrap();
        let health = get(addr, "/healthz").await;
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
        assert!(
            !scrape.is_finished(),
            "/healthz was answered only once the scrape had finished"
        );
        release.send(()).unwrap();
        let scraped = scrape.await.unwrap();
        assert!(scraped.starts_with("HTTP/1.1 200"), "{scraped}");
    }
}
