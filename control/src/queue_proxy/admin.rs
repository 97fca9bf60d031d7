//! The queue-proxy's admin port (upstream's `:8022`, `http-queueadm`): `/wait-for-drain`, the
//! `preStop` hook Knative gives every user container (`reference/queue-proxy.md` §6).
//!
//! The kubelet runs the user container's `preStop` and sends the queue-proxy SIGTERM at the
//! same time; the user container gets its own SIGTERM only when `preStop` returns. So
//! `/wait-for-drain` returns when this process has drained (its grace period is over and the
//! listeners close): the app keeps running while requests still reach it. Without a SIGTERM
//! within [`NO_SIGTERM_AFTER`] it returns at once, as upstream's does: that is a liveness
//! restart of the user container, not a pod deletion, and must not wait.
//!
//! Difference from upstream: upstream's `/wait-for-drain` itself starts the drain (probes fail)
//! and undoes it after a second without SIGTERM; here only the signal starts it, so a user
//! container's liveness restart never fails the pod's probes.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::DrainPhase;

/// Path of the drain hook.
pub const WAIT_FOR_DRAIN: &str = "/wait-for-drain";

/// How long `/wait-for-drain` waits for the SIGTERM of a pod deletion (upstream: 1 s).
pub const NO_SIGTERM_AFTER: Duration = Duration::from_secs(1);

/// Serves the admin port until the runtime stops.
pub async fn serve(listener: TcpListener, drain: watch::Receiver<DrainPhase>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!("queue-proxy admin accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let drain = drain.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let drain = drain.clone();
                async move { Ok::<_, Infallible>(handle(request.uri().path(), drain).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(path: &str, mut drain: watch::Receiver<DrainPhase>) -> Response<Full<Bytes>> {
    if path != WAIT_FOR_DRAIN {
        return respond(StatusCode::NOT_FOUND, "404 page not found\n");
    }
    tracing::info!("{WAIT_FOR_DRAIN}: the user container is stopping");
    let signalled = tokio::time::timeout(NO_SIGTERM_AFTER, async {
        drain
            .wait_for(|phase| *phase != DrainPhase::Serving)
            .await
            .is_ok()
    })
    .await;
    if signalled.is_ok() {
        // An error means the control plane is gone: nothing is left to wait for.
        let _ = drain.wait_for(|phase| *phase == DrainPhase::Drained).await;
    }
    respond(StatusCode::OK, "")
}

fn respond(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn without_a_sigterm_it_returns_after_a_second_and_with_one_when_drained() {
        let (phase, receiver) = watch::channel(DrainPhase::Serving);
        let started = tokio::time::Instant::now();
        let answer = handle(WAIT_FOR_DRAIN, receiver.clone()).await;
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(started.elapsed(), NO_SIGTERM_AFTER);

        phase.send_replace(DrainPhase::Draining);
        let waiting = tokio::spawn(handle(WAIT_FOR_DRAIN, receiver.clone()));
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!waiting.is_finished(), "returned before the drain ended");
        phase.send_replace(DrainPhase::Drained);
        assert_eq!(waiting.await.unwrap().status(), StatusCode::OK);

        assert_eq!(
            handle("/other", receiver).await.status(),
            StatusCode::NOT_FOUND
        );
    }
}
