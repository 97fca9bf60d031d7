//! The queue-proxy's autoscaler metrics port (upstream's `:9090`, `http-autometric`): every
//! [`REPORTING_PERIOD`] the pod's load is read from the shards' counters and made into the
//! next [`Stat`] ([`super::stats`] has the rules); `/metrics` serves the last one.
//!
//! As upstream's (`pkg/queue/protobuf_stats_reporter.go`, `stats_handler.go`, `servers.go`):
//! the body is the protobuf `Stat` with `Content-Type: application/protobuf` whatever the
//! request's `Accept` says and whatever its method; any other path is a 404. The port serves
//! until the process exits, drain included: an autoscaler that found it closed early would
//! take the pod for one behind a mesh.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use kactivator_api::autoscaler::{encode_stat, PROTOBUF_CONTENT_TYPE};
use kactivator_shards::metrics::{micros_since_start, AllShardStats, LoadSnapshot};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::stats::{self, PodTotals, RequestStats, REPORTING_PERIOD};
use crate::autoscaler::stats::Totals;

/// The only path served.
pub const PATH: &str = "/metrics";

/// Makes the stat every period and serves it on `listener`, until the runtime stops.
pub fn spawn(listener: TcpListener, shards: AllShardStats, pod_name: String) {
    let now_us = micros_since_start(Instant::now());
    let windows = RequestStats::new(now_us, pod_totals(&shards, now_us));
    let first = encode_stat(&stats::stat(&pod_name, 0.0, None, REPORTING_PERIOD));
    let (board, body) = watch::channel(Bytes::from(first));
    tokio::spawn(report(windows, shards, pod_name, board));
    tokio::spawn(serve(listener, body));
}

/// The pod's load now: every revision block of every shard (a queue-proxy has one revision).
pub fn pod_totals(shards: &AllShardStats, now_us: u64) -> PodTotals {
    let mut sum = PodTotals::default();
    for shard in shards.iter() {
        for block in shard.revisions() {
            sum.all += totals(block.load.read(now_us));
            sum.proxied += totals(block.proxied.read(now_us));
        }
    }
    sum
}

fn totals(snapshot: LoadSnapshot) -> Totals {
    Totals {
        arrivals: snapshot.arrivals,
        in_flight: snapshot.in_flight,
        integral: snapshot.integral,
    }
}

/// Closes a window every period, as upstream's ticker: not at the scrapes, which read the last
/// window however often they come.
async fn report(
    mut windows: RequestStats,
    shards: AllShardStats,
    pod_name: String,
    board: watch::Sender<Bytes>,
) {
    let mut ticker = tokio::time::interval(REPORTING_PERIOD);
    // A late tick (a busy control thread) measures the time it really covered; catching up
    // with a burst of empty windows would only hide the load from the next scrape.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await; // the first tick is now: the first window has not begun to fill
    loop {
        ticker.tick().await;
        let now_us = micros_since_start(Instant::now());
        let window = windows.report(now_us, pod_totals(&shards, now_us));
        let stat = stats::stat(
            &pod_name,
            windows.uptime_seconds(now_us),
            Some(window),
            REPORTING_PERIOD,
        );
        board.send_replace(Bytes::from(encode_stat(&stat)));
    }
}

async fn serve(listener: TcpListener, body: watch::Receiver<Bytes>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!("autoscaler metrics accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let body = body.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let answer = answer(request.uri().path(), &body.borrow());
                async move { Ok::<_, Infallible>(answer) }
            });
            crate::admin::serve_connection(stream, service).await;
        });
    }
}

/// The answer to a request for `path`, `stat` being the last stat's bytes.
fn answer(path: &str, stat: &Bytes) -> Response<Full<Bytes>> {
    if path != PATH {
        let mut response = Response::new(Full::new(Bytes::from_static(b"404 page not found\n")));
        *response.status_mut() = StatusCode::NOT_FOUND;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        return response;
    }
    let mut response = Response::new(Full::new(stat.clone()));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(PROTOBUF_CONTENT_TYPE),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_utils::CachePadded;
    use kactivator_shards::metrics::{RevisionLabels, ShardStats};
    use std::sync::Arc;

    #[test]
    fn only_metrics_is_served_and_as_protobuf() {
        let stat = Bytes::from_static(b"\x0a\x01p");
        let served = answer(PATH, &stat);
        assert_eq!(served.status(), StatusCode::OK);
        assert_eq!(served.headers()["content-type"], "application/protobuf");
        let other = answer("/metrics/", &stat);
        assert_eq!(other.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn the_pods_load_sums_every_shard_and_keeps_the_proxied_part_apart() {
        let shards: AllShardStats = Arc::from(vec![
            CachePadded::new(ShardStats::new(0)),
            CachePadded::new(ShardStats::new(1)),
        ]);
        let first = shards[0].register_revision(RevisionLabels::default(), false);
        let second = shards[1].register_revision(RevisionLabels::default(), false);
        first.load.arrive(0);
        second.load.arrive(0);
        second.proxied.arrive(0);
        let totals = pod_totals(&shards, 1_000);
        assert_eq!(
            (totals.all.arrivals, totals.all.integral),
            (2, 2_000),
            "both shards"
        );
        assert_eq!(
            (totals.proxied.arrivals, totals.proxied.integral),
            (1, 1_000)
        );
    }
}
