//! The admin server on the control thread: `/metrics`, `/healthz`, `/readyz`, `/quitquitquit`.

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
use kactivator_shards::runtime::readiness::Readiness;
use tokio::net::TcpListener;

/// What the admin endpoints read.
pub struct AdminState {
    pub stats: AllShardStats,
    pub pod_name: String,
    pub registry: prometheus::Registry,
    /// False until every shard is up, and again from SIGTERM on.
    pub ready: AtomicBool,
    /// Set on SIGTERM.
    pub draining: AtomicBool,
    /// The state worker, whose health `/healthz` reports.
    pub worker: Option<crate::worker::WorkerHandle>,
    /// The conditions of readiness besides start-up and draining (shared with the shards).
    pub readiness: Arc<Readiness>,
    /// Which metric names `/metrics` exports.
    pub metric_names: crate::config::MetricNames,
    /// The reporter's per-second concurrency of each revision, when a reporter runs.
    pub reported_concurrency: Option<crate::metrics::ReportedConcurrency>,
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
            let local = peer.ip().is_loopback();
            let service =
                hyper::service::service_fn(move |request| handle(request, state.clone(), local));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
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
            let body = crate::metrics::render(
                &state.stats,
                &state.pod_name,
                &state.registry,
                crate::metrics::RenderOptions {
                    names: state.metric_names,
                    reported_concurrency: state.reported_concurrency.as_ref(),
                },
            );
            text(StatusCode::OK, body).map(|mut response| {
                response.headers_mut().insert(
                    "content-type",
                    hyper::header::HeaderValue::from_static(
                        "text/plain; version=0.0.4; charset=utf-8",
                    ),
                );
                response
            })
        }
        // Liveness: the control thread answers and its state worker is healthy.
        (&Method::GET, "/healthz") => match state.worker.as_ref().map(|worker| worker.health()) {
            Some(Err(why)) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            _ => text(StatusCode::OK, "ok\n".into()),
        },
        (&Method::GET, "/readyz") => {
            if state.draining.load(Ordering::Acquire) {
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
            tracing::info!("exit requested through the admin port");
            // Let the response go out first.
            tokio::spawn(async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                std::process::exit(0);
            });
            text(StatusCode::OK, "bye\n".into())
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
