//! The queue-proxy's admin port (upstream's `:8022`, `http-queueadm`): `/wait-for-drain`, the
//! `preStop` hook Knative gives every user container (`reference/queue-proxy.md` §6).
//!
//! The kubelet runs the user container's `preStop` and sends the queue-proxy SIGTERM at the
//! same time; the user container gets its own SIGTERM only when `preStop` returns. So
//! `/wait-for-drain` starts the drain as upstream's does: health checks fail from that moment
//! (the activators stop choosing this pod), and it returns when this process has drained (its
//! quiet period is over and the listeners close): the app keeps running while requests still
//! reach it. Without a SIGTERM within [`NO_SIGTERM_AFTER`] it undoes that and returns, as
//! upstream's `Reset`: that is a liveness restart of the user container, not a pod deletion,
//! and must neither wait nor leave the pod failing its probes.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::drain::DrainPhase;

/// Path of the drain hook.
pub const WAIT_FOR_DRAIN: &str = "/wait-for-drain";

/// How long `/wait-for-drain` waits for the SIGTERM of a pod deletion (upstream: 1 s).
pub const NO_SIGTERM_AFTER: Duration = Duration::from_secs(1);

/// Serves the admin port until the runtime stops. `pre_stop` is the request path's flag that
/// fails health checks while a `/wait-for-drain` waits for the SIGTERM.
pub async fn serve(
    listener: TcpListener,
    drain: watch::Receiver<DrainPhase>,
    pre_stop: Arc<AtomicBool>,
) {
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
        let pre_stop = pre_stop.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (drain, pre_stop) = (drain.clone(), pre_stop.clone());
                async move { Ok::<_, Infallible>(handle(request.uri().path(), drain, &pre_stop).await) }
            });
            crate::admin::serve_connection(stream, service).await;
        });
    }
}

async fn handle(
    path: &str,
    mut drain: watch::Receiver<DrainPhase>,
    pre_stop: &AtomicBool,
) -> Response<Full<Bytes>> {
    if path != WAIT_FOR_DRAIN {
        return respond(StatusCode::NOT_FOUND, "404 page not found\n");
    }
    tracing::info!("{WAIT_FOR_DRAIN}: the user container is stopping; health checks fail");
    pre_stop.store(true, Ordering::Release);
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
    } else {
        tracing::info!(
            "{WAIT_FOR_DRAIN}: no SIGTERM within {NO_SIGTERM_AFTER:?}: the user container \
             restarts, the pod stays; health checks pass again"
        );
        pre_stop.store(false, Ordering::Release);
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
    async fn it_fails_health_checks_at_once_and_undoes_that_without_a_sigterm_within_a_second() {
        let (phase, receiver) = watch::channel(DrainPhase::Serving);
        let pre_stop = Arc::new(AtomicBool::new(false));
        let started = tokio::time::Instant::now();
        let waiting = tokio::spawn({
            let (receiver, pre_stop) = (receiver.clone(), pre_stop.clone());
            async move { handle(WAIT_FOR_DRAIN, receiver, &pre_stop).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            pre_stop.load(Ordering::Acquire),
            "health checks fail at once"
        );
        assert_eq!(waiting.await.unwrap().status(), StatusCode::OK);
        assert_eq!(started.elapsed(), NO_SIGTERM_AFTER);
        assert!(
            !pre_stop.load(Ordering::Acquire),
            "no SIGTERM: a restart of the user container, health checks pass again"
        );

        let waiting = tokio::spawn({
            let (receiver, pre_stop) = (receiver.clone(), pre_stop.clone());
            async move { handle(WAIT_FOR_DRAIN, receiver, &pre_stop).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        phase.send_replace(DrainPhase::Draining);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!waiting.is_finished(), "returned before the drain ended");
        assert!(pre_stop.load(Ordering::Acquire));
        phase.send_replace(DrainPhase::Drained);
        assert_eq!(waiting.await.unwrap().status(), StatusCode::OK);

        assert_eq!(
            handle("/other", receiver, &pre_stop).await.status(),
            StatusCode::NOT_FOUND
        );
    }
}
